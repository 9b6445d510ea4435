"""20th session: why the two decode steps after a row joins or leaves cost ~50 ms against
~19 ms (8B agents trace). Times each decode step (synchronous) as the batch changes size:
filter (a row leaves) and extend (a row joins), twice each, to see whether a B seen before
is cheap again (graph cache) or every change pays. usage: probe_b.py SHAPE BITS OUT"""
import json
import sys
import time

import appliance  # noqa: F401
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.utils import load_model

from appliance.models import synthetic as s
from appliance.engine.kv import native_cuda
from appliance.models.dense import dequantize

shape, bits, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model, _ = load_model(s.ensure(shape, "bfloat16", bits or None, 0))
if bits:
    dequantize(model, mx.bfloat16)
mx.eval(model.parameters())
native_cuda.install()
L = model.args.num_hidden_layers
V = min(120000, model.args.vocab_size)
res = {"shape": shape, "bits": bits, "log": []}


def ms(t):
    return round(1e3 * t, 2)


def prefill(B, T):
    pads = [(i * 97) % 512 for i in range(B)]
    c = [BatchKVCache(left_padding=pads) for _ in range(L)]
    x = mx.random.randint(0, V, (B, T))
    for i in range(0, T, 1024):
        model(x[:, i:i + 1024], cache=c)
        mx.eval([a.state for a in c])
    return c


def steps(c, B, n, tag):
    y = mx.random.randint(0, V, (B, 1))
    ts = []
    for _ in range(n):
        mx.synchronize()
        t = time.perf_counter()
        y = mx.argmax(model(y, cache=c)[:, -1:], axis=-1)
        mx.eval(y)
        ts.append(ms(time.perf_counter() - t))
    res["log"].append({tag: ts})
    print(tag, ts, flush=True)


def op(tag, f, c):
    mx.synchronize()
    t = time.perf_counter()
    f()
    mx.eval([a.state for a in c])
    res["log"].append({tag: ms(time.perf_counter() - t)})
    print(tag, res["log"][-1][tag], flush=True)


c = prefill(16, 2560)
one = [prefill(1, 2048) for _ in range(3)]
steps(c, 16, 10, "B16 warm")
for rnd in range(2):
    op(f"filter->15 #{rnd}", lambda: [a.filter(list(range(15))) for a in c], c)
    steps(c, 15, 6, f"B15 #{rnd}")
    op(f"extend->16 #{rnd}", lambda: [a.extend(b) for a, b in zip(c, one[rnd])], c)
    steps(c, 16, 6, f"B16 #{rnd}")
op("filter->14", lambda: [a.filter(list(range(14))) for a in c], c)
steps(c, 14, 6, "B14")
# the same sequence of shapes again, with nothing new: are graphs for seen shapes cheap?
op("filter->13", lambda: [a.filter(list(range(13))) for a in c], c)
steps(c, 13, 6, "B13")
op("extend->14", lambda: [a.extend(b) for a, b in zip(c, one[2])], c)
steps(c, 14, 6, "B14 again")
json.dump(res, open(out, "w"), indent=1)
