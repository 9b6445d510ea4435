"""Issue 13 item 9, CPU: the engine's steady B=8 decode step against the bare model's, over
~2.2-2.7k-token rows. usage: python steady.py <case> [steps]
cases: equal (8 rows of 2450, joined together), spread (2200..2700, together),
stagger (2200..2700, one joining every 12 steps, as a server's), bare<T> (mlx-lm KVCache)."""
import statistics
import sys
import time

sys.path.insert(0, "tests")
import appliance  # noqa: F401,E402
import mlx.core as mx  # noqa: E402
from conftest import resolve_overrides  # noqa: E402

from appliance.bench import spec  # noqa: E402
from appliance.bench.prompts import load_tokenizer, model_dir  # noqa: E402
from appliance.engine import runner  # noqa: E402
from appliance.engine.kv import cores  # noqa: E402
from appliance.engine.types import GenerationRequest, SamplingParams  # noqa: E402
from appliance.plan.draft import DraftPlan  # noqa: E402

case, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
plan = resolve_overrides(["+profile=agent-fleet"])
path = model_dir(plan)
tok = load_tokenizer(path)
model, _ = runner.load(str(path), plan.model.dtype, dequantize=plan.model.dequantized)
if case.startswith("bare"):
    from mlx_lm.models.cache import make_prompt_cache
    T = int(case[4:])
    cores.use(plan.batch.attention_threads)
    cache = make_prompt_cache(model)
    for c in cache:
        c.update_and_fetch(mx.random.normal((8, 2, T, 64)), mx.random.normal((8, 2, T, 64)))
    mx.eval([c.state for c in cache])
    y = mx.random.randint(0, 4000, (8, 1))
    ts = []
    for _ in range(steps):
        for c in cache:
            c.offset = T
        t = time.perf_counter()
        mx.eval(model(y, cache=cache))
        ts.append(time.perf_counter() - t)
    print(f"{case}: step ms median {1e3 * statistics.median(ts):.1f} min {1e3 * min(ts):.1f}")
    sys.exit()
sampling = SamplingParams(temperature=0.0, logit_bias={i: -100.0 for i in tok.eos_token_ids})
lens = [2450] * 8 if case == "equal" else [2200 + 500 * i // 7 for i in (3, 0, 6, 2, 7, 1, 5, 4)]
ps = spec.prompts(tok, "free", 8, 2700)
reqs = [GenerationRequest(p[:n], 400, sampling) for p, n in zip(ps, lens, strict=True)]
s = spec._scheduler(model, tok, plan, 8, DraftPlan(kind="none"))
spec._warm(s, [GenerationRequest(p[:64], 8, sampling) for p in ps])
rows = [spec._Row(r, i) for i, r in enumerate(reqs)]
ts = []
for i, r in enumerate(rows):
    s.add(r)
    if case == "stagger" or i == len(rows) - 1:
        while not all(x.times for x in rows[:i + 1]):
            s.step()
        for _ in range(12 if case == "stagger" else 0):
            s.step()
for _ in range(steps):
    t = time.perf_counter()
    s.step()
    ts.append(time.perf_counter() - t)
lay = s._batch._decode.layers[0]
print(f"{case}: step ms median {1e3 * statistics.median(ts):.1f} min {1e3 * min(ts):.1f}; "
      f"rows {len(s._batch._decode)}, buffer {lay.keys.shape}, cursor {lay._idx}, "
      f"left padding {lay.left_padding.tolist()}")
