"""Summarize an engine step trace (devrun/trace/sitecustomize.py): where the wall time went."""
import json
import sys
from collections import defaultdict

for path in sys.argv[1:]:
    recs = [json.loads(x) for x in open(path)]
    if not recs:
        continue
    span = recs[-1]["t"] + recs[-1]["dt"] - recs[0]["t"]
    busy = sum(r["dt"] for r in recs)
    cls = defaultdict(lambda: [0, 0.0, 0])
    keys = defaultdict(float)
    for r in recs:
        k = ("solo" if r.get("is_solo") or r.get("solo_n") else
             "prefill" if r.get("chunk_tok") else "decode" if r.get("decode_n") else "other")
        if k == "prefill":
            w = r["chunk_tok"]
            k += "<=256" if w <= 256 else "<=1024" if w <= 1024 else ">1024"
        c = cls[k]
        c[0] += 1
        c[1] += r["dt"]
        c[2] += r.get("chunk_tok", 0)
        for key, v in r.items():
            if isinstance(v, float) and key not in ("t", "dt"):
                keys[key] += v
    gaps = [b["t"] - (a["t"] + a["dt"]) for a, b in zip(recs, recs[1:])]
    print(f"== {path}: {len(recs)} steps, span {span:.2f} s, in steps {busy:.2f} s, "
          f"gaps {sum(gaps):.2f} s (gaps >50ms: {sum(g for g in gaps if g > .05):.2f} s)")
    for k, (n, t, tok) in sorted(cls.items()):
        print(f"  {k:14s} n={n:5d} total={t:7.2f}s mean={1e3 * t / n:7.2f}ms tok={tok}")
    print("  by function (s): " + ", ".join(f"{k}={v:.2f}" for k, v in
                                          sorted(keys.items(), key=lambda kv: -kv[1])))
    dec = sorted(r["dt"] for r in recs if r.get("decode_n") and not r.get("chunk_tok"))
    if dec:
        q = lambda p: 1e3 * dec[min(len(dec) - 1, int(p * len(dec)))]
        print(f"  decode-only step ms: p10={q(.1):.2f} p50={q(.5):.2f} p90={q(.9):.2f} "
              f"p99={q(.99):.2f} max={1e3 * dec[-1]:.1f}")
    slow = sorted(recs, key=lambda r: -r["dt"])[:8]
    for r in slow:
        print("  slow:", {k: v for k, v in r.items() if not k.endswith("_n") and k != "t"})
