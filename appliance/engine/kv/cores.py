"""Attention over several CPU cores (`batch.attention_threads`).

MLX's CPU backend runs each op on its stream's one thread; only BLAS calls use every core.
A decode step over long contexts is mostly attention, whose softmax then runs on one core
while the others wait. Each stream has a thread of its own, so attention split by kv head
over n streams runs on n cores at once, with each head's arithmetic unchanged: the output
is bit-exact. Measured on a 2-core EPYC (embedded model, float32, 2 kv heads): a B=16 step
over 2.5k-token rows took 56-75 ms on one stream, 35 ms split over two.

What splits: single-token passes (a decode step) with at least MIN_SCORES scores, and
passes of at least MIN_PREFILL tokens a row (prefill chunks: a 512-token chunk over 2k
keys took 815-860 ms a forward, 635-723 ms split). In between, the score matmuls are
multi-threaded BLAS GEMMs too small to pay for two at once oversubscribing the cores
(16 tokens over 2k keys: 30 ms a forward, 43-55 ms split; 128 tokens: about even); below
MIN_SCORES the streams' synchronisation costs more than it saves.

`use(n)` turns it on for the calling thread (the engine's, a bench's): the streams are
thread-local in MLX, and other threads (an oracle in the same process) keep the fused
call as it is.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext

import mlx.core as mx

MIN_SCORES = 16384  # batch x query heads x keys; measured break-even ~8k on the EPYC
MIN_PREFILL = 256  # query tokens a row
_local = threading.local()  # .streams: [None (the caller's stream), *extra], .pool
_fused = getattr(mx.fast.scaled_dot_product_attention, "__wrapped__",
                 mx.fast.scaled_dot_product_attention)


def use(n: int) -> None:
    """Split this thread's attention over n CPU streams (n <= 1: never split). A thread's
    streams are kept for its later calls (each is a thread of MLX's; a bench builds many
    schedulers on one thread)."""
    pool = _local.__dict__.setdefault("pool", [])
    while len(pool) < n - 1:
        pool.append(mx.new_stream(mx.cpu))
    _local.streams = [None, *pool[:n - 1]] if n > 1 else None
    if n > 1:
        mx.fast.scaled_dot_product_attention = _split


def _split(queries, keys, values, *, scale, mask=None, sinks=None, **kw):
    streams = getattr(_local, "streams", None)
    B, n_q, L, _ = queries.shape
    n_kv, T = keys.shape[1], keys.shape[2]
    n = min(len(streams), n_kv) if streams else 1
    if n < 2 or (L != 1 and L < MIN_PREFILL) or kw or B * n_q * T < MIN_SCORES:
        return _fused(queries, keys, values, scale=scale, mask=mask, sinks=sinks, **kw)
    per_head = isinstance(mask, mx.array) and mask.ndim == 4 and mask.shape[1] == n_q
    group = n_q // n_kv
    parts = []
    for i, stream in enumerate(streams[:n]):
        a, b = i * n_kv // n, (i + 1) * n_kv // n
        qa, qb = a * group, b * group
        with mx.stream(stream) if stream is not None else nullcontext():
            parts.append(_fused(queries[:, qa:qb], keys[:, a:b], values[:, a:b], scale=scale,
                                mask=mask[:, qa:qb] if per_head else mask,
                                sinks=None if sinks is None else sinks[qa:qb]))
    return mx.concatenate(parts, axis=1)


_split.__wrapped__ = _fused
