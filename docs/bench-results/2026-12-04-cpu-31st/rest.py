"""Does an mtp engine at B rows rest (untapped plain steps) in a bench-like run? (CPU; from the
repo root: python docs/bench-results/2026-12-04-cpu-31st/rest.py <rows> <tokens> <runs>)"""
import sys
sys.path.insert(0, "tests")
import appliance  # noqa  (before mlx)
from conftest import resolve_overrides
from appliance.bench import spec
from appliance.bench.prompts import load_tokenizer, model_dir
from appliance.engine import runner
from appliance.engine.speculate import drafters
from appliance.engine.types import GenerationRequest, SamplingParams

rows, n, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
plan = resolve_overrides(["draft=mtp"])
path = model_dir(plan); tok = load_tokenizer(path)
model, _ = runner.load(str(path), plan.model.dtype, dequantize=plan.model.dequantized)
sampling = SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in tok.eos_token_ids})
ps = spec.prompts(tok, "free", rows, 512)
reqs = [GenerationRequest(p, n, sampling) for p in ps]
count = {"skip": 0, "step": 0}
real_skip, real_obs = drafters.MTPDrafter.skip, drafters.MTPDrafter.observe
def skip(self, uids):
    count["skip"] += 1; return real_skip(self, uids)
def observe(self, uids, fed, hidden, decoding=False, step=False):
    count["step"] += step; return real_obs(self, uids, fed, hidden, decoding, step)
drafters.MTPDrafter.skip, drafters.MTPDrafter.observe = skip, observe
s = spec._scheduler(model, tok, plan, rows, plan.draft)
for r in range(reps):
    out = spec._run_batch(s, reqs)
    print(r, round(out["tok_s"]), out.get("accepted"), dict(count), flush=True)
