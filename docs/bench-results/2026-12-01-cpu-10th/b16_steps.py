"""CPU, B=16: per-step times of plain steps with and without a drafter present (lookup),
in the timed window (every row decoding). python devrun/b16_steps.py WORKLOAD REPS"""
import statistics
import sys
import time

import appliance  # noqa: F401
from hydra import compose, initialize_config_dir

from appliance.bench import spec as S
from appliance.bench.prompts import load_tokenizer, model_dir
from appliance.config.hydra_setup import conf_dir, setup
from appliance.engine import runner
from appliance.engine.types import GenerationRequest, SamplingParams
from appliance.plan import resolve

wl, reps = sys.argv[1], int(sys.argv[2])
setup()
plans = {}
with initialize_config_dir(str(conf_dir()), version_base="1.3"):
    for d in ("none", "lookup"):
        plans[d] = resolve(compose("config", overrides=[f"draft={d}"]))
path = model_dir(plans["none"])
tok = load_tokenizer(path)
model, _ = runner.load(str(path), plans["none"].model.dtype)
sampling = SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in tok.eos_token_ids})
B = 16
ps = S.prompts(tok, wl, B, 512)
reqs = [GenerationRequest(p, 512, sampling) for p in ps]
scheds = {d: S._scheduler(model, tok, plans[d], B, plans[d].draft) for d in ("none", "lookup")}
for s in scheds.values():
    S._run_batch(s, [GenerationRequest(p[:64], 8, sampling) for p in ps])


def run(s):
    rows = [S._Row(r, i) for i, r in enumerate(reqs)]
    for r in rows:
        s.add(r)
    steps = []
    while s.has_work():
        t, n = time.perf_counter(), s._batch.spec_ticks
        before = sum(r.n for r in rows)
        s.step()
        emitted = sum(r.n for r in rows) - before
        full = all(r.first is not None for r in rows) and all(r.finished is None for r in rows)
        holes = [c for c in s._batch._decode.layers if getattr(c, "_holes", None) is not None]
        width = s._batch._decode.layers[0]._idx if len(s._batch._decode) else 0
        steps.append((full, s._batch.spec_ticks > n, time.perf_counter() - t, bool(holes), width,
                      emitted))
    return steps


def ctl_state(s):
    c = s.control
    if c is None:
        return ""
    return (f" | ctl b16: spec times {[round(x*1e3) for x in c._times.get((16, True), [])]}, "
            f"plain {[round(x*1e3) for x in c._times.get((16, False), [])]}, gain "
            f"{round(c._gain.get(16, 0), 2)}, winner {c._winner(16)}, mode {c._modes.get(16)}")


for rep in range(reps):
    for d, s in scheds.items():
        st = [x for x in run(s) if x[0]]
        plain = [x[2] * 1e3 for x in st if not x[1]]
        spec = [x[2] * 1e3 for x in st if x[1]]
        holed = [x[2] * 1e3 for x in st if not x[1] and x[3]]
        since, pos = 99, {}
        for x in st:
            since = 0 if x[1] else since + 1
            if not x[1]:
                pos.setdefault(min(since, 5), []).append(x[2] * 1e3)
        print("   plain step ms by position after a spec step (5 = 5th or later):",
              {k: (len(v), round(statistics.median(v), 1)) for k, v in sorted(pos.items())})
        print(f"{d:6s} rep {rep}: {len(plain)} plain, median {statistics.median(plain):.2f} ms, "
              f"mean {statistics.mean(plain):.2f}; {len(spec)} spec"
              + (f", median {statistics.median(spec):.1f} ms" if spec else "")
              + f"; plain with holes {len(holed)}; width end {st[-1][4]}; total {sum(x[2] for x in st):.2f} s"
              + f"; tokens {sum(x[5] for x in st)} = {sum(x[5] for x in st) / sum(x[2] for x in st):.0f} tok/s"
              + (f"; per spec step {statistics.mean(x[5] for x in st if x[1]) / B:.2f} a row" if spec else "")
              + ctl_state(s), flush=True)
