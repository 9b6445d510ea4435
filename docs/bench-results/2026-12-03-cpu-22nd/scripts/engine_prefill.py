import appliance, time, sys
import mlx.core as mx
from appliance import oracle
from appliance.engine.kv import cores
from appliance.engine.step import BatchStep
from appliance.plan.source import EMBEDDED_MODEL
from mlx_lm.sample_utils import make_sampler
model, tok = oracle.load(str(EMBEDDED_MODEL), "float32")
cores.use(int(sys.argv[1]))
print("compiled", cores._local.compiled)
samp = make_sampler(0.0)
def run(n_prompt, rows):
    b = BatchStep(model, set(tok.eos_token_ids), 16, 512)
    import random
    random.seed(0)
    for r in range(rows):
        b.insert([[random.randrange(4000) for _ in range(n_prompt)]], 64, samp)
    t = time.perf_counter(); ticks = 0; pre = 0.0
    while len(b._decode) < rows:
        t0 = time.perf_counter(); b.tick(); ticks += 1
    tp = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(30): b.tick()
    mx.eval([c.state for c in b._decode.layers])
    td = (time.perf_counter() - t) / 30
    return tp, ticks, td
for _ in range(2):
    tp, ticks, td = run(2200, 8)
    print(f"prefill 8x2200: {tp:.2f} s over {ticks} ticks; decode step B=8: {td*1e3:.1f} ms")
