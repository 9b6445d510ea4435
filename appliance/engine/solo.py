"""The solo row: a request that arrives to an idle engine runs unbatched (`runner.Decoder`,
generate_step's arithmetic, no batch padding or masks: as fast as mlx-lm's serial path).
When a second request can be admitted, the solo row hands its cache, history and sampler
to the batch and both continue batched. With a draft only where the control measured plain
steps faster at one row (`Control.alone`; then the batch's last row comes back here too,
`_take_back`) or the row is seeded: the solo path does not speculate, and its cache holds
the model's layers only (a drafter's start empty when the row joins a batch).

`SoloRow` is part of `ContinuousScheduler` (appliance/engine/continuous.py), kept apart so
that file reads in one sitting; it uses the scheduler's state and helpers.
"""

from __future__ import annotations

import logging
import time

from appliance.engine.memory import is_allocation_failure
from appliance.engine.runner import Decoder
from appliance.engine.scheduler import Row, RowState, finish
from appliance.engine.types import FinishReason

log = logging.getLogger(__name__)


class SoloRow:
    """The solo row's part of the continuous scheduler."""

    def _head_fits(self) -> bool:
        """Whether the first waiting request could be admitted next to the running rows."""
        if not self._waiting or self.active_rows() >= self.row_cap:
            return False
        r = self._waiting[0].request
        return self.budget.fits_now(len(r.prompt), r.max_tokens)

    def _start_solo(self) -> None:
        h = self._waiting[0]
        r = h.request
        if h.cancelled or not self.budget.try_admit(h.id, len(r.prompt), r.max_tokens):
            return self._admit()  # the usual path refuses or waits
        self._waiting.popleft()
        self._trim()
        t = time.perf_counter()
        try:
            cached, cache = self.prefix.lookup(r.prompt) if self.prefix is not None else (0, None)
            if cache is not None:  # (an SSD entry an older version wrote may hold a
                # drafter's layers after the model's)
                cache = cache[:self._batch.model_layers]
            h.cached_tokens = cached
            row = Row(h, RowState.DECODE, cached=cached,
                      trusted=self.prefix.hit_chain if cached else frozenset())
            decoder = Decoder(self.model, r.prompt, r.sampling, self.prefill_chunk, cache=cache,
                              cached=cached, checkpoints=r.checkpoints,
                              on_checkpoint=self._checkpointer(r, row) if self.prefix is not None
                              else None, scheme=self.scheme, eager=False)
        except Exception as e:  # e.g. an empty prompt: this request only
            self.budget.release(h.id)
            if is_allocation_failure(e):
                return self._out_of_memory(e, [Row(h, RowState.PREFILL)])
            log.error("a lone row could not start", exc_info=e)
            self.counters.finished += 1
            return finish(h, FinishReason.ERROR, 0, f"{type(e).__name__}: {e}")
        self.counters.prefill_seconds += time.perf_counter() - t
        self._solo = (row, decoder)

    def _solo_step(self) -> None:
        """One prefill chunk (a long prompt's cancel or a stop is seen between its chunks);
        once the prompt is in, one decode step."""
        row, d = self._solo
        max_tokens = row.handle.request.max_tokens
        t = time.perf_counter()
        try:
            if not d.prefilled:
                done = d.prefill()
                self.counters.prefill_seconds += time.perf_counter() - t
                if not done:
                    return
                t = time.perf_counter()
            if self.control is not None:
                self.control.alone_step()
            tok, logprobs = d.next(last=row.generated + 1 == max_tokens)
            self.counters.decode_seconds += time.perf_counter() - t
        except Exception as e:
            if is_allocation_failure(e):
                self._solo = None
                self.budget.release(row.handle.id)
                return self._out_of_memory(e, [row])
            log.exception("a lone row's step failed")
            return self._end_solo(FinishReason.ERROR, f"{type(e).__name__}: {e}")
        if tok in self.eos_ids:
            return self._end_solo(FinishReason.STOP)
        if not self._emit(row, tok, logprobs):
            return self._end_solo(FinishReason.CANCELLED)
        if row.generated == max_tokens:
            self._end_solo(FinishReason.LENGTH)

    def _hand_over(self) -> None:
        """Move the solo row into the batch: its pending token (already sampled)
        is emitted here, then fed as the row's one-token prompt over the solo cache."""
        row, d = self._solo
        self._solo = None
        remaining = row.handle.request.max_tokens - row.generated
        tok, logprobs = d.pending.item(), d.pending_logprobs
        if tok in self.eos_ids:
            return self._end_row(row, FinishReason.STOP)
        if not self._emit(row, tok, logprobs):
            return self._end_row(row, FinishReason.CANCELLED)
        if remaining == 1:
            return self._end_row(row, FinishReason.LENGTH)
        uid = self._batch.insert([[tok]], remaining - 1, d.sampler, d.processors, cache=d.cache,
                               tokens=d.history)
        self._rows[uid] = row

    def _take_back(self) -> None:
        """The one row left in the batch continues solo, where the control measured plain
        steps faster at one row (`Control.alone`): rows left it there, or its control
        probed at one row and plain steps won again."""
        taken = self._batch.take_alone()
        if taken is None:
            return
        uid, cache, tokens, pending, logprobs, sampler = taken
        self._release_dropped()
        row = self._rows.pop(uid)
        self._take_drafts(uid, row)
        self._solo = (row, Decoder.resume(self.model, cache, tokens, pending, logprobs, sampler,
                                          self.scheme))

    def _end_solo(self, reason: FinishReason, error: str | None = None) -> None:
        row, d = self._solo
        self._solo = None
        if self.prefix is not None and reason is not FinishReason.ERROR and d.prefilled:
            self._store(d.history, d.cache, row=row)  # the whole turn: the next extends it
        self._end_row(row, reason, error)
