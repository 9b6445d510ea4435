"""CPU B=16: every Control.timed sample against the scheduler loop's own wall clock per step.
python devrun/ctl_probe.py WORKLOAD REPS"""
import statistics
import sys
import time

import appliance  # noqa: F401
from hydra import compose, initialize_config_dir

from appliance.bench import spec as S
from appliance.bench.prompts import load_tokenizer, model_dir
from appliance.config.hydra_setup import conf_dir, setup
from appliance.engine import runner
from appliance.engine.speculate import control as C
from appliance.engine.types import GenerationRequest, SamplingParams
from appliance.plan import resolve

wl, reps = sys.argv[1], int(sys.argv[2])
setup()
with initialize_config_dir(str(conf_dir()), version_base="1.3"):
    plan = resolve(compose("config", overrides=["draft=lookup"]))
    plan0 = resolve(compose("config", overrides=["draft=none"]))
path = model_dir(plan)
tok = load_tokenizer(path)
model, _ = runner.load(str(path), plan.model.dtype)
sampling = SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in tok.eos_token_ids})
B = 16
ps = S.prompts(tok, wl, B, 512)
reqs = [GenerationRequest(p, 512, sampling) for p in ps]
log = []
orig = C.Control.timed
def timed(self, rows, spec, seconds, tokens):
    log.append((time.perf_counter(), rows, spec, seconds, tokens))
    return orig(self, rows, spec, seconds, tokens)
C.Control.timed = timed
trace = []
orig_spec = C.Control.speculate
import os
if os.environ.get("COMPACT_AT"):
    import appliance.engine.verify as V
    V.COMPACT_AT = float(os.environ["COMPACT_AT"])
FORCE = os.environ.get("FORCE16")
def speculate(self, rows):
    out = orig_spec(self, rows)
    if FORCE == "allplain":
        out = False
    elif FORCE and rows == 16:
        out = FORCE == "spec"
    if rows == 16:
        b = 16
        ts, tp = self._secs(b, True), self._secs(b, False)
        m = self._modes.get(b)
        trace.append((out, round(ts*1e3) if ts else None, round(tp*1e3,1) if tp else None, round(self._gain.get(b, 0), 2),
                      self._winner(b), m and (m.winner, m.probe_at, m.gap), self._ticks.get(b)))
    return out
C.Control.speculate = speculate
s = S._scheduler(model, tok, plan, B, plan.draft)
s0 = S._scheduler(model, tok, plan0, B, plan0.draft)
for x in (s, s0):
    S._run_batch(x, [GenerationRequest(p[:64], 8, sampling) for p in ps])

def run(s):
    rows = [S._Row(r, i) for i, r in enumerate(reqs)]
    for r in rows:
        s.add(r)
    steps = []
    while s.has_work():
        t, n = time.perf_counter(), s._batch.spec_ticks
        before = sum(r.n for r in rows)
        s.step()
        full = all(r.first is not None for r in rows) and all(r.finished is None for r in rows)
        steps.append((t, time.perf_counter(), full, s._batch.spec_ticks > n, sum(r.n for r in rows) - before, len(s._batch._decode), s._batch._asked))
    return steps

for rep in range(reps):
    st0 = run(s0)
    log.clear(); trace.clear()
    st = run(s)
    prev = None
    for t in trace:
        if t[0] != prev or t[0]:
            print("     ", t)
        prev = t[0]
    for name, x in (("none", st0), ("lookup", st)):
        full = [y for y in x if y[2]]
        tot = sum(y[4] for y in full) / (full[-1][1] - full[0][0])
        print(f"rep {rep} {name}: full-window {tot:.0f} tok/s, steps {len(full)}, spec {sum(y[3] for y in full)}")
    # timed samples at 16 rows
    for spec in (False, True):
        smp = [(sec, tk) for (_, r, sp, sec, tk) in log if r == 16 and sp == spec]
        if smp:
            print(f"   ctl samples rows=16 spec={spec}: n={len(smp)} median {statistics.median(a for a,_ in smp)*1e3:.1f} ms, tokens/row {statistics.mean(b for _,b in smp)/16:.2f}")
    full = [y for y in st if y[2]]
    ask = [(y[1]-y[0]) for y in full if y[6]]
    pl0 = [(y[1]-y[0]) for y in full if not y[3] and not y[6]]
    print(f"   asked-none steps {len(ask)} median {statistics.median(ask)*1e3 if ask else 0:.1f} ms (sum {sum(ask):.2f} s); plain {len(pl0)} median {statistics.median(pl0)*1e3 if pl0 else 0:.1f} ms (sum {sum(pl0):.2f} s)")
    pl = [(y[1]-y[0]) for y in full if not y[3]]
    sp = [(y[1]-y[0], y[4]) for y in full if y[3]]
    if pl and sp: print(f"   loop wall rows=16: plain n={len(pl)} median {statistics.median(pl)*1e3:.1f} ms; spec n={len(sp)} median {statistics.median([a for a,_ in sp])*1e3 if sp else 0:.1f} ms, tok/row {statistics.mean([b for _,b in sp])/16 if sp else 0:.2f}")
    # per-row-count ctl samples
    by = {}
    for (_, r, sp_, sec, tk) in log:
        by.setdefault((r, sp_), []).append(sec)
    print("   ctl by rows:", {k: (len(v), round(statistics.median(v)*1e3, 1)) for k, v in sorted(by.items())})
