"""Device: batched decode tok/s with the compiled step off/on (bench.kv.batched_decode)."""
import sys
import time

import mlx.core as mx

import appliance  # noqa: F401
from appliance.bench.kv import batched_decode, compose_plan
from appliance.bench.prompts import model_dir
from appliance.engine import runner

shape = sys.argv[1] if len(sys.argv) > 1 else "llama-3.2-1b"
extra = sys.argv[2:]
CELLS = ((1, 128), (8, 4096), (32, 4096)) if "tiny" not in shape else ((1, 64), (4, 256))
base = ["model=synthetic", f"model.shape={shape}", *extra]
plans = {c: compose_plan(base + [f"batch.compile_step={c}"]) for c in ("false", "true")}
path = model_dir(plans["false"])
with mx.stream(mx.new_stream(mx.default_device())):
    model, _ = runner.load(str(path), plans["false"].model.dtype, None)
    for rows, ctx in CELLS:
        res = {}
        for c, p in plans.items():
            t = time.perf_counter()
            r = batched_decode(model, p, rows, ctx, 64, 3, 0)
            res[c] = max(r["runs"])
            print(f"{shape} B={rows} ctx={ctx} compile={c}: runs {[round(x, 1) for x in r['runs']]}"
                  f" (prefill {r['prefill_s']}s, total {time.perf_counter() - t:.1f}s)", flush=True)
        print(f"== {shape} B={rows} ctx={ctx}: compiled/plain = {res['true'] / res['false']:.2f}x",
              flush=True)
