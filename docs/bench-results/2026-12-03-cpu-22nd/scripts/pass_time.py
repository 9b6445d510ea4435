import appliance, time, sys
import mlx.core as mx
from appliance import oracle
from appliance.engine.kv import cores
from mlx_lm.models.cache import make_prompt_cache
from appliance.models import materialize
import glob
path = sys.argv[1]
model, tok = oracle.load(path, "float32")
args = model.args
print({k: getattr(args, k, None) for k in ("num_hidden_layers","hidden_size","num_attention_heads","num_key_value_heads","head_dim")})
def run(n_cached, n_new, mode):
    cores.reset()
    real = cores.compiled_softmax
    if mode == "mlx-split":
        cores.compiled_softmax = lambda: False
    if mode != "mlx":
        cores.use(1 if mode == "one" else 2)
    cores.compiled_softmax = real
    cache = make_prompt_cache(model)
    x = mx.random.randint(0, 4000, (1, n_cached))
    model(x, cache=cache); mx.eval([c.state for c in cache])
    y = mx.random.randint(0, 4000, (1, n_new))
    ts = []
    for _ in range(3):
        for c in cache: c.offset = n_cached  # rewind
        t = time.perf_counter(); out = model(y, cache=cache); mx.eval(out); ts.append(time.perf_counter() - t)
    cores.reset()
    return min(ts) * 1e3
for mode in ["mlx", "mlx-split", "one", "split"]:
    print(mode, "512 over 2048: %.0f ms" % run(2048, 512, mode), " 1 over 2048 (B=1): %.1f ms" % run(2048, 1, mode))
