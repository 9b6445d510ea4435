"""Attention on the CPU backend: over several cores (`batch.attention_threads`), with its
softmax compiled.

MLX's CPU backend runs each op on its stream's one thread; only BLAS calls use every core.
A decode step over long contexts is mostly attention, whose softmax then runs on one core
while the others wait. Each stream has a thread of its own, so attention split by kv head
over n streams runs on n cores at once, with each head's arithmetic unchanged: the output
is bit-exact. Measured on a 2-core EPYC (embedded model, float32, 2 kv heads): a B=16 step
over 2.5k-token rows took 56-75 ms on one stream, 35 ms split over two.

What splits: single-token passes (a decode step) and passes of at least MIN_PREFILL tokens a
row (prefill chunks: a 512-token chunk over 2k keys took 815-860 ms a forward, 635-723 ms
split; with the vectorized softmax, paired medians 0.85-0.94x split for 256-512 tokens), of
at least MIN_SCORES scores each. In between, the score matmuls are multi-threaded BLAS GEMMs
too small to pay for two at once oversubscribing the cores (16 tokens over 2k keys: 30 ms a
forward, 43-55 ms split; 128 tokens: about even on the EPYC; on an Intel Xeon VM over 1.8k
keys, split against not: 64 tokens 1.22x, 96 0.95x, 128 0.91-0.93x, 160-192 0.90-0.93x,
224-256 0.86x, docs/benchmarks.md, 31st session); below MIN_SCORES the streams'
synchronisation costs more than it saves.

The softmax: MLX's CPU attention is its own ops (scores, mask, `softmax`, values), and its
softmax is 74% of a prefill pass over a 2k-token cache (docs/benchmarks.md, 17th session),
nearly all of it `exp` (a scalar loop of libm `fma` calls: appliance/_mlx_env.py). Where
MLX's JIT builds with FMA (`_mlx_env.JIT`), `attend` runs the same ops with the softmax
spelled out (the row's max, exp of the difference, its sum, times the sum's reciprocal, in
the order MLX's kernel takes) and the exp compiled: bit-equal to
`mx.fast.scaled_dot_product_attention` (tests/test_batch_parity.py), a 512-token chunk's
attention over 2.5k keys 53 against 98 ms (the front's `exp` vectorized; docs/benchmarks.md,
23rd session).

`use(n)` turns both on for the calling thread (the engine's, a bench's): the streams are
thread-local in MLX, and other threads (an oracle in the same process) keep the fused
call as it is.
"""

from __future__ import annotations

import functools
import threading
from contextlib import nullcontext

import mlx.core as mx

from appliance import _mlx_env

MIN_SCORES = 16384  # batch x query heads x query tokens x keys; break-even ~8k on the EPYC
MIN_PREFILL = 128  # query tokens a row (an agent turn's tail is often 128-255 tokens)
_local = threading.local()  # .streams: [None (the caller's stream), *extra], .pool
_fused = getattr(mx.fast.scaled_dot_product_attention, "__wrapped__",
                 mx.fast.scaled_dot_product_attention)


def use(n: int) -> None:
    """Split this thread's attention over n CPU streams (n <= 1: never split), and compile
    its softmax where MLX's JIT has FMA, on the CPU backend. A thread's streams are kept for
    its later calls (each is a thread of MLX's; a bench builds many schedulers on one
    thread)."""
    pool = _local.__dict__.setdefault("pool", [])
    while len(pool) < n - 1:
        pool.append(mx.new_stream(mx.cpu))
    _local.streams = [None, *pool[:n - 1]] if n > 1 else None
    _local.compiled = compiled_softmax()
    if _local.compiled:
        _build()
    if n > 1 or _local.compiled:
        mx.fast.scaled_dot_product_attention = _split


@functools.cache
def _build() -> None:
    """Compile the softmax's one kernel now, not in the first request: g++ took 0.67 s here
    the first time on a machine (MLX keeps the library for later processes)."""
    mx.eval(_exp(mx.zeros((1, 1, 2, 8)), _ZERO))


