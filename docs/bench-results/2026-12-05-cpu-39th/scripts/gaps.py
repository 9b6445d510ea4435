# For candidate prompt windows of the kv.start draft test: the plain run's smallest top-2 gap
# per row (TurboQuant on tiny-gemma3), and (with PYTHONPATH at a checkout without 0531f78's
# fix) whether draft runs part.
import sys, itertools
sys.path.insert(0, "/work/main/tests")
import appliance  # noqa
from appliance import oracle
from appliance.engine import GenerationRequest
from appliance.engine.kv import Scheme
from appliance.engine.kv.turboquant import TurboCodec
from appliance.engine.speculate import Control
from harness import Collector, drive
from test_speculation import Scripted, scheduler

model, tok = oracle.load(oracle.model_path("tiny-gemma3"), "float32")
ids = list(tok.encode(oracle.BATCH_TEXT))
mode = sys.argv[1]
cands = [tuple(map(int, c.split(","))) for c in sys.argv[2:]]
for ao, bo in cands:
    p = {"a": ids[ao:ao + 30], "b": ids[bo:bo + 9]}
    def go(draft, start, lp=None):
        rows = {r: Collector(GenerationRequest(p[r], 30, logprobs=lp)) for r in p}
        s = scheduler(model, tok, 2, draft, scheme=Scheme(TurboCodec(16, 4, 4), (1, 3), start))
        drive(s, [(0, "insert", "a"), (0, "insert", "b")], rows)
        return rows, s
    out = []
    for start in (31, 40, 54):
        rows, _ = go(None, start, 2)
        plain = {r: c.tokens for r, c in rows.items()}
        gaps = {}
        for r, c in rows.items():
            g = [(t.top[0][1] - t.top[1][1], i) for i, t in enumerate(e for e in c.events if hasattr(e, "top")) if t.top and len(t.top) > 1]
            gaps[r] = min(g)
        parts = []
        if mode == "part":
            for k in (1, 2, 4):
                rows2, s = go((Scripted(p, plain), Control(k, adaptive=False)), start)
                spec = {r: c.tokens for r, c in rows2.items()}
                parts.append({r: next((i for i, (x, y) in enumerate(zip(spec[r], plain[r])) if x != y), None) for r in p})
        out.append((start, {r: (round(g, 5), i) for r, (g, i) in gaps.items()}, parts))
    print((ao, bo), out, flush=True)
