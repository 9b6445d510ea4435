import time, random, sys
import appliance
import mlx.core as mx
from appliance.oracle import load, model_path
from mlx_lm.models.cache import BatchKVCache
import mlx_lm.models.base as base
model, tok = load(model_path("tiny"), "float32")
B, P = int(sys.argv[1]), int(sys.argv[2])
def bench(cache, x, n=20):
    mx.eval(model(x, cache=cache))
    t = time.perf_counter()
    for _ in range(n):
        y = model(x, cache=cache); mx.eval(y, [c.state for c in cache])
    return (time.perf_counter() - t) / n * 1000
cache = [BatchKVCache([0] * B) for _ in model.layers]
prompt = mx.array([[random.randrange(10, 4000) for _ in range(P)] for _ in range(B)])
mx.eval(model(prompt, cache=cache))
x = mx.array([[5]] * B)
print("full", bench(cache, x))
orig = mx.fast.scaled_dot_product_attention
mx.fast.scaled_dot_product_attention = lambda q, k, v, scale, mask=None, sinks=None: q
print("no sdpa", bench(cache, x))
mx.fast.scaled_dot_product_attention = orig
# mask cost
from mlx_lm.models import qwen3
c0 = cache[0]
def mk():
    return c0.make_mask(1, return_array=True) if hasattr(c0, "make_mask") else None
import inspect
print(inspect.signature(c0.make_mask))
def t(f, n=50):
    mx.eval(f())
    s = time.perf_counter()
    for _ in range(n): mx.eval(f())
    return (time.perf_counter() - s) / n * 1000
q = mx.random.normal((B, 4, 1, 64))
att = model.layers[0].self_attn
print("rope arr offset x12", 12 * t(lambda: att.rope(q, offset=c0.offset)))
print("rope int offset x12", 12 * t(lambda: att.rope(q, offset=1500)))
print("mask", t(lambda: c0.make_mask(1, return_array=True)))
h = mx.random.normal((B, 1, 256))
print("mlp x6", 6 * t(lambda: model.layers[0].mlp(h)))
print("lm head", t(lambda: model.model.embed_tokens.as_linear(h)))
print("qkv proj x6", 6 * t(lambda: [att.q_proj(h), att.k_proj(h), att.v_proj(h), att.o_proj(mx.random.normal((B,1,256)))]))
