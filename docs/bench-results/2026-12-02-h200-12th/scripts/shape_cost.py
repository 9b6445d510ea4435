"""What a new attention shape costs on CUDA. (1) raw SDPA, 1B-shape heads: first call at a
new (qL, kL) against a repeat, for the fused causal mask, an array mask, and no mask.
(2) the 1B model's one-row tail pass over a prefilled cache: first vs repeat, exact
shapes vs a 256-grid start with the tail padded to prefill_width.
python devrun/shape_cost.py OUTJSON"""
import json
import random
import sys
import time

import appliance  # noqa: F401
import mlx.core as mx
from hydra import compose, initialize_config_dir
from mlx_lm.models.cache import make_prompt_cache

from appliance.bench.prompts import model_dir
from appliance.config.hydra_setup import conf_dir, setup
from appliance.engine import runner
from appliance.engine.step import prefill_width
from appliance.plan import resolve

out = {"sdpa": [], "model": []}
rng = random.Random(0)


def timed(f):
    mx.synchronize()
    t = time.perf_counter()
    mx.eval(f())
    mx.synchronize()
    return (time.perf_counter() - t) * 1e3


def sdpa(qL, kL, mask):
    q = mx.random.normal((1, 32, qL, 64)).astype(mx.bfloat16)
    k = mx.random.normal((1, 8, kL, 64)).astype(mx.bfloat16)
    v = mx.random.normal((1, 8, kL, 64)).astype(mx.bfloat16)
    m = None
    if mask == "causal":
        m = "causal"
    elif mask == "array":
        m = (mx.arange(kL)[None] <= (mx.arange(qL)[:, None] + kL - qL))
    mx.eval(q, k, v)
    return lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=m)


timed(sdpa(64, 64, "causal"))
for mask in ("causal", "array", "none"):
    for _ in range(6):
        qL = rng.randrange(20, 600)
        kL = qL + rng.randrange(500, 4000)
        f = sdpa(qL, kL, mask)
        a, b = timed(f), timed(sdpa(qL, kL, mask))
        out["sdpa"].append({"mask": mask, "qL": qL, "kL": kL, "first_ms": a, "repeat_ms": b})
        print(out["sdpa"][-1], flush=True)

setup()
with initialize_config_dir(str(conf_dir()), version_base="1.3"):
    plan = resolve(compose("config", overrides=["model=synthetic", "model.shape=llama-3.2-1b",
                                                 "model.dtype=bfloat16"]))
model, _ = runner.load(str(model_dir(plan)), plan.model.dtype)


def tail(P, L):
    """A fresh cache holding P tokens, then a timed pass over L more (mlx-lm's KVCache:
    the "causal" mask, MLX's fused attention)."""
    c = make_prompt_cache(model)
    toks = mx.array([[rng.randrange(1000, 100000) for _ in range(P + L)]])
    mx.eval(model(toks[:, :P], cache=c))
    return timed(lambda: model(toks[:, P:], cache=c))


tail(512, 64)
tail(1024, 300)
for _ in range(8):
    P, L = rng.randrange(1500, 4000), rng.randrange(30, 600)
    g0 = P // 256 * 256
    W = prefill_width(P + L - g0)
    rec = {"P": P, "L": L, "exact_first": tail(P, L), "exact_repeat": tail(P, L),
           "grid": [g0, W], "grid_first": tail(g0, W), "grid_repeat": tail(g0, W)}
    out["model"].append(rec)
    print(rec, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
