"""draft=none against draft=<d> whose control never speculates: what a drafter's engine
costs plain steps alone (B rows, alternating runs, one process and model).
usage: python plainstep.py <draft> <rows> <tokens> <repeats>"""
import statistics
import sys

sys.path.insert(0, "tests")
import appliance  # noqa: F401,E402  (before mlx)
from conftest import compose, resolve_overrides  # noqa: E402

from appliance.bench import spec  # noqa: E402
from appliance.bench.prompts import load_tokenizer, model_dir  # noqa: E402
from appliance.engine import runner  # noqa: E402
from appliance.engine.types import GenerationRequest, SamplingParams  # noqa: E402
from appliance.plan.draft import DraftPlan  # noqa: E402

d, rows, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
plan = resolve_overrides([f"draft={d}"])
path = model_dir(plan)
tok = load_tokenizer(path)
model, _ = runner.load(str(path), plan.model.dtype, dequantize=plan.model.dequantized)
sampling = SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in tok.eos_token_ids})
ps = spec.prompts(tok, "free", rows, 512)
reqs = [GenerationRequest(p, n, sampling) for p in ps]
warm = [GenerationRequest(p[:64], 8, sampling) for p in ps]
scheds = {"none": spec._scheduler(model, tok, plan, rows, DraftPlan(kind="none")),
          d: spec._scheduler(model, tok, plan, rows, plan.draft)}
for s in scheds.values():
    spec._warm(s, warm)
scheds[d].control.speculate = lambda rows, settled=True: False  # plain steps only
runs = {k: [] for k in scheds}
for _ in range(reps):
    for k, s in scheds.items():
        runs[k].append(spec._run_batch(s, reqs)["tok_s"])
pairs = [b / a for a, b in zip(runs["none"], runs[d])]
print({k: [round(x) for x in v] for k, v in runs.items()})
print(f"{d} plain-only / none: paired median {statistics.median(pairs):.3f}, "
      f"medians {statistics.median(runs[d]) / statistics.median(runs['none']):.3f}, "
      f"best {max(runs[d]) / max(runs['none']):.3f}")
