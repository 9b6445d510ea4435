"""Summarise a py-spy raw profile (`--format raw`, gzipped) of an appliance run: per thread
root, then the engine loop's and the SSD writer's leaf lines. usage: profsum.py prof.txt.gz"""
import collections
import gzip
import re
import sys


def short(f: str) -> str:
    m = re.match(r"(.*?) \((.*?):(\d+)\)", f)
    return f"{m.group(1)} ({m.group(2).split('/')[-1]}:{m.group(3)})" if m else f


rows = []
for line in gzip.open(sys.argv[1], "rt"):
    stack, _, n = line.rstrip().rpartition(" ")
    rows.append((stack.split(";"), int(n)))
for root in ("Engine._loop", "SsdTier._write_loop"):
    sub = [(fr[[i for i, f in enumerate(fr) if f.startswith(root)][0]:], n)
           for fr, n in rows if any(f.startswith(root) for f in fr)]
    tot = sum(n for _, n in sub)
    print(f"\n{root}: {tot} samples")
    leaf = collections.Counter()
    for fr, n in sub:
        leaf[" < ".join(short(x) for x in fr[-1:-3:-1])] += n
    for k, v in leaf.most_common(14):
        print(f"{v:6d} {100 * v / tot:5.1f}%  {k}")
