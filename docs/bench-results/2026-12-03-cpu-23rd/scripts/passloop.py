import appliance, time, sys
import mlx.core as mx
from appliance import oracle
from appliance.engine.kv import cores
from mlx_lm.models.cache import make_prompt_cache
model, tok = oracle.load("appliance/embedded/tiny", "float32")
cores.use(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
cache = make_prompt_cache(model)
x = mx.random.randint(0, 4000, (1, 2048)); model(x, cache=cache); mx.eval([c.state for c in cache])
y = mx.random.randint(0, 4000, (1, 512))
ts=[]
for _ in range(int(sys.argv[1])):
    for c in cache: c.offset = 2048
    t = time.perf_counter(); mx.eval(model(y, cache=cache)); ts.append(time.perf_counter()-t)
print("pass ms min %.0f median %.0f" % (1000*min(ts), 1000*sorted(ts)[len(ts)//2]))
