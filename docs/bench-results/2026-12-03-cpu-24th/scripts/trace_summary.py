# usage: python trace_summary.py <trace.jsonl> <bench.json>: the timed run (its last wall_s), by kind
import json, statistics as st, sys
from collections import defaultdict
ev=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
wall=json.load(open(sys.argv[2]))['summary']['wall_s']
end=max(e['t']+e['dt'] for e in ev)
run=[e for e in ev if e['t']>=end-wall-0.05]
span=end-run[0]['t']
print("wall", wall, "events", len(run), "span", round(span,2))
for k in 'dpj':
    x=[e for e in run if e['k']==k]
    print(k, len(x), "sum", round(sum(e['dt'] for e in x),2), "median ms", round(1000*st.median([e['dt'] for e in x]),1) if x else None)
busy=sum(e['dt'] for e in run)
print("busy", round(busy,2), "idle", round(span-busy,2))
d=[e for e in run if e['k']=='d']
g=defaultdict(list)
for e in d: g[(e['B'], (e['T']//512)*512)].append(e['dt'])
for k in sorted(g): print("decode B,T", k, len(g[k]), "median ms", round(1000*st.median(g[k]),1), "sum", round(sum(g[k]),2))
p=[e for e in run if e['k']=='p' and e['n']]
print("prefill passes", len(p), "tokens", sum(sum(e['n']) for e in p), "sum s", round(sum(e['dt'] for e in p),2))
for e in p: print("  p", e['n'], e['idx'], round(1000*e['dt']))
tok=sum(e['B'] for e in d)
print("decode row-steps", tok)
# the step after a join, and a step whose batch shrank (a filter), against the steady steps
med = {}
for e in d:
    med.setdefault(e['B'], []).append(e['dt'])
steady = st.median([e['dt'] for e in d if e['B'] == max(x['B'] for x in d)])
after_join, after_leave, plain = [], [], []
prev = None
for e in run:
    if e['k'] == 'd':
        if prev is not None and prev['k'] == 'j':
            after_join.append(e['dt'])
        elif prev is not None and prev['k'] == 'd' and e['B'] < prev['B']:
            after_leave.append(e['dt'])
        else:
            plain.append(e['dt'])
    if not (e['k'] == 'p' and not e['n']):
        prev = e
pm = st.median(plain)
print(f"steady step {1000*pm:.1f} ms; after a join: {len(after_join)} steps, median {1000*st.median(after_join):.1f} ms, extra {sum(x-pm for x in after_join):.2f} s; "
      f"a shrunk batch: {len(after_leave)} steps, median {1000*st.median(after_leave):.1f} ms, extra {sum(x-pm for x in after_leave):.2f} s")
