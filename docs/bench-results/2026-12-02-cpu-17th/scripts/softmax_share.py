"""Issue 13 item 9 on CPU: what share of a prefill pass is attention's softmax.

The embedded model in float32; a 512-token pass over 2048 cached tokens, best of 3, with
mlx-lm's attention as is, then with the softmax left out (timing only: not a model)."""
import time

import appliance  # noqa: F401  (BLAS settings before mlx loads)
import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from appliance.plan.source import EMBEDDED_MODEL

model, tok = load(str(EMBEDDED_MODEL))
model.set_dtype(mx.float32)
x = mx.random.normal((8, 512, 1024))
mx.eval(x)
t = time.perf_counter()
for _ in range(5):
    mx.eval(mx.exp(x))
print(f"mx.exp over {x.size / 1e6:.1f}M floats: {(time.perf_counter() - t) / 5 * 1e3:.0f} ms")


def run(patch: bool) -> float:
    orig = mx.fast.scaled_dot_product_attention
    if patch:
        def sdpa(q, k, v, scale, mask=None, **kw):
            n_rep = q.shape[1] // k.shape[1]
            k, v = mx.repeat(k, n_rep, axis=1), mx.repeat(v, n_rep, axis=1)
            return ((q * scale) @ k.swapaxes(-1, -2) * 1e-3) @ v
        mx.fast.scaled_dot_product_attention = sdpa
    try:
        ts = []
        for _ in range(3):
            cache = make_prompt_cache(model)
            model(mx.array([[5 + i % 4000 for i in range(2048)]]), cache=cache)
            mx.eval([c.state for c in cache])
            y = mx.array([[7 + i % 4000 for i in range(512)]])
            t = time.perf_counter()
            mx.eval(model(y, cache=cache))
            ts.append(time.perf_counter() - t)
        return min(ts)
    finally:
        mx.fast.scaled_dot_product_attention = orig


a, b = run(False), run(True)
print(f"512-token prefill over 2048 cached: {a * 1e3:.0f} ms, without the softmax "
      f"{b * 1e3:.0f} ms: the softmax is {(a - b) / a:.0%}")
