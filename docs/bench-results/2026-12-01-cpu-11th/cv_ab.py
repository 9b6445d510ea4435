"""In-process A/B, runs alternating: draft=none, lookup and mtp, each with verify passes
uncompiled and compiled. python devrun/cv_ab.py OUTJSON REPEATS TOKENS ROWS..."""
import json
import statistics
import sys
import time

import appliance  # noqa: F401
import mlx.core as mx
from hydra import compose, initialize_config_dir

from appliance.bench import spec as S
from appliance.bench.prompts import load_tokenizer, model_dir
from appliance.config.hydra_setup import conf_dir, setup
from appliance.engine import runner
from appliance.engine.types import GenerationRequest, SamplingParams
from appliance.plan import resolve

out_path, reps, ntok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
B_list = [int(b) for b in sys.argv[4:]] or [1, 4, 16]
setup()
plans = {}
with initialize_config_dir(str(conf_dir()), version_base="1.3"):
    for d in ("none", "lookup", "mtp"):
        plans[d] = resolve(compose("config", overrides=["model=tiny", f"draft={d}"]))
plan = plans["none"]
path = model_dir(plan)
tok = load_tokenizer(path)
model, _ = runner.load(str(path), plan.model.dtype)
sampling = SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in tok.eos_token_ids})
result = {"label": {"mlx": mx.__version__, "device": str(mx.default_device()),
                    "dtype": plan.model.dtype, "tokens": ntok, "repeats": reps,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}, "cells": []}
for wl in ("edit", "free"):
    for B in B_list:
        ps = S.prompts(tok, wl, B, 512)
        reqs = [GenerationRequest(p, ntok, sampling) for p in ps]
        warm = [GenerationRequest(p[:64], 8, sampling) for p in ps]
        scheds = {}
        for name, d, comp in (("none", "none", False), ("lookup", "lookup", False),
                              ("lookup+cv", "lookup", True), ("mtp", "mtp", False),
                              ("mtp+cv", "mtp", True)):
            s = S._scheduler(model, tok, plans[d], B, plans[d].draft)
            if comp:
                s.compile_verify = True
                s._batch = s._new_step()
            scheds[name] = s
            S._run_batch(s, warm)
            S._run_batch(s, reqs[:1] if B > 1 else reqs)
        runs = {k: [] for k in scheds}
        for _ in range(reps):
            for k, s in scheds.items():
                runs[k].append(S._run_batch(s, reqs))
        cell = {"workload": wl, "B": B, "runs": runs}
        base = statistics.median(r["tok_s"] for r in runs["none"])
        line = f"{wl} B={B} none {base:.0f} tok/s (median)"
        for k, v in runs.items():
            med = statistics.median(r["tok_s"] for r in v)
            cell[f"{k}_x"] = round(med / base, 3)
            line += f" | {k} {med / base:.2f}x"
        print(line, flush=True)
        result["cells"].append(cell)
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)
