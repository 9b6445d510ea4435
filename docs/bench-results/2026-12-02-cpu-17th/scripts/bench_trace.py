"""Per-step trace of B=16 free speculation on the H200: where the adaptive control's
speculative steps lose. argv: B workload out.json [methods]"""
import json, sys, time
import appliance  # noqa
import mlx.core as mx
from hydra import compose, initialize_config_dir
from appliance.config.hydra_setup import conf_dir, setup
from appliance.plan import resolve
from appliance.bench import spec
from appliance.bench.prompts import model_dir
from appliance.engine import runner, step as S
from appliance.engine.types import GenerationRequest, SamplingParams
from appliance.plan.draft import DraftPlan
from appliance.engine.speculate import control as C, drafters as D
from appliance.engine import verify as V

setup()
methods = sys.argv[4].split(",") if len(sys.argv) > 4 else ["mtp", "model"]
REPS = int(sys.argv[5]) if len(sys.argv) > 5 else 2
TOKENS = int(sys.argv[6]) if len(sys.argv) > 6 else 128
plans = {}
with initialize_config_dir(str(conf_dir()), version_base="1.3"):
    for d in methods:
        plans[d] = resolve(compose("config", overrides=[f"draft={d}"]))
p0 = plans[methods[0]]
model, tok = runner.load(str(model_dir(p0)), p0.model.dtype)
B, ctx = int(sys.argv[1]), 512
sampling = SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in tok.eos_token_ids})
ps = spec.prompts(tok, sys.argv[2], B, ctx)
TR = []
cur = {}
orig_ds = S.BatchStep._decode_step
def ds(self):
    cur.clear()
    t0 = time.perf_counter()
    ev = orig_ds(self)
    t1 = time.perf_counter()
    TR.append(dict(rows=cur.get("rows"), spec=cur.get("spec"), asked=self._asked,
                   quiet=self._quiet, dt=round((t1 - t0) * 1e3, 2),
                   widths=cur.get("widths"), prop=cur.get("prop"), ver=cur.get("ver"),
                   ntok=len([e for e in ev])))
    return ev
S.BatchStep._decode_step = ds
orig_spec = S.BatchStep._speculate
def sp(self):
    cur["rows"] = len(self._decode)
    r = orig_spec(self)
    cur["spec"] = r is not None
    return r
S.BatchStep._speculate = sp
def wrap(cls, name, key):
    f = getattr(cls, name)
    def g(self, *a, **k):
        t = time.perf_counter()
        r = f(self, *a, **k)
        cur[key] = round((time.perf_counter() - t) * 1e3, 2)
        return r
    setattr(cls, name, g)
wrap(D.MTPDrafter, "propose", "prop"); wrap(D.ModelDrafter, "propose", "prop")
wrap(V.Verifying, "verify", "ver")
orun = D.MTPDrafter._run
def run(self, batch, feeds):
    cur.setdefault("widths", []).append(max(len(t) for _, t, _ in feeds))
    return orun(self, batch, feeds)
D.MTPDrafter._run = run
ofeed = D._feed
def feed(model, layers, rows):
    cur.setdefault("widths", []).append(max(len(r) for r in rows))
    return ofeed(model, layers, rows)
D._feed = feed

# The bench's own protocol (spec._warm with Alternating, then alternating runs on one
# scheduler each), with every step traced. argv: B workload out.json method REPS TOKENS
out = {}
scheds = {"none": spec._scheduler(model, tok, p0, B, DraftPlan(kind="none")),
          methods[0]: spec._scheduler(model, tok, p0, B, p0.draft)}
for s in scheds.values():
    spec._warm(s, [GenerationRequest(p[:64], 8, sampling) for p in ps])
for rep in range(REPS):
    for name, s in scheds.items():
        TR.clear()
        r = spec._run_batch(s, [GenerationRequest(p, TOKENS, sampling) for p in ps])
        out.setdefault(name, []).append(dict(tok_s=r["tok_s"], acc=r["accepted"],
                                             rej=r["rejected"], trace=list(TR)))
        print(rep, name, r["tok_s"], r["accepted"], r["rejected"], flush=True)
json.dump(out, open(sys.argv[3], "w"))
