"""19th session: is a batched decode step on CUDA slow because of the left-padding mask?
Times the model's decode step over mlx-lm's BatchKVCache (left padded: an array mask) and
over plain KVCaches of the same width (no mask: MLX's fused vector kernel), and attention
alone: no mask, a bool mask, an additive mask, one call per row over its own slice.
usage: attn_probe.py SHAPE BITS OUT"""
import json
import sys
import time

import appliance  # noqa: F401
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache
from mlx_lm.utils import load_model

from appliance.models import synthetic as s
from appliance.engine.kv import native_cuda
from appliance.models.dense import dequantize

shape, bits, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model, _ = load_model(s.ensure(shape, "bfloat16", bits or None, 0))
if bits:
    dequantize(model, mx.bfloat16)
mx.eval(model.parameters())
args = model.args
H, HKV = args.num_attention_heads, args.num_key_value_heads
D = getattr(args, "head_dim", None) or args.hidden_size // H
L = args.num_hidden_layers
V = min(120000, args.vocab_size)
res = {"shape": shape, "bits": bits}


def med(xs):
    return round(1e3 * sorted(xs)[len(xs) // 2], 3)


def timed(f, reps=12):
    ts = []
    for _ in range(reps + 3):
        mx.synchronize()
        t = time.perf_counter()
        mx.eval(f())
        ts.append(time.perf_counter() - t)
    return med(ts[3:])


def decode(cache, B, steps=12):
    y = mx.random.randint(0, V, (B, 1))
    ts = []
    for _ in range(steps + 3):
        mx.synchronize()
        t = time.perf_counter()
        y = mx.argmax(model(y, cache=cache)[:, -1:], axis=-1)
        mx.eval(y)
        ts.append(time.perf_counter() - t)
    return med(ts[3:])


for B, T in [(1, 2048), (8, 2048), (16, 2048), (16, 3584)]:
    pads = [(i * 97) % 512 for i in range(B)]
    x = mx.random.randint(0, V, (B, T))
    c = [BatchKVCache(left_padding=pads) for _ in range(L)]
    model(x, cache=c)
    mx.eval([a.state for a in c])
    res[f"batchkv_B{B}_T{T}_ms"] = decode(c, B)
    native_cuda.install()
    res[f"batchkv_kernel_B{B}_T{T}_ms"] = decode(c, B)
    mx.fast.scaled_dot_product_attention = native_cuda._mlx
    del c
    c = make_prompt_cache(model)
    model(x, cache=c)
    mx.eval([a.state for a in c])
    res[f"plain_B{B}_T{T}_ms"] = decode(c, B)
    del c
    mx.clear_cache()
    # attention alone, L layers' worth per eval
    q = mx.random.normal((B, H, 1, D)).astype(mx.bfloat16)
    k = mx.random.normal((B, HKV, T, D)).astype(mx.bfloat16)
    v = mx.random.normal((B, HKV, T, D)).astype(mx.bfloat16)
    pos = mx.arange(T)[None]
    bmask = (pos >= mx.array(pads)[:, None])[:, None, None, :]
    amask = mx.where(bmask, 0.0, -mx.inf).astype(mx.bfloat16)
    mx.eval(q, k, v, bmask, amask)
    sc = D ** -0.5
    sd = mx.fast.scaled_dot_product_attention
    res[f"attn_none_B{B}_T{T}_ms"] = timed(lambda: [sd(q + i, k, v, scale=sc) for i in range(L)])
    res[f"attn_bool_B{B}_T{T}_ms"] = timed(
        lambda: [sd(q + i, k, v, scale=sc, mask=bmask) for i in range(L)])
    res[f"attn_add_B{B}_T{T}_ms"] = timed(
        lambda: [sd(q + i, k, v, scale=sc, mask=amask) for i in range(L)])
    res[f"attn_kernel_B{B}_T{T}_ms"] = timed(
        lambda: [native_cuda.attend(q + i, k, v, sc, bmask) for i in range(L)])
    res[f"attn_rows_B{B}_T{T}_ms"] = timed(lambda: [mx.concatenate(
        [sd(q[r:r + 1] + i, k[r:r + 1, :, p:], v[r:r + 1, :, p:], scale=sc)
         for r, p in enumerate(pads)]) for i in range(L)])
    print(json.dumps({k2: v2 for k2, v2 in res.items() if f"B{B}_T{T}" in k2}), flush=True)
json.dump(res, open(out, "w"), indent=1)
