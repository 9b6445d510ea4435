import appliance, time, sys
import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import KVCache
model, tok = load("appliance/embedded/tiny")
model.set_dtype(mx.float32)
S2 = mx.new_stream(mx.cpu)
orig = mx.fast.scaled_dot_product_attention
def split(q,k,v,scale,mask=None,sinks=None):
    hk = k.shape[1]; h = q.shape[1]
    if hk < 2: return orig(q,k,v,scale=scale,mask=mask)
    a = orig(q[:, :h//2], k[:, :hk//2], v[:, :hk//2], scale=scale, mask=mask)
    with mx.stream(S2):
        b = orig(q[:, h//2:], k[:, hk//2:], v[:, hk//2:], scale=scale, mask=mask)
    return mx.concatenate([a, b], axis=1)
def run(B, T, L, n):
    caches = [KVCache() for _ in range(6)]
    for c in caches:
        c.update_and_fetch(mx.random.normal((B,2,T,64)), mx.random.normal((B,2,T,64)))
    mx.eval([c.keys for c in caches])
    x = mx.random.randint(0, 4096, (B, L))
    out=[]
    for mode in ("one","split","one","split"):
        mx.fast.scaled_dot_product_attention = split if mode=="split" else orig
        ts=[]
        for _ in range(n):
            t=time.perf_counter(); y = model(x, cache=caches); mx.eval(y); ts.append(time.perf_counter()-t)
            for c in caches: c.offset -= L
        out.append((mode, min(ts)*1000, sorted(ts)[len(ts)//2]*1000, y))
    print(B,T,L, " ".join("%s min %.1f med %.1f" % o[:3] for o in out), "exact", mx.array_equal(out[0][3], out[1][3]).item())
run(16, 2500, 1, 20); run(8, 2000, 1, 20); run(4, 2000, 1, 20); run(1, 2000, 512, 5); run(1, 1536, 128, 10)
