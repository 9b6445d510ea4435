"""Batched prefill on CUDA: today's whole-buffer array-mask attention against fused causal
attention over exact slices (one row, no padding). Per chunk: ms and MLX transient.
python devrun/prefill_ab.py OUTJSON"""
import json
import random
import sys
import time

import appliance  # noqa: F401
import mlx.core as mx
from hydra import compose, initialize_config_dir

from appliance.bench.prompts import model_dir
from appliance.config.hydra_setup import conf_dir, setup
from appliance.engine import runner
from appliance.engine import step as step_mod
from appliance.engine.kv import Scheme
from appliance.engine.kv.native import FullLayout
from appliance.engine.sampling import make_sampler
from appliance.engine.step import BatchStep
from appliance.engine.types import SamplingParams
from appliance.plan import resolve

out = sys.argv[1]
setup()
with initialize_config_dir(str(conf_dir()), version_base="1.3"):
    plan = resolve(compose("config", overrides=["model=synthetic", "model.shape=llama-3.2-1b",
                                                 "model.dtype=bfloat16"]))
model, _ = runner.load(str(model_dir(plan)), plan.model.dtype)
sampler = make_sampler(SamplingParams(temperature=0.0))
orig_mask = FullLayout.make_mask


def fused_mask(self, N, return_array=False, **kw):
    if N > 1 and not self.whole_buffer and self._holes is None and self.left_padding.shape[0] == 1:
        return "causal"
    return orig_mask(self, N, return_array=return_array, **kw)


def run(policy, segments):
    """segments: list of chunk lengths fed to one row, in order; returns per-chunk records."""
    step_mod.WHOLE_BUFFER = policy == "whole"
    FullLayout.make_mask = fused_mask if policy == "fused" else orig_mask
    total = sum(segments)
    step = BatchStep(model, set(), 16, max(segments), Scheme.from_plan(plan.kv))
    toks = [random.randrange(1000, 100000) for _ in range(total + 1)]
    segs, at = [], 0
    for n in segments:
        segs.append(toks[at:at + n])
        at += n
    segs.append(toks[at:])
    step.insert(segs, 2, sampler, params=SamplingParams())
    recs = []
    for _ in range(len(segments) + 3):
        mx.synchronize()
        ctx = len(step._prefill.tokens[0]) if len(step._prefill) else None
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        t = time.perf_counter()
        step.tick()
        mx.synchronize()
        recs.append({"context": ctx, "ms": round((time.perf_counter() - t) * 1e3, 2),
                     "transient_mib": round((mx.get_peak_memory() - before) / 2**20)})
        if not len(step._prefill) and not len(step._decode) and not step._waiting:
            break
    mx.clear_cache()
    return recs


random.seed(0)
res = {}
long = [2048] * 8
tails = [4096] + [random.randrange(200, 900) for _ in range(12)]
for policy in ("whole", "fused", "whole", "fused"):
    for name, segs in (("long", long), ("tails", tails)):
        r = run(policy, segs)
        res.setdefault(f"{policy}/{name}", []).append(r)
        pre = [x for x in r if x["context"] is not None]
        print(policy, name, "prefill ms", [x["ms"] for x in pre], "MiB",
              [x["transient_mib"] for x in pre], flush=True)
json.dump(res, open(out, "w"), indent=1)
