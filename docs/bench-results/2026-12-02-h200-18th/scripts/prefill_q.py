"""18th session: on CUDA, is a 4-bit model's prefill (and B=16 decode) bound by MLX's
quantized matmul? Times the same passes with the model as loaded (4-bit) and with every
QuantizedLinear dequantized to a bf16 Linear (same values). usage: prefill_q.py SHAPE BITS OUT"""
import json
import sys
import time

import appliance  # noqa: F401
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from appliance.models import synthetic as s

shape, bits, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
path = s.ensure(shape, "bfloat16", bits or None, 0)
model, _ = load_model(path)
V = 120000


def med(xs):
    return sorted(xs)[len(xs) // 2]


def prefill_tail(ctx, tail, reps=5):
    ts = []
    for _ in range(reps + 1):
        cache = make_prompt_cache(model)
        model(mx.random.randint(0, V, (1, ctx)), cache=cache)
        mx.eval([c.state for c in cache])
        y = mx.random.randint(0, V, (1, tail))
        mx.eval(y)
        mx.synchronize()
        t = time.perf_counter()
        o = model(y, cache=cache)[:, -1]
        mx.eval(o)
        mx.synchronize()
        ts.append(time.perf_counter() - t)
    return med(ts[1:])


def decode_b(b, ctx, steps=16):
    cache = make_prompt_cache(model)
    model(mx.random.randint(0, V, (b, ctx)), cache=cache)
    mx.eval([c.state for c in cache])
    y = mx.random.randint(0, V, (b, 1))
    ts = []
    for _ in range(steps + 2):
        mx.synchronize()
        t = time.perf_counter()
        y = mx.argmax(model(y, cache=cache)[:, -1:], axis=-1)
        mx.eval(y)
        ts.append(time.perf_counter() - t)
    return med(ts[2:])


def measure(label):
    r = {"label": label}
    for ctx, tail in [(2048, 512), (0, 2048), (4096, 512)]:
        r[f"prefill_{ctx}+{tail}_ms"] = round(1e3 * prefill_tail(max(ctx, 1), tail), 2)
    for b in (1, 16):
        r[f"decode_b{b}_ctx2048_ms"] = round(1e3 * decode_b(b, 2048), 2)
    r["active_gb"] = round(mx.get_active_memory() / 1e9, 2)
    print(json.dumps(r), flush=True)
    return r


res = [measure(f"{shape} q{bits}")]
if bits:
    def dense(m):
        if isinstance(m, nn.QuantizedLinear):
            w = mx.dequantize(m.weight, m.scales, m.get("biases"), m.group_size, m.bits)
            lin = nn.Linear(w.shape[1], w.shape[0], bias="bias" in m)
            lin.weight = w.astype(mx.bfloat16)
            if "bias" in m:
                lin.bias = m.bias
            return lin
        return m
    from mlx.utils import tree_unflatten
    leaves = [(n, dense(m)) for n, m in model.named_modules() if isinstance(m, nn.QuantizedLinear)]
    model.update_modules(tree_unflatten(leaves))
    mx.eval(model.parameters())
    mx.clear_cache()
    res.append(measure(f"{shape} q{bits} dequantized to bf16"))
json.dump(res, open(out, "w"), indent=1)
