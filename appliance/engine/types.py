"""What the engine accepts and emits: token ids, sampling settings, events."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """mlx-lm's sampler and logits-processor settings, one request's worth."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    # A constraint on the output (e.g. a JSON schema), compiled before submission. Any
    # object with make_processor() -> a stateful mlx-lm-style logits processor for one row,
    # called with the row's whole token history (which may shrink: it must follow rollbacks).
    constraint: Any = None


@dataclass(frozen=True)
class GenerationRequest:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    logprobs: int | None = None  # None: none; 0: the chosen token's; k: also the top k
    checkpoints: tuple[int, ...] = ()  # prompt offsets worth a prefix-cache entry (turn ends)


class Rejected(Exception):
    """The engine will not take this request; `status` is the HTTP status to answer."""

    def __init__(self, status: int, message: str, retry_after: int | None = None,
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after
        self.param, self.code = param, code


class FinishReason(str, enum.Enum):
    STOP = "stop"  # an end-of-sequence token
    LENGTH = "length"  # max_tokens reached
    CANCELLED = "cancelled"  # the client went away, or a stop sequence matched
    ERROR = "error"  # the forward pass failed


@dataclass(frozen=True)
class Token:
    """One generated token id (end-of-sequence tokens are never delivered)."""

    id: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] | None = None  # (id, logprob), best first


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache
    accepted_prediction_tokens: int = 0  # speculative decoding: draft tokens kept
    rejected_prediction_tokens: int = 0  # draft tokens proposed and rejected


Event = Token | Finished
