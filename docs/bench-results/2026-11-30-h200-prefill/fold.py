"""Aggregate py-spy raw (folded) stacks: the engine thread's samples by the innermost
appliance frame, and by the frame just under the scheduler's step."""
import collections
import re
import sys

path, key = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "_loop (appliance/engine/engine.py")
inner, under, total = collections.Counter(), collections.Counter(), 0
for line in open(path):
    stack, _, n = line.rstrip().rpartition(" ")
    if key not in stack:
        continue
    n = int(n)
    total += n
    frames = stack.split(";")
    app = [f for f in frames if "appliance/" in f]
    inner[re.sub(r":\d+\)", ")", app[-1]) if app else "?"] += n
    step = r"(ContinuousScheduler\.)?_step \(appliance/engine/continuous"
    i = next((k for k, f in enumerate(frames) if re.match(step, f)), None)
    if i is not None:
        chain = [re.sub(r" \(.*", "", f) for f in frames[i + 1:i + 4] if "appliance/" in f]
        under[" > ".join(chain) or "(step itself)"] += n
    else:
        under["(outside step) " + re.sub(r" \(.*", "", app[-1]) if app else "?"] += n
print(f"engine thread samples: {total}")
for title, c in (("innermost appliance frame", inner), ("under ContinuousScheduler.step", under)):
    print(f"\n{title}:")
    for k, v in c.most_common(18):
        print(f"{v:6d} {100 * v / max(1, total):5.1f}%  {k}")
