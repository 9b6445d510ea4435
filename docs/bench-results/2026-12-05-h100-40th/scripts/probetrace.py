"""Where a drafter engine's B-row runs lose against draft=none: every decode step's time
(end to end), whether it speculated, and the control's probe plan after each run.
FORCE="run:step,..." (33rd session's variant): before each named run, the B-row mode's next
probe is set that many steps into the run, so probes land mid-run in later runs (the 32nd
and 33rd sessions' costly probe runs were later ones: mtp free 0.39x paired in run 6).
usage: [FORCE=3:100,6:180,9:60] python probetrace.py <draft> <rows> <tokens> <repeats> <workload>"""
import os
import statistics
import sys
import time

sys.path.insert(0, "tests")
import appliance  # noqa: F401,E402  (before mlx)
from conftest import resolve_overrides  # noqa: E402

from appliance.bench import spec  # noqa: E402
from appliance.bench.prompts import load_tokenizer, model_dir  # noqa: E402
from appliance.engine import runner  # noqa: E402
from appliance.engine.types import GenerationRequest, SamplingParams  # noqa: E402
from appliance.plan.draft import DraftPlan  # noqa: E402

import mlx.core as mx  # noqa: E402

# Every trace of a compiled pass (39th: does a later probe meet shapes the first did not?):
# (time, tokens' shape, the first layer's key buffer shape)
traces, _compile = [], mx.compile


def _counting(f, **kw):
    if kw:  # (mlx-lm's own compiled helpers)
        return _compile(f, **kw)

    def g(*a):
        traces.append((time.perf_counter(), tuple(a[0].shape), tuple(a[4][0].shape)))
        return f(*a)
    return _compile(g)


mx.compile = _counting
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
          d: spec._scheduler(model, tok, plan, rows, plan.draft)}
for s in scheds.values():
    spec._warm(s, warm)
log = []  # (end time, spec step?) of the drafter engine's steps
b = scheds[d]._batch
inner = b._decode_step


live_log = []  # live (not held) rows at each step of the drafter engine


def traced():
    before = b.spec_ticks
    live_log.append(sum(u is not None for u in b._decode.uids))
    out = inner()
    log.append((time.perf_counter(), b.spec_ticks > before))
    return out


b._decode_step = traced

# SPLIT=1 (40th): each speculative step's parts timed apart (synchronized around each):
# the drafter's proposal, its catch-up pass inside it (feed width, rows' lengths, the head's
# key buffer), the verify, the settle. Which holds a later probe's 700 ms first step?
split, cur = [], []


def _timed(obj, name, tag, info=None):
    f = getattr(obj, name)

    def g(*a, **kw):
        mx.synchronize()
        t = time.perf_counter()
        out = f(*a, **kw)
        if isinstance(out, mx.array):
            mx.eval(out)
        mx.synchronize()
        cur.append((tag, round((time.perf_counter() - t) * 1e3, 1)) + ((info(*a),) if info else ()))
        return out
    setattr(obj, name, g)


if os.environ.get("SPLIT"):
    dr = b.drafter

    def _run_info(batch, feeds):
        ks = batch.extra[0].keys if hasattr(batch.extra[0], "keys") else None
        return ([len(t) for _, t, _ in feeds], getattr(ks, "shape", None))
    if hasattr(dr, "_run"):
        _timed(dr, "_run", "catchup", _run_info)
    _timed(dr, "propose", "propose")
    _timed(b._decode, "verify", "verify")
    _timed(dr, "settle", "settle")
    inner_spec = b._speculate

    def spec_split():
        cur.clear()
        out = inner_spec()
        if cur:
            split.append((len(log), list(cur)))
        return out
    b._speculate = spec_split
ctl = b.control
decide = ctl.speculate
why = []


