"""What attending a shared prefix once for all rows (cascade attention) would save in a decode
step on this CPU: one layer's attention for B rows whose first S of L keys are the same
(the agents' shared system prompt), fused (MLX's `mx.fast.scaled_dot_product_attention` over
each row's whole KV; NOT the engine's CPU path, `kv/cores.py`, which is faster: see
cascade_vs_engine.py and docs/benchmarks.md, 30th session) against the prefix's scores as
one matmul per kv head over every row's queries, each row's own tail apart, merged by
log-sum-exp. The embedded model's attention shape (4 query heads, 2 kv heads, head dim 64),
float32. A probe, not the engine's code. usage: python cascade_probe.py"""
import time

# isort: off
import appliance  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
# isort: on

H, KVH, D, S, OWN = 4, 2, 64, 1536, 664
G = H // KVH


def case(B: int) -> None:
    k = mx.random.normal((B, KVH, S + OWN, D))
    v = mx.random.normal((B, KVH, S + OWN, D))
    k = mx.concatenate([mx.broadcast_to(k[:1, :, :S], (B, KVH, S, D)), k[:, :, S:]], axis=2)
    v = mx.concatenate([mx.broadcast_to(v[:1, :, :S], (B, KVH, S, D)), v[:, :, S:]], axis=2)
    q, scale = mx.random.normal((B, H, 1, D)), D ** -0.5
    ks, vs, ko, vo = k[0, :, :S], v[0, :, :S], k[:, :, S:], v[:, :, S:]
    mx.eval(k, v, q, ks, vs, ko, vo)

    def fused():
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)

    def cascade():
        qs = (q * scale).reshape(B, KVH, G, D).transpose(1, 0, 2, 3).reshape(KVH, B * G, D)
        s1 = qs @ ks.transpose(0, 2, 1)  # [KVH, B*G, S]: one matmul per kv head
        m1 = s1.max(-1, keepdims=True)
        p1 = mx.exp(s1 - m1)
        l1, o1 = p1.sum(-1, keepdims=True), p1 @ vs
        s2 = (q * scale).reshape(B, KVH, G, D) @ ko.transpose(0, 1, 3, 2)  # each row's tail
        m2 = s2.max(-1, keepdims=True)
        p2 = mx.exp(s2 - m2)
        l2, o2 = p2.sum(-1, keepdims=True), p2 @ vo

        def rows(x):
            return x.reshape(KVH, B, G, x.shape[-1]).transpose(1, 0, 2, 3)

        o1, m1, l1 = rows(o1), rows(m1), rows(l1)
        m = mx.maximum(m1, m2)
        a1, a2 = mx.exp(m1 - m), mx.exp(m2 - m)
        return ((o1 * a1 + o2 * a2) / (l1 * a1 + l2 * a2)).reshape(B, H, 1, D)

    diff = mx.abs(fused() - cascade()).max().item()
    times = {}
    for f in (fused, cascade, fused, cascade):
        for _ in range(5):
            mx.eval(f())
        t0 = time.perf_counter()
        for _ in range(100):
            mx.eval(f())
        times.setdefault(f.__name__, []).append((time.perf_counter() - t0) / 100 * 1e3)
    print(f"B={B} S={S} own={OWN}: fused {min(times['fused']):.2f} ms, cascade "
          f"{min(times['cascade']):.2f} ms a layer; max |diff| {diff:.1e}")


for b in (1, 4, 8, 16):
    case(b)
