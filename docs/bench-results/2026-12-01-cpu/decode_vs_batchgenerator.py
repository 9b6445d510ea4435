import sys, time
import appliance  # noqa
import mlx.core as mx
from appliance.oracle import load, model_path
from appliance.engine.step import BatchStep
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_sampler

B = int(sys.argv[1]) if len(sys.argv) > 1 else 8
P = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
N = 200
model, tok = load(model_path("tiny"), "float32")
import random
random.seed(0)
V = 1000
prompts = [[random.randrange(10, V) for _ in range(P)] for _ in range(B)]
bias = None
def run_ours():
    s = BatchStep(model, set(), B, 512, prefill_rows=B)
    samp = make_sampler(0.0)
    for p in prompts:
        s.insert([p], N, samp)
    # prefill
    t_dec = None; n = 0
    while True:
        pe, ev = s.tick()
        if ev and t_dec is None and len(s._decode) == B:
            t_dec = time.perf_counter(); n = 0
        elif t_dec is not None:
            n += len(ev)
        if not len(s):
            break
        if t_dec is not None and n >= B * (N - 20):
            break
    return n / (time.perf_counter() - t_dec)

def run_theirs():
    g = BatchGenerator(model, stop_tokens=[], completion_batch_size=B, prefill_batch_size=B,
                       prefill_step_size=512)
    g.insert(prompts, max_tokens=[N] * B)
    t_dec = None; n = 0
    while True:
        r = g.next()
        ev = r[1] if isinstance(r, tuple) else r
        if ev and t_dec is None:
            t_dec = time.perf_counter(); n = 0
        elif t_dec is not None:
            n += len(ev)
        if t_dec is not None and n >= B * (N - 20):
            break
    g.close()
    return n / (time.perf_counter() - t_dec)

for i in range(3):
    print("ours", round(run_ours(), 1), "theirs", round(run_theirs(), 1), flush=True)
