import appliance, time, sys
import mlx.core as mx
from appliance import oracle
from appliance.engine.kv import cores
from mlx_lm.models.cache import make_prompt_cache
model, tok = oracle.load("appliance/embedded/tiny", "float32")
cores.use(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
B, T = 8, 2200
cache = make_prompt_cache(model)
for c in cache:
    c.update_and_fetch(mx.random.normal((B, 2, T, 64)), mx.random.normal((B, 2, T, 64)))
mx.eval([c.state for c in cache])
y = mx.random.randint(0, 4000, (B, 1))
ts=[]
for _ in range(int(sys.argv[1])):
    for c in cache: c.offset = T
    t = time.perf_counter(); mx.eval(model(y, cache=cache)); ts.append(time.perf_counter()-t)
print("decode B=8 ms min %.1f median %.1f" % (1000*min(ts), 1000*sorted(ts)[len(ts)//2]))
