"""The cascade against the engine's own CPU attention (`kv/cores.py`: compiled exp, split by
kv head over two streams), one layer, B rows of 1,536 shared + 664 own keys. Runs in a
checkout with cascade-hack.patch applied (its `_split` takes the cascade when
`cores._local.cascade` is set). usage: python cascade_vs_engine.py"""
import time

# isort: off
import appliance  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
# isort: on
from appliance.engine.kv import cores

cores.use(2)
H, KVH, D, S = 4, 2, 64, 1536
def case(B: int, own: int = 664) -> None:
    T, pads = S + own, [0] * B
    k, v = mx.random.normal((B, KVH, T, D)), mx.random.normal((B, KVH, T, D))
    q, mask = mx.random.normal((B, H, 1, D)), mx.ones((B, 1, 1, T), dtype=mx.bool_)
    mx.eval(k, v, q, mask)

    def base():
        cores._local.cascade = None
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)

    def casc():
        cores._local.cascade = (S, pads)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
        cores._local.cascade = None
        return out

    t = {}
    for f in (base, casc, base, casc):
        for _ in range(5):
            mx.eval(f())
        t0 = time.perf_counter()
        for _ in range(100):
            mx.eval(f())
        t.setdefault(f.__name__, []).append((time.perf_counter() - t0) * 10)
    print(B, {n: round(min(x), 3) for n, x in t.items()}, "ms a layer")


for b in (4, 8, 16):
    case(b)
