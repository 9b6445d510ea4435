"""Decode step cost by batch size and raggedness (engine's BatchStep alone), 1B shape.
python devrun/decode_b.py OUTJSON"""
import json
import random
import sys
import time

import appliance  # noqa: F401
import mlx.core as mx
from hydra import compose, initialize_config_dir

from appliance.bench.prompts import model_dir
from appliance.config.hydra_setup import conf_dir, setup
from appliance.engine import runner
from appliance.engine.kv import Scheme
from appliance.engine.sampling import make_sampler
from appliance.engine.step import BatchStep
from appliance.engine.types import SamplingParams
from appliance.plan import resolve

setup()
with initialize_config_dir(str(conf_dir()), version_base="1.3"):
    plan = resolve(compose("config", overrides=["model=synthetic", "model.shape=llama-3.2-1b",
                                                "model.dtype=bfloat16"]))
model, _ = runner.load(str(model_dir(plan)), plan.model.dtype)
rng = random.Random(0)
V = model.args.vocab_size
res = []


def run(B, ctx, spread, steps=48):
    prompts = [[rng.randrange(V // 10, V) for _ in range(ctx - rng.randrange(spread + 1))]
               for _ in range(B)]
    step = BatchStep(model, set(), B, 2048, Scheme.from_plan(plan.kv))
    sampler = make_sampler(SamplingParams(temperature=0.0))
    for p in prompts:
        step.insert([p], 10_000, sampler, params=SamplingParams())
    while len(step._decode) < B:
        step.tick()
    for _ in range(8):
        step.tick()
    ts = []
    for _ in range(steps):
        t = time.perf_counter()
        step.tick()
        ts.append(time.perf_counter() - t)
    mx.synchronize()
    ts.sort()
    return round(1e3 * ts[len(ts) // 2], 2)


import os
for rep in range(int(os.environ.get("REPS", 2))):
    for spread in (0, 1500) if "SPREAD" not in os.environ else (int(os.environ["SPREAD"]),):
        for B in [int(b) for b in os.environ.get("BS", "1,4,8,12,13,14,15,16").split(",")]:
            r = {"B": B, "ctx": 3072, "spread": spread, "ms": run(B, 3072, spread)}
            res.append(r)
            print(r, flush=True)
            mx.clear_cache()
json.dump(res, open(sys.argv[1], "w"))
