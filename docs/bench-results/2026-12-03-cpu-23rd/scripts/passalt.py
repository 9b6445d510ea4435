import appliance, time, sys, statistics
import mlx.core as mx
from appliance import oracle
from appliance.engine.kv import cores
from mlx_lm.models.cache import make_prompt_cache
model, tok = oracle.load("appliance/embedded/tiny", "float32")
L = int(sys.argv[2]) if len(sys.argv) > 2 else 512
FORCE = len(sys.argv) > 3 and sys.argv[3] == 'force'  # split below MIN_PREFILL too
cache = make_prompt_cache(model)
x = mx.random.randint(0, 4000, (1, 2048)); model(x, cache=cache); mx.eval([c.state for c in cache])
y = mx.random.randint(0, 4000, (1, L))
ts = {1: [], 2: []}
for i in range(int(sys.argv[1])):
    for n in (1, 2):
        cores.use(n)
        if FORCE:
            cores.MIN_PREFILL = 2
        for c in cache: c.offset = 2048
        t = time.perf_counter(); mx.eval(model(y, cache=cache)); ts[n].append(time.perf_counter()-t)
r = [b / a for a, b in zip(ts[1], ts[2])]
print(f"L={L} one {1000*statistics.median(ts[1]):.0f} ms, split {1000*statistics.median(ts[2]):.0f} ms, paired split/one {statistics.median(r):.3f}")