def reset() -> None:
    """This thread's attention back to MLX's own call (an oracle's thread in a test)."""
    _local.streams, _local.compiled = None, False


def compiled_softmax() -> bool:
    """Whether attention's softmax runs compiled here: the CPU backend, and MLX's JIT with
    FMA (`_mlx_env.JIT`)."""
    return _mlx_env.JIT is not None and mx.default_device() == mx.cpu


# exp(d - 0) is exp(d), bit for bit; the subtraction only makes MLX compile the kernel (a
# lone op is not compiled), and against a scalar it runs contiguous and reuses d's buffer.
_exp = mx.compile(lambda d, zero: mx.exp(d - zero), shapeless=True)
_ZERO = mx.array(0.0)


def attend(queries, keys, values, *, scale, mask=None, sinks=None, **kw):
    """MLX's CPU attention, op for op (float32), with the softmax's exp compiled."""
    if sinks is not None or kw or queries.dtype != mx.float32:
        return _fused(queries, keys, values, scale=scale, mask=mask, sinks=sinks, **kw)
    B, n_q, L, D = queries.shape
    n_kv, T = keys.shape[1], keys.shape[2]
    rep = n_q // n_kv
    q = mx.array(scale, queries.dtype) * queries
    if rep > 1:
        q = q.reshape(B, n_kv, rep, L, D)
        keys, values = mx.expand_dims(keys, 2), mx.expand_dims(values, 2)
    s = q @ mx.swapaxes(keys, -1, -2)
    if isinstance(mask, str):  # "causal": the queries are the last L of the T positions
        first = max(0, T - L)
        mask = mx.arange(first, first + L)[:, None] >= mx.arange(T)[None]
    if mask is not None:
        if rep > 1 and mask.ndim >= 3:
            mask = (mx.expand_dims(mask, -3) if mask.shape[-3] == 1
                    else mask.reshape(*mask.shape[:-3], n_kv, rep, *mask.shape[-2:]))
        s = (mx.where(mask, s, mx.array(mx.finfo(s.dtype).min, s.dtype))
             if mask.dtype == mx.bool_ else s + mask.astype(s.dtype))
    # Each op reuses its input's buffer, as MLX's softmax does in place: one score matrix
    # at a time (against three with broadcasting compiled kernels, which allocate anew).
    e = _exp(s - mx.max(s, axis=-1, keepdims=True), _ZERO)
    out = (e * (1 / mx.sum(e, axis=-1, keepdims=True))) @ values
    return out.reshape(B, n_q, L, D) if rep > 1 else out


def _one(queries, keys, values, **kw):
    """One (part of a) call, on this thread's choice of attention."""
    return (attend if getattr(_local, "compiled", False) else _fused)(queries, keys, values, **kw)


def _split(queries, keys, values, *, scale, mask=None, sinks=None, **kw):
    streams = getattr(_local, "streams", None)
    B, n_q, L, _ = queries.shape
    n_kv, T = keys.shape[1], keys.shape[2]
    n = min(len(streams), n_kv) if streams else 1
    if n < 2 or (L != 1 and L < MIN_PREFILL) or kw or B * n_q * L * T < MIN_SCORES:
        return _one(queries, keys, values, scale=scale, mask=mask, sinks=sinks, **kw)
    per_head = isinstance(mask, mx.array) and mask.ndim == 4 and mask.shape[1] == n_q
    group = n_q // n_kv
    parts = []
    for i, stream in enumerate(streams[:n]):
        a, b = i * n_kv // n, (i + 1) * n_kv // n
        qa, qb = a * group, b * group
        with mx.stream(stream) if stream is not None else nullcontext():
            parts.append(_one(queries[:, qa:qb], keys[:, a:b], values[:, a:b], scale=scale,
                              mask=mask[:, qa:qb] if per_head else mask,
                              sinks=None if sinks is None else sinks[qa:qb]))
    return mx.concatenate(parts, axis=1)


_split.__wrapped__ = _fused
