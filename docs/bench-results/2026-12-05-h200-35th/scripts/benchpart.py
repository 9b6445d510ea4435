"""The 8B tick trace's measured part only (from the bench's first agent request, `start`
seconds into the trace; the server's warm-up and the bench's warm-up request come before):
time by event kind, decode steps by rows, and joins by what they did to the batch size."""
import collections
import gzip
import json
import statistics as st
import sys

ev = sorted((json.loads(x) for x in gzip.open(sys.argv[1], "rt")), key=lambda e: e["at"])
ev = [e for e in ev if e["at"] >= float(sys.argv[2])]
tot = collections.defaultdict(lambda: [0, 0.0])
for e in ev:
    tot[e["kind"]][0] += 1
    tot[e["kind"]][1] += e["s"]
print(f"span {ev[0]['at']:.2f}-{ev[-1]['at']:.2f} s")
for k, (n, s) in sorted(tot.items(), key=lambda x: -x[1][1]):
    print(f"  {k:10s} {n:4d} x {s:7.3f} s  mean {s / n * 1000:6.1f} ms")
by = collections.defaultdict(list)
for e in ev:
    if e["kind"] == "decode":
        by[e["rows"]].append(e["s"])
print("decode steps by rows: count, seconds, median ms")
for k, v in sorted(by.items()):
    print(f"  {k:2d} {len(v):4d} {sum(v):6.3f} {st.median(v) * 1000:6.1f}")
med = {k: st.median(v) for k, v in by.items()}
kinds, excess, cost = collections.Counter(), collections.defaultdict(float), collections.defaultdict(list)
rows, pend = 0, None
for e in ev:
    if e["kind"] == "decode":
        if pend is not None:
            k = "same" if e["rows"] == pend[0] else "grow" if e["rows"] > pend[0] else "shrink"
            kinds[k] += 1
            excess[k] += e["s"] - med[e["rows"]]
            cost[k].append(pend[1])
            pend = None
        rows = e["rows"]
    elif e["kind"] == "join":
        pend = (rows, e["s"])
print("joins by the batch size after them: count, join seconds (median ms), next step's excess")
for k in kinds:
    print(f"  {k:6s} {kinds[k]:3d} {sum(cost[k]):6.3f} ({st.median(cost[k]) * 1000:.1f}) "
          f"{excess[k]:6.3f}")
