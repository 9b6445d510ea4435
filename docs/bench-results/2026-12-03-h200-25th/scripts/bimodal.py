"""Is the H200's bimodal B=16 decode rate per run or per step? draft=none, B rows, n tokens,
`reps` runs; per run: tok/s and the spread of step wall times while all rows decode."""
import gc
import statistics
import sys
import time

sys.path.insert(0, "tests")
import appliance  # noqa: F401,E402
from conftest import resolve_overrides  # noqa: E402

from appliance.bench import spec  # noqa: E402
from appliance.bench.prompts import load_tokenizer, model_dir  # noqa: E402
from appliance.engine import runner  # noqa: E402
from appliance.engine.types import GenerationRequest, SamplingParams  # noqa: E402
from appliance.plan.draft import DraftPlan  # noqa: E402

rows, n, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
plan = resolve_overrides(["draft=none"])
path = model_dir(plan)
tok = load_tokenizer(path)
model, _ = runner.load(str(path), plan.model.dtype, dequantize=plan.model.dequantized)
sampling = SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in tok.eos_token_ids})
ps = spec.prompts(tok, "free", rows, 512)
reqs = [GenerationRequest(p, n, sampling) for p in ps]
warm = [GenerationRequest(p[:64], 8, sampling) for p in ps]
s = spec._scheduler(model, tok, plan, rows, DraftPlan(kind="none"))
spec._warm(s, warm)
times = []
inner = s.step


def timed():
    t = time.perf_counter()
    inner()
    times.append((t, time.perf_counter() - t))


s.step = timed
for r in range(reps):
    mode = ["plain", "gc-off"][r % 2]
    if mode == "gc-off":
        gc.collect()
        gc.disable()
    times.clear()
    out = spec._run_batch(s, reqs)
    gc.enable()
    ms = sorted(d * 1e3 for _, d in times[-(n - 20):])  # the decode steps (prefill first)
    q = lambda f: ms[int(f * (len(ms) - 1))]  # noqa: E731
    half = len(ms) // 2
    first = statistics.median(d * 1e3 for _, d in times[-(n - 20):][:half])
    second = statistics.median(d * 1e3 for _, d in times[-(n - 20):][half:])
    print(f"run {r:2d} {mode:6s} {out['tok_s']:8.0f} tok/s  step ms p10 {q(.1):.2f} p50 {q(.5):.2f} "
          f"p90 {q(.9):.2f} max {ms[-1]:.1f}  halves {first:.2f}/{second:.2f}", flush=True)
