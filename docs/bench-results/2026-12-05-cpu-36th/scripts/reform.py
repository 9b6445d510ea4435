"""devrun only (36th session, for a device session): what a decode step costs after the batch
changes, by kind of change, on the plan's model. The 35th's 8B trace: the first steps at a
new batch size took 30-76 ms against 21 (0.9 s of excess in a 17.5 s run, most during the
ramp), but a join that re-forms the batch changes both its size and its buffers. Here,
from a steady batch of ROWS rows (finished rows held, as on CUDA):
  reuse: a short row joins into a held row's slot in place (same size, same buffers);
  same:  a row longer than the cursor joins: held rows filtered out, the row extended in
         (same size, new buffers);
  grow:  one row fewer, steady, then a short row joins by extend (new size, new buffers).
Each kind REPS times, alternating; prints the decode steps after the join against the
steady median. usage: python devrun/reform.py [overrides...] (ROWS, REPS, CTX env)."""
import os
import statistics
import sys
import time

sys.path.insert(0, "tests")
import appliance  # noqa: F401,E402  (before mlx)
import mlx.core as mx  # noqa: E402
from conftest import resolve_overrides  # noqa: E402

from appliance.bench.prompts import model_dir  # noqa: E402
from appliance.engine import runner  # noqa: E402
from appliance.engine.kv import Scheme  # noqa: E402
from appliance.engine.step import BatchStep  # noqa: E402

ROWS, REPS, CTX = (int(os.environ.get(k, v)) for k, v in
                   (("ROWS", 16), ("REPS", 4), ("CTX", 1500)))
plan = resolve_overrides(sys.argv[1:])
model, _ = runner.load(str(model_dir(plan)), plan.model.dtype,
                       dequantize=plan.model.dequantized)
greedy = lambda x: mx.argmax(x, axis=-1)  # noqa: E731
step = BatchStep(model, set(), ROWS + 1, plan.batch.prefill_chunk, scheme=Scheme())
step.hold = True  # finished rows stay (CUDA's HOLD), here on every backend
times: list[tuple[int, float]] = []  # (rows, seconds) of every decode step
inner = step._decode_step


def timed():
    t = time.perf_counter()
    out = inner()
    times.append((len(step._decode), time.perf_counter() - t))
    return out


step._decode_step = timed
placed: list[int] = []  # rows each join placed into held slots (`_Decoding.reuse`)
reuse = step._decode.reuse


def counted(other):
    gone, where = reuse(other)
    placed.append(len(where))
    return gone, where


step._decode.reuse = counted
seed = [0]


def prompt(n: int) -> list[int]:
    seed[0] += 1
    return [(seed[0] * 131 + j * 7) % 1000 + 3 for j in range(n)]


def until_joined(n: int) -> None:
    while step._decode.live < n:
        step.tick()


def steady(k: int) -> list[float]:
    start = len(times)
    for _ in range(k):
        step.tick()
    return [s for _, s in times[start:]]


for _ in range(ROWS):
    step.insert([prompt(CTX)], 10**6, greedy)
until_joined(ROWS)
base = steady(30)
print(f"steady at {ROWS} rows: median {statistics.median(base) * 1e3:.1f} ms", flush=True)
after: dict[str, list[list[float]]] = {"reuse": [], "same": [], "grow": []}
for rep in range(REPS):
    for kind in after:
        d = step._decode
        live = [i for i, u in enumerate(d.uids) if u is not None]
        d.retire(live[0])
        if kind == "grow":
            step.drop_retired()
            steady(12)
        cursor = d.layers[0]._idx
        n = cursor + 64 if kind == "same" else 32
        step.insert([prompt(n)], 10**6, greedy)
        start = len(times)
        until_joined(ROWS)
        sizes = {r for r, _ in times[start:]}
        after[kind].append([s for _, s in times[len(times) - 1:]] + steady(6))
        print(f"rep {rep} {kind:5s} sizes during join {sorted(sizes)}, in place {placed[-1]},"
              f" now {len(step._decode)}"
              f" rows: next steps " + " ".join(f"{s * 1e3:.1f}" for s in after[kind][-1]),
              flush=True)
        base += steady(20)[10:]
med = statistics.median(base)
print(f"steady median {med * 1e3:.1f} ms")
for kind, runs in after.items():
    excess = [sum(max(0.0, s - med) for s in r) for r in runs]
    print(f"{kind:5s}: excess over the steady median in the steps after the join: "
          + " ".join(f"{e * 1e3:.0f}" for e in excess) + " ms")
