"""20th session: a 16-row decode step with each row's logit bias applied row by row (the
old path) against one scatter for the batch (BiasTable); synchronous steps, median ms.
usage: probe_bias.py SHAPE BITS OUT"""
import json
import sys
import time

import appliance  # noqa: F401
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.utils import load_model

from appliance.engine.kv import native_cuda
from appliance.engine.sampling import BiasTable, LogitBias
from appliance.models import synthetic as s
from appliance.models.dense import dequantize

shape, bits, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model, _ = load_model(s.ensure(shape, "bfloat16", bits or None, 0))
if bits:
    dequantize(model, mx.bfloat16)
mx.eval(model.parameters())
native_cuda.install()
L, V = model.args.num_hidden_layers, min(120000, model.args.vocab_size)
B, T = 16, 2560
c = [BatchKVCache(left_padding=[(i * 97) % 512 for i in range(B)]) for _ in range(L)]
x = mx.random.randint(0, V, (B, T))
for i in range(0, T, 1024):
    model(x[:, i:i + 1024], cache=c)
    mx.eval([a.state for a in c])
procs = [(LogitBias({128001: -100.0, 128009: -100.0}),) for _ in range(B)]
table = BiasTable()


def per_row(logits):
    return mx.concatenate([p[0](None, logits[e:e + 1]) for e, p in enumerate(procs)])


def step(y, bias):
    logits = model(y, cache=c)[:, -1, :]
    if bias is not None:
        logits = bias(logits)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return mx.argmax(lp, axis=-1)[:, None]


res = {}
for name, bias in [("none", None), ("per_row", per_row),
                   ("table", lambda lg: table.add(lg, procs))] * 2:
    y = mx.random.randint(0, V, (B, 1))
    ts = []
    for _ in range(15):
        mx.synchronize()
        t = time.perf_counter()
        y = step(y, bias)
        mx.eval(y)
        ts.append(time.perf_counter() - t)
    res[name] = round(1e3 * sorted(ts[3:])[6], 2)
    print(name, res[name], flush=True)
json.dump(res, open(out, "w"))
