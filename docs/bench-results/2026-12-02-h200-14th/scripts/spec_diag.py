"""H200: is draft=mtp/model's B=16 loss in its plain steps or in the control? Each method
with the control forced plain, and adaptive, against draft=none (alternating)."""
import json, sys, time
import appliance  # noqa
from hydra import compose, initialize_config_dir
from appliance.config.hydra_setup import conf_dir, setup
from appliance.plan import resolve
from appliance.bench import spec
from appliance.bench.prompts import model_dir
from appliance.engine import runner
from appliance.engine.types import GenerationRequest, SamplingParams
from appliance.plan.draft import DraftPlan
from appliance.engine.speculate import control as C

setup()
plans = {}
with initialize_config_dir(str(conf_dir()), version_base="1.3"):
    for d in ("mtp", "model"):
        plans[d] = resolve(compose("config", overrides=[f"draft={d}"]))
p0 = plans["mtp"]
model, tok = runner.load(str(model_dir(p0)), p0.model.dtype)
B, ctx = int(sys.argv[1]), 512
sampling = SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in tok.eos_token_ids})
ps = spec.prompts(tok, sys.argv[2], B, ctx)
orig = C.Control.speculate
out = {}
def cell(name, plan, draft, forced):
    C.Control.speculate = (lambda self, rows: False) if forced else orig
    s = spec._scheduler(model, tok, plan, B, draft)
    spec._run_batch(s, [GenerationRequest(p[:64], 8, sampling) for p in ps])
    rs = [spec._run_batch(s, [GenerationRequest(p, 128, sampling) for p in ps]) for _ in range(2)]
    out.setdefault(name, []).append([(r["tok_s"], r["accepted"], r["rejected"]) for r in rs])
    print(name, out[name][-1], flush=True)
for rep in range(2):
    cell("none", p0, DraftPlan(kind="none"), False)
    for d, plan in plans.items():
        cell(d + "-plain", plan, plan.draft, True)
        cell(d + "-adaptive", plan, plan.draft, False)
json.dump(out, open(sys.argv[3], "w"))
