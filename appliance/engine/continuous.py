"""batch=continuous: iteration-level scheduling over mlx-lm's BatchGenerator.

mlx-lm's BatchGenerator is the executor (the same batched arithmetic that is
our parity oracle): each `next()` runs one decode step for the running rows,
then one prefill chunk (`prefill_chunk` tokens) for rows being admitted, so a
running row stalls at most one chunk. This scheduler owns everything around
it: FIFO head-of-line admission under the KV byte budget, per-row samplers
(seeded rows with private random streams), cancellation between steps,
per-row failure containment, and the counters behind /stats.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from mlx_lm.generate import BatchGenerator

from appliance.engine.budget import Budget
from appliance.engine.sampling import make_processors, make_sampler
from appliance.engine.scheduler import Counters, RowState, finish, safe_deliver, token_event
from appliance.engine.types import FinishReason


@dataclass
class Row:
    handle: object
    state: RowState
    generated: int = 0


class ContinuousScheduler:
    def __init__(self, model, eos_ids: set[int], max_rows: int, prefill_chunk: int,
                 budget: Budget, stream=None):
        self.model, self.eos_ids = model, eos_ids
        self.max_rows, self.prefill_chunk = max_rows, prefill_chunk
        self.budget, self.stream = budget, stream
        self.counters = Counters()
        self._waiting: deque = deque()
        self._rows: dict[int, Row] = {}  # BatchGenerator uid -> row
        self._gen = self._new_generator()

    def _new_generator(self) -> BatchGenerator:
        return BatchGenerator(
            self.model, stop_tokens=[[t] for t in sorted(self.eos_ids)],
            completion_batch_size=self.max_rows, prefill_batch_size=min(8, self.max_rows),
            prefill_step_size=self.prefill_chunk, stream=self.stream)

    # -- the Scheduler interface ------------------------------------------------
    def add(self, handle) -> None:
        self.counters.submitted += 1
        self._waiting.append(handle)

    def has_work(self) -> bool:
        return bool(self._waiting) or bool(self._rows)

    def active_rows(self) -> int:
        return len(self._rows)

    def pending_rows(self) -> int:
        return len(self._waiting)

    def step(self) -> None:
        self._reap_cancelled()
        self._admit()
        if not self._rows:
            return
        try:
            with self._gen.stats() as st:
                _, responses = self._gen.next()
        except Exception as e:  # a failed forward fails the rows in flight, not the server
            self._fail_all(f"{type(e).__name__}: {e}")
            return
        self.counters.prefill_seconds += st.prompt_time
        self.counters.decode_seconds += st.decode_time
        for r in responses:
            self._on_token(r)
        self.counters.kv_bytes = self._gen.prompt_cache_nbytes

    def abort_all(self) -> None:
        for uid in list(self._rows):
            self._end(uid, FinishReason.CANCELLED)
        while self._waiting:
            self.counters.finished += 1
            finish(self._waiting.popleft(), FinishReason.CANCELLED, 0)

    def check_integrity(self) -> None:
        c = self.counters
        assert c.submitted - c.finished == len(self._waiting) + len(self._rows)
        assert len(self._rows) <= self.max_rows
        assert set(self.budget._held) == {r.handle.id for r in self._rows.values()}
        self.budget.check_integrity()

    # -- internals ---------------------------------------------------------------
    def _admit(self) -> None:
        """FIFO, head of line: the first waiting request goes first or nobody does."""
        while self._waiting and len(self._rows) < self.max_rows:
            h = self._waiting[0]
            if h.cancelled:
                self._waiting.popleft()
                self.counters.finished += 1
                finish(h, FinishReason.CANCELLED, 0)
                continue
            r = h.request
            if not self.budget.try_admit(h.id, len(r.prompt), r.max_tokens):
                return  # wait for running rows to free their KV
            self._waiting.popleft()
            try:
                (uid,) = self._gen.insert([r.prompt], max_tokens=[r.max_tokens],
                                          samplers=[make_sampler(r.sampling)],
                                          logits_processors=[make_processors(r.sampling)])
            except Exception as e:  # e.g. an empty prompt: this request only
                self.budget.release(h.id)
                self.counters.finished += 1
                finish(h, FinishReason.ERROR, 0, f"{type(e).__name__}: {e}")
                continue
            self._rows[uid] = Row(h, RowState.PREFILL)

    def _on_token(self, r) -> None:
        row = self._rows.get(r.uid)
        if row is None:
            return
        row.state = RowState.DECODE
        if r.finish_reason == "stop":  # stop_tokens are the EOS ids: never delivered
            return self._end(r.uid, FinishReason.STOP, removed=True)
        row.generated += 1
        self.counters.tokens_generated += 1
        if not safe_deliver(row.handle, token_event(r.token, r.logprobs,
                                                    row.handle.request.logprobs)):
            return self._end(r.uid, FinishReason.CANCELLED, removed=r.finish_reason is not None)
        if r.finish_reason == "length":
            self._end(r.uid, FinishReason.LENGTH, removed=True)

    def _reap_cancelled(self) -> None:
        for uid in [u for u, row in self._rows.items() if row.handle.cancelled]:
            self._end(uid, FinishReason.CANCELLED)

    def _end(self, uid: int, reason: FinishReason, error: str | None = None,
             removed: bool = False) -> None:
        """Finish one row and free its KV now (BatchGenerator already dropped finished rows)."""
        row = self._rows.pop(uid)
        if not removed:
            self._gen.remove([uid])
        self.budget.release(row.handle.id)
        self.counters.finished += 1
        finish(row.handle, reason, row.generated, error)

    def _fail_all(self, error: str) -> None:
        rows, self._rows = self._rows, {}
        for row in rows.values():
            self.budget.release(row.handle.id)
            self.counters.finished += 1
            finish(row.handle, FinishReason.ERROR, row.generated, error)
        self._gen.close()
        self._gen = self._new_generator()  # its state is unknown after a failed step