def speculate(rows, settled=True, left=None):
    out = decide(rows, settled, left)
    if out:
        bb = 1 << max(0, rows - 1).bit_length()
        m = ctl._modes.get(bb)
        ts, tp = ctl._secs(bb, True), ctl._secs(bb, False)
        why.append((rows, ctl._ticks.get(bb), m and (m.probe_at, m.gap, m.winner),
                    ts and round(ts * 1e3, 1), tp and round(tp * 1e3, 2),
                    round(ctl._gain.get(bb, 0), 2),
                    [round(x * 1e3, 1) for x in ctl._times.get((bb, True), ())],
                    [round(x * 1e3, 1) for x in ctl._times.get((bb, False), ())]))
    return out


ctl.speculate = speculate
runs = {k: [] for k in scheds}
for r in range(reps):
    for k in (list(scheds) if r % 2 == 0 else list(scheds)[::-1]):
        log.clear()
        why.clear()
        live_log.clear()
        force = dict(tuple(map(int, x.split(":"))) for x in os.environ.get("FORCE", "").split(",") if x)
        if k == d and r in force and rows in ctl._modes:
            ctl._modes[rows].probe_at = ctl._ticks.get(rows, 0) + force[r]
            print(f"   run {r}: probe forced at step {force[r]}", flush=True)
        out = spec._run_batch(scheds[k], reqs)
        runs[k].append(out["tok_s"])
        if k != d:
            continue
        dts = [(t1 - t0, s) for (t0, _), (t1, s) in zip(log, log[1:])]
        plain = [t for t, s in dts if not s]
        med = statistics.median(plain) if plain else 0
        specs = [i for i, (_, s) in enumerate(dts) if s]
        after = []  # each spec run's next 8 plain steps' excess over the median
        for i in specs:
            if i + 1 < len(dts) and not dts[i + 1][1]:
                after.append(sum(t - med for t, _ in dts[i + 1:i + 9] if True))
        modes = {bb: (m.probe_at, m.gap, m.winner) for bb, m in b.control._modes.items()}
        print(f"run {r}: {out['tok_s']:.0f} tok/s (none {runs['none'][-1]:.0f}), "
              f"{len(dts)} steps, plain median {med * 1e3:.2f} ms, "
              f"spec steps {[round(dts[i][0] * 1e3, 1) for i in specs]} ms, "
              f"after-excess {[round(a * 1e3, 1) for a in after]} ms, "
              f"sum of plain {sum(plain) * 1e3:.0f} ms, ticks {b.control._ticks}, "
              f"modes {modes}, accepted {out['accepted']}", flush=True)
        # the tail: steps after the first row finished (fewer live rows than the most)
        most = max(live_log[1:], default=0)
        peak = live_log[1:].index(most) if most else 0
        first_end = next((i for i, n in enumerate(live_log[1:]) if i > peak and n < most),
                         len(dts))
        tail = dts[first_end:]
        print(f"   to the first finish {first_end} steps ({sum(t for t, _ in dts[:first_end]) * 1e3:.0f}"
              f" ms, {sum(s for _, s in dts[:first_end])} spec); tail steps {len(tail)} "
              f"({sum(t for t, _ in tail) * 1e3:.0f} ms, {sum(s for _, s in tail)} spec); "
              f"live rows in the tail {live_log[1 + first_end::8]}", flush=True)
        t_run0 = log[0][0] if log else 0
        print(f"   traces this run: {[(round((t - t_run0) * 1e3), a, k) for t, a, k in traces if t >= t_run0]}",
              flush=True)
        print("   steps", " ".join(f"{n}{'S' if s else 'p'}{t * 1e3:.1f}"
                                  for n, (t, s) in zip(live_log[1:], dts)), flush=True)
        for i, parts in split:
            print(f"   split at step {i}: {parts}", flush=True)
        split.clear()
        for w in why:
            print("   ", w, flush=True)
pairs = [x / y for x, y in zip(runs[d], runs["none"], strict=True)]
total = sum(1 / x for x in runs["none"]) / sum(1 / x for x in runs[d])
print(f"{d} / none: paired median {statistics.median(pairs):.3f}, "
      f"total time {total:.3f}", flush=True)
