"""What the control's probes cost at B rows: draft=none, draft=<d> as shipped, draft=<d> whose
control never probes again once speculation lost (the bound on what spacing probes could
save), and draft=none again (A/A); each engine first in turn, one process and model.
usage: python probecost.py <draft> <rows> <tokens> <repeats> <workload>"""
import statistics
import sys

sys.path.insert(0, "tests")
import appliance  # noqa: F401,E402  (before mlx)
from conftest import resolve_overrides  # noqa: E402

from appliance.bench import spec  # noqa: E402
from appliance.bench.prompts import load_tokenizer, model_dir  # noqa: E402
from appliance.engine import runner  # noqa: E402
from appliance.engine.types import GenerationRequest, SamplingParams  # noqa: E402
from appliance.plan.draft import DraftPlan  # noqa: E402

d, rows, n, reps, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
    sys.argv[5]
plan = resolve_overrides([f"draft={d}"])
path = model_dir(plan)
tok = load_tokenizer(path)
model, _ = runner.load(str(path), plan.model.dtype, dequantize=plan.model.dequantized)
sampling = SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in tok.eos_token_ids})
ps = spec.prompts(tok, work, rows, 512)
reqs = [GenerationRequest(p, n, sampling) for p in ps]
warm = [GenerationRequest(p[:64], 8, sampling) for p in ps]
scheds = {"none": spec._scheduler(model, tok, plan, rows, DraftPlan(kind="none")),
          d: spec._scheduler(model, tok, plan, rows, plan.draft),
          d + "-noprobe": spec._scheduler(model, tok, plan, rows, plan.draft),
          "none2": spec._scheduler(model, tok, plan, rows, DraftPlan(kind="none"))}
for s in scheds.values():
    spec._warm(s, warm)
c = scheds[d + "-noprobe"].control
first = c._first_gap
c._first_gap = lambda b, winner: first(b, winner) if winner else 10 ** 9
runs = {k: [] for k in scheds}
acc = {k: [] for k in scheds}
names = list(scheds)
for r in range(reps):
    for k in names[r % len(names):] + names[:r % len(names)]:
        out = spec._run_batch(scheds[k], reqs)
        runs[k].append(out["tok_s"])
        acc[k].append(out["accepted"])
print({k: [round(x) for x in v] for k, v in runs.items()})
print({k: v for k, v in acc.items() if any(v)})
for k in names[1:]:
    pairs = [b / a for a, b in zip(runs["none"], runs[k], strict=True)]
    total = sum(1 / x for x in runs["none"]) / sum(1 / x for x in runs[k])
    print(f"{k} / none: paired median {statistics.median(pairs):.3f}, "
          f"medians {statistics.median(runs[k]) / statistics.median(runs['none']):.3f}, "
          f"best {max(runs[k]) / max(runs['none']):.3f}, total time {total:.3f}")
