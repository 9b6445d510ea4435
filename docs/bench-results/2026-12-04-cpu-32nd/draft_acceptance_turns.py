"""Draft acceptance over multi-turn conversations with a RAM prefix cache: each turn's
prompt = the last prompt + its reply + held-out code; speculating every step (adaptive off)."""
import sys
sys.path.insert(0, "tests")
import appliance  # noqa (before mlx)
from conftest import resolve_overrides
from harness import Collector, drive
from appliance.bench import spec
from appliance.bench.prompts import load_tokenizer, model_dir, heldout_tokens
from appliance.engine import runner
from appliance.engine.types import GenerationRequest, SamplingParams
from appliance.engine.prefix_cache import PrefixCache, RamTier
from appliance.engine.speculate import Control

d = sys.argv[1]
plan = resolve_overrides([f"draft={d}", "draft.adaptive=false"])
path = model_dir(plan)
tok = load_tokenizer(path)
model, _ = runner.load(str(path), plan.model.dtype, dequantize=plan.model.dequantized)
s = spec._scheduler(model, tok, plan, 1, plan.draft)
s.prefix = PrefixCache(ram=RamTier(1 << 32)); s._batch.keep_finished = True
s.control = s._batch.control = Control(plan.draft.k, adaptive=False)
code = heldout_tokens(tok, 6000)
acc = []
for conv in range(3):
    base = code[conv * 1500: conv * 1500 + 600]
    prompt = base
    for turn in range(4):
        c = Collector(GenerationRequest(prompt, 48, SamplingParams(temperature=0.0)))
        drive(s, [(0, "insert", "r")], {"r": c})
        f = c.finished
        acc.append((conv, turn, f.cached_tokens, f.accepted_prediction_tokens, f.rejected_prediction_tokens))
        prompt = prompt + c.tokens + code[conv * 1500 + 600 + turn * 200: conv * 1500 + 600 + turn * 200 + 200]
for a in acc: print(a)
t1 = [a for a in acc if a[1] > 0]
print("later turns accepted/proposed", sum(a[3] for a in t1), sum(a[3] + a[4] for a in t1))
