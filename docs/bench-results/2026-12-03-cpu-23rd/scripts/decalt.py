import appliance, time, sys, statistics
import mlx.core as mx
from appliance import oracle
from appliance.engine.kv import cores
from mlx_lm.models.cache import make_prompt_cache
model, tok = oracle.load("appliance/embedded/tiny", "float32")
B, T = int(sys.argv[2]), int(sys.argv[3])
cache = make_prompt_cache(model)
for c in cache:
    c.update_and_fetch(mx.random.normal((B, 2, T, 64)), mx.random.normal((B, 2, T, 64)))
mx.eval([c.state for c in cache])
y = mx.random.randint(0, 4000, (B, 1))
ts = {1: [], 2: []}
for i in range(int(sys.argv[1])):
    for n in (1, 2):
        cores.use(n)
        for c in cache: c.offset = T
        t = time.perf_counter(); mx.eval(model(y, cache=cache)); ts[n].append(time.perf_counter()-t)
r = [b / a for a, b in zip(ts[1], ts[2])]
print(f"B={B} T={T} one {1000*statistics.median(ts[1]):.1f} ms, split {1000*statistics.median(ts[2]):.1f} ms, paired {statistics.median(r):.3f}")
