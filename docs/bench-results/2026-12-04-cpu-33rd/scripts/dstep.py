import appliance  # noqa
import time, mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import BatchKVCache, KVCache
model, tok = load("appliance/embedded/tiny")
model.set_dtype(mx.float32)
def bench(B, ctx, batch=True):
    if batch:
        cache = [BatchKVCache([0]*B) for _ in model.layers]
    else:
        cache = [KVCache() for _ in model.layers]
    x = mx.random.randint(3, 4000, (B, ctx))
    model(x, cache=cache); mx.eval([c.state for c in cache])
    y = mx.random.randint(3, 4000, (B, 1))
    ts=[]
    for i in range(30):
        t=time.perf_counter(); l=model(y, cache=cache); mx.eval(l); ts.append(time.perf_counter()-t)
    ts.sort(); return ts[len(ts)//2]*1000
for B in (1,2,4,8):
    print(B, "batch %.2f ms" % bench(B, 2048), "plain %.2f ms" % bench(B, 2048, False))
print("ctx 256, B=8: %.2f" % bench(8, 256))
