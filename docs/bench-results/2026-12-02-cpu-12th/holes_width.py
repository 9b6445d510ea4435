"""CPU B=16: the slots a plain step attends over (layer 0's cursor) and the share of them
masked as holes, for draft=lookup against draft=none on the same prompts.
python devrun/holes_width.py WORKLOAD"""
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

wl = sys.argv[1]
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
for name, p in (("none", plan0), ("lookup", plan)):
    s = S._scheduler(model, tok, p, B, p.draft)
    S._run_batch(s, [GenerationRequest(q[:64], 8, sampling) for q in ps])
    rows = [S._Row(r, i) for i, r in enumerate(reqs)]
    for r in rows:
        s.add(r)
    idx, share, times, spec = [], [], [], 0
    while s.has_work():
        n = s._batch.spec_ticks
        t = time.perf_counter()
        s.step()
        dt = time.perf_counter() - t
        d = s._batch._decode
        if len(d) == B and d.layers:
            if s._batch.spec_ticks > n:
                spec += 1
            else:
                c = d.layers[0]
                idx.append(c._idx)
                share.append(c.holes_share())
                times.append(dt)
    print(f"{name}: plain steps at 16 rows {len(idx)}, spec {spec}; slots mean {statistics.mean(idx):.0f}"
          f" holes share mean {statistics.mean(share):.3f} max {max(share):.3f};"
          f" step median {1e3 * statistics.median(times):.1f} ms", flush=True)
