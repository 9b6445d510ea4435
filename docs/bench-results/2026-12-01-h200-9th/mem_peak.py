"""Transient MLX memory of prefill chunks over growing contexts, against the plan's account.
python devrun/mem_peak.py OUTJSON [overrides...]"""
import json
import sys

import appliance  # noqa: F401
import mlx.core as mx
from hydra import compose, initialize_config_dir

from appliance.config.hydra_setup import conf_dir, setup
from appliance.bench.prompts import model_dir
from appliance.engine import runner
from appliance.engine.kv import Scheme
from appliance.engine.sampling import make_sampler
from appliance.engine.step import BatchStep
from appliance.engine.types import SamplingParams
from appliance.plan import resolve

out = sys.argv[1]
over = sys.argv[2:] or ["model=synthetic", "model.shape=llama-3.2-1b", "model.dtype=bfloat16",
                        "cache=ram", "batch.max_rows=16", "cache.ram.bytes=32GiB"]
setup()
with initialize_config_dir(str(conf_dir()), version_base="1.3"):
    plan = resolve(compose("config", overrides=over))
m = plan.memory
print("plan: activations", m.activations_bytes, "buffer_cache", m.buffer_cache_bytes,
      "ceiling", m.ceiling_bytes, "chunk", plan.batch.prefill_chunk, flush=True)
model, _ = runner.load(str(model_dir(plan)), plan.model.dtype)
sampler = make_sampler(SamplingParams(temperature=0.0))
rows = []
chunk = plan.batch.prefill_chunk
for total, nrows in ((4 * chunk + 1, 1), (8 * chunk + 1, 1), (2 * chunk + 1, 4)):
    step = BatchStep(model, set(), 16, chunk, Scheme.from_plan(plan.kv), prefill_rows=nrows)
    for r in range(nrows):
        step.insert([list(range(1 + r, total + 1 + r))], 4, sampler, params=SamplingParams())
    mx.clear_cache()
    for t in range(20):
        mx.synchronize()
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        ctx = len(step._prefill.tokens[0]) if len(step._prefill) else None
        step.tick()
        mx.synchronize()
        rec = {"rows": nrows, "tick": t, "context_before": ctx, "active_before": before,
               "transient": mx.get_peak_memory() - before, "active_after": mx.get_active_memory(),
               "cache": mx.get_cache_memory()}
        rows.append(rec)
        print(rec, flush=True)
        if not len(step._prefill) and not len(step._decode) and not step._waiting:
            break
    del step
json.dump({"plan": {"activations": m.activations_bytes, "buffer_cache": m.buffer_cache_bytes,
                    "ceiling": m.ceiling_bytes}, "ticks": rows}, open(out, "w"), indent=1)
