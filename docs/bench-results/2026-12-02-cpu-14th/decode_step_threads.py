import random, sys, time, os
import appliance  # noqa
import mlx.core as mx
from appliance.engine import runner
from appliance.engine.kv import Scheme, cores
from appliance.engine.sampling import make_sampler
from appliance.engine.step import BatchStep
from appliance.engine.types import SamplingParams
from conftest_plan import plan
model, _ = runner.load(str(plan.model.path), "float32")
rng = random.Random(0); V = model.args.vocab_size
def run(B, ctx, spread, steps=30):
    prompts = [[rng.randrange(V // 10, V) for _ in range(ctx - rng.randrange(spread + 1))] for _ in range(B)]
    step = BatchStep(model, set(), B, 512, Scheme.from_plan(plan.kv))
    sampler = make_sampler(SamplingParams(temperature=0.0))
    for p in prompts: step.insert([p], 10_000, sampler, params=SamplingParams())
    while len(step._decode) < B: step.tick()
    for _ in range(4): step.tick()
    ts = []
    for _ in range(steps):
        t = time.perf_counter(); step.tick(); ts.append(time.perf_counter() - t)
    ts.sort(); return round(1e3 * ts[len(ts) // 2], 2)
for rep in range(2):
    for th in (1, 2):
        cores.use(th)
        print(th, [(B, run(B, 2300, 500)) for B in (4, 8)], flush=True)
