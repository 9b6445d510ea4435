"""Summarize PHASE_LOG files: per phase count / seconds; prefill chunk passes by whether
their (width, keys) shape was new. python devrun/phases.py LOG..."""
import json
import sys
from collections import defaultdict

for path in sys.argv[1:]:
    recs = [json.loads(x) for x in open(path)]
    if not recs:
        continue
    tot, cnt = defaultdict(float), defaultdict(int)
    for r in recs:
        tot[r["p"]] += r["s"]
        cnt[r["p"]] += 1
    print(path, "span %.1f s" % (max(r["t"] + r["s"] for r in recs) - min(r["t"] for r in recs)))
    for p in sorted(tot, key=lambda p: -tot[p]):
        print(f"  {p:16s} n={cnt[p]:6d} total={tot[p]:8.2f}s mean={1e3 * tot[p] / cnt[p]:7.1f}ms")
    seen, new, old = set(), [], []
    for r in recs:
        if r["p"].endswith("_prefill_chunk") and r["i"] and r["i"][0]:
            lengths, idx = r["i"]
            shape = (len(lengths), max(lengths), idx)
            (old if shape in seen else new).append(r["s"])
            seen.add(shape)
    for name, xs in (("new shape", new), ("seen shape", old)):
        if xs:
            xs.sort()
            print(f"  prefill {name}: n={len(xs)} total={sum(xs):.2f}s p50={1e3 * xs[len(xs) // 2]:.1f}ms"
                  f" p90={1e3 * xs[int(len(xs) * .9)]:.1f}ms")
    dec = defaultdict(list)
    for r in recs:
        if r["p"].endswith("_decode_step"):
            i = r["i"][0] if isinstance(r["i"], list) else r["i"]
            dec[i].append((r["s"], r.get("c", 0)))
    print("  decode by rows (n x wall/cpu median ms):",
          {k: f"{len(v)}x{1e3 * sorted(v)[len(v) // 2][0]:.1f}/{1e3 * sorted(x[1] for x in v)[len(v) // 2]:.1f}"
           for k, v in sorted(dec.items())})
    ev = defaultdict(list)
    for r in recs:
        if r["p"].endswith("_decode_step") and "e" in r and r["t"] > max(x["t"] for x in recs) - 16:
            i = r["i"][0] if isinstance(r["i"], list) else r["i"]
            ev[i // 4 * 4].append((r["s"], r["e"], r["a"], r["s"] - r["e"] - r["a"]))
    for k, v in sorted(ev.items()):
        med = [1e3 * sorted(x[j] for x in v)[len(v) // 2] for j in range(4)]
        print(f"  decode B{k}-{k + 3} n={len(v)} wall/eval/async/rest median ms: " + "/".join(f"{m:.1f}" for m in med))
    ctot = defaultdict(float)
    for r in recs:
        ctot[r["p"]] += r.get("c", 0)
    print("  cpu by phase:", {p: round(v, 2) for p, v in sorted(ctot.items(), key=lambda x: -x[1])[:6]})
    slow = [r["s"] for r in recs if r["p"].endswith("_prefill_chunk") and r["s"] > 0.04]
    print(f"  prefill passes > 40 ms: n={len(slow)} total={sum(slow):.2f}s")
    end = max(r["t"] + r["s"] for r in recs)
    for span in (16.0,):
        w = [r for r in recs if r["t"] > end - span]
        tot = defaultdict(float)
        for r in w:
            tot[r["p"]] += r["s"]
        print(f"  last {span:.0f} s:", {p: round(v, 2) for p, v in sorted(tot.items(), key=lambda x: -x[1])[:5]})
