"""21st session: a step trace's steps by what came before them (a row left, a prefill chunk
ran, ...), as medians over the steady step, and the fine tracer's parts of each (ms medians).
usage: trace_categories.py TRACE.jsonl[.gz] ..."""
import gzip
import json
import statistics as st
import sys

PARTS = ["r_first_async", "r_async_eval", "r_eval", "r_cpu", "extract", "filter", "extend",
         "start", "mat", "store", "prefill"]

for f in sys.argv[1:]:
    recs = [json.loads(x) for x in (gzip.open(f, "rt") if f.endswith(".gz") else open(f))]
    i0 = max(i for i, r in enumerate(recs) if r["dt"] > 1.0 and not r.get("is_solo")) + 1
    recs = recs[i0:]  # the measured part: after the untimed warm-up's long steps
    cats: dict = {}
    for i, r in enumerate(recs[2:], 2):
        p, pp = recs[i - 1], recs[i - 2]
        c = ("solo" if r.get("is_solo") else "prefill" if r.get("chunk_tok")
             else "after-prefill" if p.get("chunk_tok") else "leave" if r["rows"] < p["rows"]
             else "after-leave" if p["rows"] < pp["rows"]
             else "steady" if r["rows"] == p["rows"] == pp["rows"] else "other")
        cats.setdefault(c, []).append(r)
    s = st.median(r["dt"] for r in cats["steady"])
    excess = sum(r["dt"] - s for k, v in cats.items() if k != "solo" for r in v)
    print(f"== {f}: steady step {1e3 * s:.1f} ms; excess over steady {excess:.2f} s "
          f"({excess / s:.0f} steady steps)")
    for k, v in sorted(cats.items()):
        parts = " ".join(f"{p}={1e3 * st.median(r.get(p, 0) for r in v):.1f}"
                         for p in PARTS if any(p in r for r in v))
        print(f"  {k:13s} n={len(v):4d} median {st.median(r['dt'] for r in v) / s:.2f}x "
              f"sum {sum(r['dt'] for r in v):.2f} s  {parts}")
