"""A prefill pass of the embedded model (4 rows x 256 tokens over 1,500 cached) evaluated for
its KV only, as draft=none runs it, and tapped (its hidden states too, as an MTP engine
runs it). CPU; from the repo root: python docs/bench-results/2026-12-04-cpu-31st/tapped_prefill.py"""
import sys, time
sys.path.insert(0, "tests")
import appliance  # noqa (before mlx)
import mlx.core as mx
from conftest import resolve_overrides
from appliance.bench.prompts import model_dir
from appliance.engine import runner
from appliance.engine.kv import cores
from appliance.models.mtp import hidden_states, logits_from_hidden
from mlx_lm.models.cache import make_prompt_cache
plan = resolve_overrides([])
model, _ = runner.load(str(model_dir(plan)), plan.model.dtype, dequantize=plan.model.dequantized)
cores.use(2)
B, P, C = 4, 1500, 256
def run(tapped):
    cache = make_prompt_cache(model)
    model(mx.random.randint(0, 4000, (B, P)), cache=cache); mx.eval([c.state for c in cache])
    x = mx.random.randint(0, 4000, (B, C))
    t = time.perf_counter()
    if tapped:
        h = hidden_states(model, x, cache); logits_from_hidden(model, h)
        mx.eval([c.state for c in cache], h)
    else:
        model(x, cache=cache); mx.eval([c.state for c in cache])
    return time.perf_counter() - t
for rep in range(3):
    print("plain %.1f ms  tapped %.1f ms" % (1e3 * run(False), 1e3 * run(True)))
