"""devrun only (36th session, for a device session): does reading a small, already computed
array on the host wait for the work queued after it? On CUDA MLX moves a device buffer to
managed memory the first time the host reads it (cudaMallocManaged, a synchronous cudaMemcpy,
then cudaFree, which synchronizes the device: docs/benchmarks.md, the prefix bench's SSD
notes). The decode step reads its sampled tokens (`inputs.tolist()`) right after queueing the
next step, so such a read would wait for that step too: no pipelining. Arrays of at most 8
bytes come from MLX's managed small pool and need no move. Prints, for each way of reading,
how long the read took while ~W ms of matmuls were queued behind it."""
import os
import statistics
import time

import mlx.core as mx

N = int(os.environ.get("N", 4096))
a = mx.random.normal((N, N)).astype(mx.bfloat16)
mx.eval(a)


def queued_work(k: int = 40) -> mx.array:
    x = a
    for _ in range(k):
        x = (x @ a) * 1e-3
    return x


w = queued_work()
t = time.perf_counter()
mx.eval(w)
work_ms = (time.perf_counter() - t) * 1e3
print(f"the queued work alone: {work_ms:.1f} ms", flush=True)


def trial(make, read) -> float:
    s = make()
    mx.eval(s)  # ready before the work is queued
    w = queued_work()
    mx.async_eval(w)
    t = time.perf_counter()
    read(s)
    dt = (time.perf_counter() - t) * 1e3
    mx.eval(w)
    return dt


logits = mx.random.normal((16, 32000))
ways = {
    "16 tokens (64 B), tolist": (lambda: mx.argmax(logits, axis=-1), lambda s: s.tolist()),
    "16 tokens, read twice": (lambda: mx.argmax(logits, axis=-1),
                              lambda s: (s.tolist(), s.tolist())),
    "1 token (4 B), item": (lambda: mx.argmax(logits[:1], axis=-1), lambda s: s.tolist()),
    "16 tokens as 16 copies (4 B each)": (
        lambda: [mx.argmax(logits, axis=-1)[i] + 0 for i in range(16)],
        lambda s: [x.item() for x in s]),
    "16 tokens as 8 pairs (8 B each)": (
        lambda: [mx.argmax(logits, axis=-1)[i:i + 2] + 0 for i in range(0, 16, 2)],
        lambda s: [x.tolist() for x in s]),
}
for name, (make, read) in ways.items():
    for _ in range(2):
        trial(make, read)  # (warm)
    got = [trial(make, read) for _ in range(9)]
    print(f"{name:36s} read took median {statistics.median(got):7.2f} ms "
          f"(min {min(got):.2f}, max {max(got):.2f}) with {work_ms:.0f} ms queued", flush=True)
