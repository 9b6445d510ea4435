"""Decode step cost at B rows of CTX tokens: the engine's BatchStep against mlx-lm's
BatchGenerator, same model and prompts, in one process. Median ms per step over STEPS.
python devrun/decode_ab.py OUTJSON [B] [CTX] [SHAPE] [BITS]"""
import json
import random
import sys
import time

import appliance  # noqa: F401
import mlx.core as mx
from hydra import compose, initialize_config_dir
from mlx_lm.generate import BatchGenerator

from appliance.bench.prompts import model_dir
from appliance.config.hydra_setup import conf_dir, setup
from appliance.engine import runner
from appliance.engine.kv import Scheme
from appliance.engine.sampling import make_sampler
from appliance.engine.step import BatchStep
from appliance.engine.types import SamplingParams
from appliance.plan import resolve

out = sys.argv[1]
B = int(sys.argv[2]) if len(sys.argv) > 2 else 16
CTX = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
shape = sys.argv[4] if len(sys.argv) > 4 else "llama-3.2-1b"
bits = sys.argv[5] if len(sys.argv) > 5 else None
STEPS = 64
setup()
ov = ["model=synthetic", f"model.shape={shape}", "model.dtype=bfloat16"] \
    if shape != "embedded" else []
if bits:
    ov.append(f"model.bits={bits}")
with initialize_config_dir(str(conf_dir()), version_base="1.3"):
    plan = resolve(compose("config", overrides=ov))
model, _ = runner.load(str(model_dir(plan)), plan.model.dtype)
rng = random.Random(0)
V = model.args.vocab_size
prompts = [[rng.randrange(V // 10, V) for _ in range(CTX + r)] for r in range(B)]
res = {"B": B, "ctx": CTX, "shape": shape, "bits": bits}


def ours():
    step = BatchStep(model, set(), B, 2048, Scheme.from_plan(plan.kv))
    sampler = make_sampler(SamplingParams(temperature=0.0))
    for p in prompts:
        step.insert([p], 10_000, sampler, params=SamplingParams())
    while len(step._decode) < B:
        step.tick()
    for _ in range(8):
        step.tick()
    ts = []
    for _ in range(STEPS):
        t = time.perf_counter()
        step.tick()
        ts.append(time.perf_counter() - t)
    mx.synchronize()
    return ts


def theirs():
    gen = BatchGenerator(model, stop_tokens=[], completion_batch_size=B, prefill_batch_size=8,
                         prefill_step_size=2048)
    gen.insert(prompts, max_tokens=[10_000] * B)
    n = 0
    while n < B * 2:  # until every row has decoded a couple of tokens
        _, resp = gen.next()
        n += len(resp)
    for _ in range(8):
        gen.next()
    ts = []
    for _ in range(STEPS):
        t = time.perf_counter()
        gen.next()
        ts.append(time.perf_counter() - t)
    mx.synchronize()
    gen.close()
    return ts


for name, f in (("ours", ours), ("mlx_lm", theirs), ("ours", ours), ("mlx_lm", theirs)):
    ts = sorted(f())
    res.setdefault(name, []).append(round(1e3 * ts[len(ts) // 2], 3))
    print(name, res[name], flush=True)
    mx.clear_cache()
json.dump(res, open(out, "w"))
