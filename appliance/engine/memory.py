"""Memory pressure: MLX's limits from the plan, what MLX reports, and rows that survive a
failed allocation.

The plan's ceiling (appliance/plan/derive.py, docs/memory.md) counts every part MLX holds;
the engine hands it to MLX as its memory limit (MLX frees its buffer cache before going
past it) and caps the buffer cache at the plan's share. If an allocation fails anyway (a
fragmented device pool, another process), the scheduler frees what can be rebuilt (the
RAM tier, MLX's buffer cache) and requeues the rows of the failed step as `Resumed`
requests: each continues from the tokens it already streamed, so its client never sees
the failure.
"""

from __future__ import annotations

import dataclasses

from appliance.engine.types import Finished

# What MLX's allocators raise when memory runs out: CUDA (cudaMalloc*: "out of memory"),
# Metal ("[metal::malloc]", "Insufficient Memory"), the CPU allocator (std::bad_alloc).
_SIGNS = ("out of memory", "malloc", "insufficient memory", "bad_alloc",
          "failed to allocate", "outofmemory")


# How a request that kept failing to allocate ends (the API answers 503 + Retry-After).
OUT_OF_MEMORY = "out of memory: the request could not be served at this load; retry"


def is_allocation_failure(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or (
        isinstance(e, RuntimeError) and any(s in str(e).lower() for s in _SIGNS))


def set_limits(memory_limit: int | None, cache_limit: int | None) -> None:
    """MLX's memory limit (it frees cached buffers before passing it) and buffer-cache cap."""
    import mlx.core as mx

    if memory_limit:
        mx.set_memory_limit(int(memory_limit))
    if cache_limit is not None:
        mx.set_cache_limit(int(cache_limit))


def report() -> dict:
    """What MLX holds now: arrays alive, freed buffers kept for reuse, the peak, the limit."""
    import mlx.core as mx

    return {"active_bytes": mx.get_active_memory(), "cache_bytes": mx.get_cache_memory(),
            "peak_bytes": mx.get_peak_memory(), "limit_bytes": mx.get_memory_limit()}


class Resumed:
    """A request requeued after a failed allocation: its prompt now ends with the tokens
    already delivered, and it may generate only what is left. Events go to the original
    handle; Finished is reported as for the original request."""

    def __init__(self, handle, emitted: list[int]):
        base = handle.original if isinstance(handle, Resumed) else handle
        self.original = base
        self.prior = list(handle.prior) + list(emitted) if isinstance(handle, Resumed) \
            else list(emitted)
        self.retries = (handle.retries + 1) if isinstance(handle, Resumed) else 1
        r = base.request
        self.request = dataclasses.replace(r, prompt=list(r.prompt) + self.prior,
                                           max_tokens=r.max_tokens - len(self.prior))
        self.id, self.submitted_at = base.id, base.submitted_at

    @property
    def cancelled(self) -> bool:
        return self.original.cancelled

    def cancel(self) -> None:
        self.original.cancel()

    def deliver(self, event) -> None:
        if isinstance(event, Finished):
            n = len(self.original.request.prompt)
            event = dataclasses.replace(event, prompt_tokens=n,
                                        completion_tokens=event.completion_tokens
                                        + len(self.prior),
                                        cached_tokens=min(event.cached_tokens, n))
        self.original.deliver(event)
