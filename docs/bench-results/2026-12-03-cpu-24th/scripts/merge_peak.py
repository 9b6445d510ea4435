# FullLayout.extend (one copy) against mlx-lm's BatchKVCache.extend: 6 layers, 8 rows of 2300
# tokens and a joining row of 2307; time and MLX peak memory above the inputs.
import time, appliance  # noqa
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache
from appliance.engine.kv.native import FullLayout
B, T, H, D = 8, 2300, 2, 64
def mk(b, t):
    c = FullLayout([0] * b)
    c.update_and_fetch(mx.random.normal((b, H, t, D)), mx.random.normal((b, H, t, D)))
    return c
for variant in ("mlx-lm", "appliance", "mlx-lm", "appliance"):
    ts = []
    for _ in range(10):
        a = [mk(B, T) for _ in range(6)]; b = [mk(1, T + 7) for _ in range(6)]
        mx.eval([c.state for c in a + b])
        base = mx.get_active_memory(); mx.reset_peak_memory()
        t = time.perf_counter()
        for x, y in zip(a, b):
            (BatchKVCache.extend if variant == "mlx-lm" else FullLayout.extend)(x, y)
        mx.eval([c.keys for c in a] + [c.values for c in a])
        ts.append(time.perf_counter() - t)
        peak = mx.get_peak_memory() - base
        del a, b
    print(variant, "ms median %.1f min %.1f" % (1000 * sorted(ts)[5], 1000 * min(ts)), "peak above the inputs %.0f MB" % (peak / 1e6))
