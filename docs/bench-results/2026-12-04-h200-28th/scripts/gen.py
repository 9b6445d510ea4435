"""Greedy texts of the spec bench's rows (draft=none), and each position's lookup yield."""
import json, sys
sys.path.insert(0, "tests")
import appliance  # noqa
from conftest import resolve_overrides
from appliance.bench import spec
from appliance.bench.prompts import load_tokenizer, model_dir
from appliance.engine import runner
from appliance.engine.types import GenerationRequest, SamplingParams, Finished
from appliance.plan.draft import DraftPlan
from appliance.engine.speculate.lookup import LookupDrafter

work, rows, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dtype = sys.argv[4] if len(sys.argv) > 4 else None
ov = ["draft=lookup"] + ([f"model.dtype={dtype}"] if dtype else [])
plan = resolve_overrides(ov)
path = model_dir(plan)
tok = load_tokenizer(path)
model, _ = runner.load(str(path), plan.model.dtype, dequantize=plan.model.dequantized)
sampling = SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in tok.eos_token_ids})
ps = spec.prompts(tok, work, rows, 512)
sched = spec._scheduler(model, tok, plan, rows, DraftPlan(kind="none"))
outs = [[] for _ in ps]
class R(spec._Row):
    def deliver(self, e):
        if not isinstance(e, Finished):
            outs[self.id].append(e.id)
        super().deliver(e)
rs = [R(GenerationRequest(p, n, sampling), i) for i, p in enumerate(ps)]
for r in rs:
    sched.add(r)
while sched.has_work():
    sched.step()
k = plan.draft.k
ys = []
for p, o in zip(ps, outs):
    d = LookupDrafter(plan.draft.ngram_min, plan.draft.ngram_max)
    y = []
    for g in range(len(o)):  # g tokens emitted; o[g] is pending (sampled, not yet in KV)
        # KV holds prompt + o[:g-1]... the pending token is o[g-1] after g>=1 emitted
        if g == 0:
            y.append(1); continue
        toks = p + o[:g - 1]
        c = d._one(0, list(toks), k + 1)
        acc = 0
        if c and c[0] == o[g - 1]:
            for j, t in enumerate(c[1:]):
                if g + j < len(o) and o[g + j] == t:
                    acc += 1
                else:
                    break
        y.append(1 + acc)
    ys.append(y)
json.dump({"k": k, "outs": outs, "ys": ys}, open(f"/tmp/sim/{work}-{rows}-{n}-{plan.model.dtype}.json", "w"))
print(plan.model.dtype, [round(sum(y) / len(y), 2) for y in ys])
