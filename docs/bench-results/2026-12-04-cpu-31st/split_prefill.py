"""A prefill pass of the embedded model (1 row, n tokens over 1,800 cached), with its
attention split over the CPU's two cores (cores.MIN_PREFILL lowered) or not. From the repo root."""
import sys, time, statistics
sys.path.insert(0, "tests")
import appliance  # noqa (before mlx)
import mlx.core as mx
from conftest import resolve_overrides
from appliance.bench.prompts import model_dir
from appliance.engine import runner
from appliance.engine.kv import cores
from mlx_lm.models.cache import make_prompt_cache
plan = resolve_overrides([])
model, _ = runner.load(str(model_dir(plan)), plan.model.dtype, dequantize=plan.model.dequantized)
cores.use(2)
base = make_prompt_cache(model)
model(mx.random.randint(0, 4000, (1, 1800)), cache=base); mx.eval([c.state for c in base])
import copy
def one(n, split):
    cores.MIN_PREFILL = 1 if split else 10**9
    cache = copy.deepcopy(base)
    x = mx.random.randint(0, 4000, (1, n))
    t = time.perf_counter(); model(x, cache=cache); mx.eval([c.state for c in cache])
    return time.perf_counter() - t
for n in (96, 128, 144, 256):
    a, b = [], []
    for _ in range(5):
        a.append(one(n, False)); b.append(one(n, True))
    print(f"n={n}: unsplit {1e3*statistics.median(a):.1f} ms, split {1e3*statistics.median(b):.1f} ms, ratio {statistics.median(b)/statistics.median(a):.2f}", flush=True)
