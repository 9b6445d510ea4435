"""Not yet run (written after the 18th session's device time was spent): does trimming a
leaving row's common left padding only in whole steps (`native.GRID_TRIM`, on by default on
CUDA) make the steps after a row leaves cheaper? 16 rows of the embedded model's held-out
code, staggered lengths (each row leaves at its own step), draft=none; GRID_TRIM off / on
alternating on one scheduler each; every decode step timed. argv: out.json [REPS]"""
import json
import sys
import time

import appliance  # noqa: F401
from hydra import compose, initialize_config_dir

from appliance.bench import spec
from appliance.bench.prompts import model_dir
from appliance.config.hydra_setup import conf_dir, setup
from appliance.engine import runner
from appliance.engine import step as S
from appliance.engine.kv import native
from appliance.engine.types import GenerationRequest, SamplingParams
from appliance.plan import resolve
from appliance.plan.draft import DraftPlan

setup()
with initialize_config_dir(str(conf_dir()), version_base="1.3"):
    plan = resolve(compose("config", overrides=[]))
model, tok = runner.load(str(model_dir(plan)), plan.model.dtype)
B, REPS = 16, int(sys.argv[2]) if len(sys.argv) > 2 else 4
sampling = SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in tok.eos_token_ids})
ps = spec.prompts(tok, "free", B, 512)
TR = []
orig = S.BatchStep._decode_step


def timed(self):
    t = time.perf_counter()
    ev = orig(self)
    TR.append((len(ev), round((time.perf_counter() - t) * 1e3, 2)))
    return ev


S.BatchStep._decode_step = timed
reqs = [GenerationRequest(p, 256 + 24 * i, sampling) for i, p in enumerate(ps)]
scheds = {on: spec._scheduler(model, tok, plan, B, DraftPlan(kind="none")) for on in (0, 1)}
for on, s in scheds.items():
    native.GRID_TRIM = bool(on)
    spec._warm(s, [GenerationRequest(p[:64], 8, sampling) for p in ps])
out = {0: [], 1: []}
for rep in range(REPS):
    for on, s in scheds.items():
        native.GRID_TRIM = bool(on)
        TR.clear()
        r = spec._run_batch(s, reqs)
        out[on].append({"tok_s": r["tok_s"], "steps": list(TR)})
        tail = [dt for n, dt in TR if n < B]
        print(rep, "grid" if on else "mlx-lm trim", r["tok_s"], "tail steps", len(tail),
              "sum ms", round(sum(tail)), flush=True)
json.dump(out, open(sys.argv[1], "w"))
