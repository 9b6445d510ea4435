"""Peak transient memory and time of one layer's attention for a 2048-token chunk (1B shape:
32 q heads, 8 kv heads, dim 64, bf16): causal over sliced keys vs an array mask over a whole
buffer, fused sdpa vs quantized.DENSE."""
import time
import mlx.core as mx

L, H, KVH, D = 2048, 32, 8, 64
for ctx in (0, 8192):
    S = ctx + L
    q = mx.random.normal((1, H, L, D)).astype(mx.bfloat16)
    k = mx.random.normal((1, KVH, S + 256, D)).astype(mx.bfloat16)
    v = mx.random.normal((1, KVH, S + 256, D)).astype(mx.bfloat16)
    mx.eval(q, k, v)
    pos = mx.arange(S + 256)
    qpos = ctx + mx.arange(L)
    arr = (pos[None] <= qpos[:, None])[None, None]
    cases = {
        "causal, sliced keys": lambda: mx.fast.scaled_dot_product_attention(
            q, k[:, :, :S], v[:, :, :S], scale=0.125, mask="causal"),
        "array mask, sliced keys": lambda: mx.fast.scaled_dot_product_attention(
            q, k[:, :, :S], v[:, :, :S], scale=0.125, mask=arr[..., :S]),
        "array mask, whole buffer": lambda: mx.fast.scaled_dot_product_attention(
            q, k, v, scale=0.125, mask=arr),
    }
    for name, f in cases.items():
        mx.eval(f())
        mx.synchronize()
        mx.clear_cache()
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        t = time.perf_counter()
        for _ in range(5):
            mx.eval(f())
        mx.synchronize()
        dt = (time.perf_counter() - t) / 5
        print(f"ctx={ctx} {name}: transient {(mx.get_peak_memory() - before) / 2**20:.0f} MiB, "
              f"{dt * 1e3:.2f} ms", flush=True)
