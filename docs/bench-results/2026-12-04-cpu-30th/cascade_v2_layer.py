"""One layer's decode attention on this CPU, B rows of 1,536 shared + 664 own keys: the
engine's (`kv/cores.py` after `use(2)`: compiled exp, split by kv head over two streams)
against a cascade (the shared keys read once for every row's queries, each row's own tail
apart, merged by log-sum-exp; the exp compiled as the engine's), split the same way
(`split`) or on one stream with BLAS's own threads (`one`, as cascade-hack-v2.patch runs).
Run it with OPENBLAS_NUM_THREADS=2 (the engine's) and =1. usage: python cascade_v2_layer.py"""
import time

# isort: off
import appliance  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
# isort: on
from appliance.engine.kv import cores
from appliance.engine.kv.cores import _ZERO, _exp

cores.use(2)
H, KVH, D, S = 4, 2, 64, 1536
G = H // KVH


@mx.compile
def _merge(o1, m1, l1, o2, m2, l2):
    m = mx.maximum(m1, m2)
    a1, a2 = mx.exp(m1 - m), mx.exp(m2 - m)
    return (o1 * a1 + o2 * a2) / (l1 * a1 + l2 * a2)


def cascade(q, k, v, scale, pads):
    """q [B, Hq, 1, D], k/v [B, kvh, T, D]: each row's first S keys (from its left padding)
    are the same."""
    B, Hq, _, _ = q.shape
    kvh, T = k.shape[1], k.shape[2]
    g = Hq // kvh
    p0 = pads[0]
    ks, vs = k[0, :, p0:p0 + S], v[0, :, p0:p0 + S]
    o = min(p + S for p in pads)
    ko, vo = k[:, :, o:T], v[:, :, o:T]
    qs = mx.array(scale, q.dtype) * q.reshape(B, kvh, g, D)
    s1 = qs.swapaxes(0, 1).reshape(kvh, B * g, D) @ ks.swapaxes(-1, -2)
    m1 = mx.max(s1, axis=-1, keepdims=True)
    e1 = _exp(s1 - m1, _ZERO)
    l1, o1 = mx.sum(e1, axis=-1, keepdims=True), e1 @ vs
    s2 = qs @ ko.swapaxes(-1, -2)
    m2 = mx.max(s2, axis=-1, keepdims=True)
    e2 = _exp(s2 - m2, _ZERO)
    l2, o2 = mx.sum(e2, axis=-1, keepdims=True), e2 @ vo

    def rows(x):
        return x.reshape(kvh, B, g, x.shape[-1]).swapaxes(0, 1)

    return _merge(rows(o1), rows(m1), rows(l1), o2, m2, l2).reshape(B, Hq, 1, D)


def case(B: int, own: int = 664) -> None:
    T, pads = S + own, [0] * B
    k, v = mx.random.normal((B, KVH, T, D)), mx.random.normal((B, KVH, T, D))
    k = mx.concatenate([mx.broadcast_to(k[:1, :, :S], (B, KVH, S, D)), k[:, :, S:]], axis=2)
    v = mx.concatenate([mx.broadcast_to(v[:1, :, :S], (B, KVH, S, D)), v[:, :, S:]], axis=2)
    q, mask = mx.random.normal((B, H, 1, D)), mx.ones((B, 1, 1, T), dtype=mx.bool_)
    mx.eval(k, v, q, mask)

    def engine():
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)

    def split():
        parts = []
        for i, st in enumerate(cores._local.streams[:KVH]):
            with mx.stream(st if st is not None else mx.default_stream(mx.cpu)):
                parts.append(cascade(q[:, i * G:(i + 1) * G], k[:, i:i + 1], v[:, i:i + 1],
                                     0.125, pads))
        return mx.concatenate(parts, axis=1)

    def one():
        return cascade(q, k, v, 0.125, pads)

    ref = engine()
    diff = max(mx.abs(ref - f()).max().item() for f in (split, one))
    t = {}
    for f in (engine, split, one, engine, split, one):
        for _ in range(5):
            mx.eval(f())
        t0 = time.perf_counter()
        for _ in range(100):
            mx.eval(f())
        t.setdefault(f.__name__, []).append((time.perf_counter() - t0) * 10)
    print(f"B={B}", {n: round(min(x), 3) for n, x in t.items()},
          f"ms a layer; max |diff| {diff:.1e}")


for b in (4, 8, 16):
    case(b)
