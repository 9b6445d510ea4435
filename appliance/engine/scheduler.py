"""The scheduler interface the engine thread drives, and what every scheduler shares.

A scheduler is single-threaded: the engine thread calls `add` for new
requests and `step` in a loop while `has_work()`. Events reach submitters
through `RequestHandle.deliver`; a handle whose delivery fails (its event
loop is gone) is evicted alone, its siblings go on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import mlx.core as mx

from appliance.engine.sampling import top_logprobs
from appliance.engine.types import Finished, FinishReason, Token

if TYPE_CHECKING:
    from appliance.engine.engine import RequestHandle


class RowState(enum.Enum):
    WAITING = "waiting"  # queued, no KV yet
    PREFILL = "prefill"  # admitted, prompt being processed
    DECODE = "decode"  # generating


@dataclass
class Row:
    """A request a scheduler runs, and what it has emitted."""

    handle: object
    state: RowState
    generated: int = 0
    cached: int = 0  # prompt tokens that came from the prefix cache
    accepted: int = 0  # draft tokens accepted (speculative decoding)
    rejected: int = 0  # draft tokens proposed and rejected
    emitted: list[int] = field(default_factory=list)  # delivered tokens (to resume the row)
    trusted: frozenset = frozenset()  # prefix entries its KV holds bit for bit (RamTier.insert)


@dataclass
class Counters:
    """Run-time measurements of one scheduler (the plan stays immutable)."""

    submitted: int = 0
    finished: int = 0
    tokens_generated: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    kv_bytes: int = 0  # KV held by live rows, refreshed every step
    draft_method: str | None = None  # speculative decoding: lookup | model | mtp
    draft_proposed: int = 0  # draft tokens proposed by rows that finished
    draft_accepted: int = 0
    warmup_seconds: float = 0.0  # the start-up burst before serving (server.warmup)


class Scheduler(Protocol):
    counters: Counters

    def add(self, handle: RequestHandle) -> None: ...
    def step(self) -> None: ...
    def has_work(self) -> bool: ...
    def active_rows(self) -> int: ...
    def pending_rows(self) -> int: ...
    def abort_all(self, reason: FinishReason = ..., error: str | None = None) -> None: ...
    def fail_all(self, error: str) -> None: ...  # end the rows in flight with an error
    def close(self) -> None: ...
    def check_integrity(self) -> None: ...


def token_event(tok: int, logprobs: mx.array, want: int | None) -> Token:
    """The Token event, with log-probabilities only when the request asked for them."""
    if want is None:
        return Token(tok)
    return Token(tok, float(logprobs[tok].item()), tuple(top_logprobs(logprobs, want)))


def safe_deliver(handle: RequestHandle, event) -> bool:
    """Deliver; False when the submitter is gone (the caller then evicts the row)."""
    try:
        handle.deliver(event)
        return True
    except Exception:  # closed loop, dead consumer: this row only
        handle.cancel()
        return False


def finish(handle: RequestHandle, reason: FinishReason, generated: int,
           error: str | None = None, cached: int = 0, accepted: int = 0,
           rejected: int = 0) -> None:
    safe_deliver(handle, Finished(reason, len(handle.request.prompt), generated, error, cached,
                                  accepted, rejected))
