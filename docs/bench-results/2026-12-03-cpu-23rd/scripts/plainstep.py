"""draft=none against draft=<d> whose control never speculates: what a drafter's engine
costs plain steps alone (B rows, alternating runs, one process and model). With `aa`
(24th session): a second draft=none engine too (A/A), each engine first in turn.
usage: python plainstep.py <draft> <rows> <tokens> <repeats> [aa]"""
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

d, rows, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
aa = sys.argv[5:] == ["aa"]
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
if aa:
    scheds["none2"] = spec._scheduler(model, tok, plan, rows, DraftPlan(kind="none"))
for s in scheds.values():
    spec._warm(s, warm)
scheds[d].control.speculate = lambda rows, settled=True: False  # plain steps only
runs = {k: [] for k in scheds}
names = list(scheds)
for r in range(reps):
    order = names[r % len(names):] + names[:r % len(names)] if aa else names
    for k in order:
        runs[k].append(spec._run_batch(scheds[k], reqs)["tok_s"])
print({k: [round(x) for x in v] for k, v in runs.items()})
for k in names[1:]:
    pairs = [b / a for a, b in zip(runs["none"], runs[k], strict=True)]
    print(f"{k} / none: paired median {statistics.median(pairs):.3f}, "
          f"medians {statistics.median(runs[k]) / statistics.median(runs['none']):.3f}, "
          f"best {max(runs[k]) / max(runs['none']):.3f}, "
          f"means {statistics.mean(runs[k]) / statistics.mean(runs['none']):.3f}")
