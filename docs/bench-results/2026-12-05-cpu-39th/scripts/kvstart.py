# Part 15b: the kv.start draft test's runs on CUDA, for three prompt sets: where each row
# parts from draft=none, and the plain run's smallest top-2 gap per row (its token index).
import sys
sys.path.insert(0, "tests")
import appliance  # noqa: F401
from appliance import oracle
from appliance.engine import GenerationRequest
from appliance.engine.kv import Scheme
from appliance.engine.kv.turboquant import TurboCodec
from appliance.engine.speculate import Control
from harness import Collector, drive
from test_speculation import Scripted, scheduler

model, tok = oracle.load(oracle.model_path("tiny-gemma3"), "float32")
ids = list(tok.encode(oracle.BATCH_TEXT))
for ao, bo in [(0, 40), (473, 513), (150, 190)]:
    p = {"a": ids[ao:ao + 30], "b": ids[bo:bo + 9]}

    def go(draft, start, lp=None):
        rows = {r: Collector(GenerationRequest(p[r], 30, logprobs=lp)) for r in p}
        s = scheduler(model, tok, 2, draft, scheme=Scheme(TurboCodec(16, 4, 4), (1, 3), start))
        drive(s, [(0, "insert", "a"), (0, "insert", "b")], rows)
        return rows

    for start in (31, 40, 54):
        rows = go(None, start, 2)
        plain = {r: c.tokens for r, c in rows.items()}
        gaps = {r: min((t.top[0][1] - t.top[1][1], i) for i, t in enumerate(
            e for e in c.events if getattr(e, "top", None))) for r, c in rows.items()}
        parts = []
        for k in (1, 2, 4):
            spec = {r: c.tokens for r, c in go((Scripted(p, plain), Control(k, adaptive=False)),
                                                start).items()}
            parts.append({r: next((i for i, (x, y) in enumerate(zip(spec[r], plain[r]))
                                   if x != y), None) for r in p})
        print((ao, bo), start, {r: (round(g, 5), i) for r, (g, i) in gaps.items()}, parts,
              flush=True)
