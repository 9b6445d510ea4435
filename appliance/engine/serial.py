"""batch=serial: strictly one request at a time, the determinism pin.

A request's bits never depend on what else is in flight: each runs alone
through `runner.generate` (mlx-lm's generate_step arithmetic).
"""

from __future__ import annotations

import time
from collections import deque

from appliance.engine.runner import generate
from appliance.engine.scheduler import Counters, finish, safe_deliver, token_event
from appliance.engine.types import FinishReason


class SerialScheduler:
    def __init__(self, model, eos_ids: set[int], prefill_chunk: int, scheme=None):
        self.model, self.eos_ids, self.prefill_chunk = model, eos_ids, prefill_chunk
        self.scheme = scheme
        self.counters = Counters()
        self._waiting: deque = deque()
        self._current = None  # (handle, token iterator, tokens delivered)
        self._t0 = 0.0

    def add(self, handle) -> None:
        self.counters.submitted += 1
        self._waiting.append(handle)

    def has_work(self) -> bool:
        return bool(self._waiting) or self._current is not None

    def active_rows(self) -> int:
        return int(self._current is not None)

    def pending_rows(self) -> int:
        return len(self._waiting)

    def step(self) -> None:
        if self._current is None:
            if not self._waiting:
                return
            h = self._waiting.popleft()
            r = h.request
            self._current = [h, iter(generate(self.model, r.prompt, r.max_tokens, r.sampling,
                                              self.prefill_chunk, self.scheme)), 0]
            self._t0 = time.perf_counter()
        h, tokens, n = self._current
        t = time.perf_counter()
        try:
            tok, logprobs = next(tokens)
        except StopIteration:
            return self._end(FinishReason.LENGTH)
        except Exception as e:  # a failed forward fails this request, not the engine
            return self._end(FinishReason.ERROR, f"{type(e).__name__}: {e}")
        finally:
            if n == 0:
                self.counters.prefill_seconds += time.perf_counter() - self._t0
            else:
                self.counters.decode_seconds += time.perf_counter() - t
        if h.cancelled:
            return self._end(FinishReason.CANCELLED)
        if tok in self.eos_ids:
            return self._end(FinishReason.STOP)
        self._current[2] += 1
        self.counters.tokens_generated += 1
        if not safe_deliver(h, token_event(tok, logprobs, h.request.logprobs)):
            return self._end(FinishReason.CANCELLED)
        if self._current[2] == h.request.max_tokens:
            return self._end(FinishReason.LENGTH)

    def _end(self, reason: FinishReason, error: str | None = None) -> None:
        h, _, n = self._current
        self._current = None
        self.counters.finished += 1
        finish(h, reason, n, error)

    def fail_all(self, error: str) -> None:
        if self._current is not None:
            self._end(FinishReason.ERROR, error)

    def abort_all(self, reason: FinishReason = FinishReason.CANCELLED,
                  error: str | None = None) -> None:
        if self._current is not None:
            self._end(reason, error)
        while self._waiting:
            self.counters.finished += 1
            finish(self._waiting.popleft(), reason, 0, error)

    def close(self) -> None:
        pass

    def check_integrity(self) -> None:
        c = self.counters
        assert c.submitted - c.finished == len(self._waiting) + self.active_rows()
        assert self._current is None or self._current[2] <= self._current[0].request.max_tokens
