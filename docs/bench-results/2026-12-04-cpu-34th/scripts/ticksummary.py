"""Summary of a ticktrace (sitecustomize.py here): seconds by kind, and prefill passes by
tokens (count, total s, median ms, tokens/s). usage: python ticksummary.py <trace file>"""
import collections
import json
import statistics
import sys

ev = [json.loads(line) for line in open(sys.argv[1])]
tot = collections.defaultdict(lambda: [0, 0.0])
for e in ev:
    k = e["kind"] + (str(e.get("rows")) if e["kind"] == "decode" else "")
    tot[k][0] += 1
    tot[k][1] += e["s"]
span = ev[-1]["at"] - ev[0]["at"] if ev else 0
print(f"events {len(ev)}, span {span:.2f} s, peak active {max(e['active'] for e in ev)} MiB")
for k, (n, s) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
    print(f"  {k:10s} {n:5d} x  {s:7.3f} s  mean {1000 * s / n:7.2f} ms")
bins = collections.defaultdict(list)
for e in ev:
    if e["kind"] == "prefill":
        b = next(x for x in (64, 128, 256, 512, 1024, 2048, 1 << 30) if e["tokens"] <= x)
        bins[(b, e["rows"] > 1, e["grid"])].append(e)
print("prefill passes by tokens (<=), several rows?, grid?:")
for (b, multi, grid), es in sorted(bins.items()):
    s = sum(e["s"] for e in es)
    toks = sum(e["tokens"] for e in es)
    ctx = statistics.median(max(e["context"]) for e in es)
    print(f"  <={b:5d} multi={multi!s:5s} grid={grid!s:5s} {len(es):4d} passes {s:6.3f} s "
          f"median {1000 * statistics.median(e['s'] for e in es):6.1f} ms "
          f"{toks / s:8.0f} tok/s, median context {ctx:.0f}")
# The decode step right after a join against the others at the same rows: a join's re-formed
# batch (its KV merged into a new buffer, `FullLayout._merge`) is evaluated there, lazily
# (on this CPU: 30-90 ms more than a usual step at 2-8 rows, ~1.3 s of a 15.4 s run).
after, other = collections.defaultdict(list), collections.defaultdict(list)
prev = None
for e in ev:
    if e["kind"] in ("decode", "join", "prefill"):
        if e["kind"] == "decode":
            (after if prev == "join" else other)[e["rows"]].append(e["s"])
        prev = e["kind"]
extra = 0.0
print("decode steps right after a join, against the others (median ms):")
for r in sorted(after):
    if other[r]:
        m = statistics.median(other[r])
        extra += sum(s - m for s in after[r])
        print(f"  {r:3d} rows: {len(after[r]):3d} after a join {1000 * statistics.median(after[r]):7.1f}"
              f", {len(other[r]):4d} others {1000 * m:7.1f}")
print(f"  their excess over the others' medians: {extra:.2f} s")
