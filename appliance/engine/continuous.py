"""batch=continuous: iteration-level scheduling over the engine's own batched step.

`appliance.engine.step.BatchStep` is the executor (token-exact with mlx-lm's
BatchGenerator, the oracle, for native KV): each `tick()` runs one decode step for
the running rows, then one prefill chunk (`prefill_chunk` tokens) for rows being
admitted, so a running row stalls at most one chunk. This scheduler owns everything
around it: FIFO head-of-line admission under the KV byte budget, per-row samplers
(seeded rows with private random streams), cancellation between steps,
per-row failure containment, and the counters behind /stats.

A failed allocation (appliance/engine/memory.py) fails no row: the RAM tier and MLX's
buffer cache are dropped, the step's rows are requeued to continue where they stopped,
and the batch runs one row smaller until a row finishes.

A request that arrives to an idle engine runs *solo* (`appliance/engine/solo.py`).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque

from appliance.engine.budget import Budget
from appliance.engine.compiled import CompiledDecode
from appliance.engine.kv import Scheme
from appliance.engine.memory import OUT_OF_MEMORY, Resumed, is_allocation_failure
from appliance.engine.prefix_cache import PrefixCache
from appliance.engine.sampling import make_processors, make_sampler, repair_random_state, seeded
from appliance.engine.scheduler import Counters, Row, RowState, finish, safe_deliver, token_event
from appliance.engine.solo import SoloRow
from appliance.engine.step import BatchStep
from appliance.engine.types import FinishReason

log = logging.getLogger(__name__)

MAX_RETRIES = 3  # failed allocations one request survives; then it fails alone


class ContinuousScheduler(SoloRow):
    def __init__(self, model, eos_ids: set[int], max_rows: int, prefill_chunk: int,
                 budget: Budget, prefix: PrefixCache | None = None,
                 ceiling: int | None = None, scheme: Scheme | None = None,
                 prefill_rows: int = 1, drafter=None, control=None,
                 compile_step: bool = False, compile_verify: bool = True):
        """`prefix`: the prefix cache, if any; its RAM tier trims itself to `ceiling` minus
        the KV bytes the live rows hold and the copies waiting for the SSD writer (one
        memory ceiling for all three). `drafter`/`control`: speculative decoding
        (`appliance.engine.speculate`); with a drafter every row runs in the batched step,
        a lone one too (the solo path does not speculate), unless the control measured plain
        steps faster at one row (`Control.alone`) or the row is seeded (it never speculates;
        solo, its tokens are draft=none's on any backend, not only a batch-invariant one).
        `compile_step`: batched plain decode steps run as one compiled graph
        (`appliance.engine.compiled`); `compile_verify`: verify passes do (by default: on
        an H200 it measured 1.0-1.3x the uncompiled pass's tokens/s; on a 2-core CPU
        1.13-1.16x at B=1, where a pass builds more graph than it computes, and within
        noise at B=4-16, where masked slots mostly keep the pass uncompiled;
        docs/benchmarks.md)."""
        self.model, self.eos_ids = model, eos_ids
        self.max_rows, self.prefill_chunk = max_rows, prefill_chunk
        self.budget = budget  # (MLX work runs on the engine thread's own stream)
        self.prefix, self.ceiling = prefix, ceiling
        self.scheme = scheme or Scheme()
        self.prefill_rows = prefill_rows
        self.drafter, self.control = drafter, control
        self.compiled = CompiledDecode(model) if compile_step else None  # traces kept
        self.compile_verify = compile_verify
        self.counters = Counters(draft_method=drafter.method if drafter else None)
        self._waiting: deque = deque()
        self._rows: dict[int, Row] = {}  # BatchStep uid -> row
        self._held: dict[int, int] = {}  # BatchStep uid -> handle id: finished, KV still held
        self._solo = None  # (Row, runner.Decoder): a lone row, decoded unbatched
        self._batch = self._new_step()
        self.row_cap = max_rows  # lowered by a failed allocation, back up as rows finish
        self.allocation_failures = 0
        self._pending = 0

    def _new_step(self) -> BatchStep:
        # Head of line: a step is one decode pass plus one chunk of at most `prefill_chunk`
        # tokens for each of up to `prefill_rows` prompts, so running rows stall at most one
        # (padded) chunk and the oldest arrival gets its first token no later than alone.
        return BatchStep(self.model, self.eos_ids, self.max_rows, self.prefill_chunk,
                         self.scheme, prefill_rows=self.prefill_rows, drafter=self.drafter,
                         control=self.control, compiled=self.compiled,
                         compile_verify=self.compile_verify,
                         keep_finished=self.prefix is not None)

    # -- the Scheduler interface ------------------------------------------------
    def add(self, handle) -> None:
        self.counters.submitted += 1
        self._waiting.append(handle)
        self._count_pending()

    def has_work(self) -> bool:
        return bool(self._waiting) or bool(self._rows) or self._solo is not None

    def active_rows(self) -> int:
        return len(self._rows) + (self._solo is not None)

    def pending_rows(self) -> int:
        return self._pending  # (read from other threads: a count the engine thread keeps)

    def _count_pending(self) -> None:
        """Requests waiting for a row: a free slot and KV budget for it. With a prefix cache,
        a request that has both still waits for its turn to prefill (`_admit`); it counts as
        having its row. One the budget holds back waits for a row (`batch.max_queue`)."""
        free = max(0, self.row_cap - self.active_rows()) if self.prefix is not None else 0
        if free and self._waiting:
            heads = [h.request for h in itertools.islice(self._waiting, free)]
            free = self.budget.fitting([len(r.prompt) + r.max_tokens for r in heads],
                                       dropping=frozenset(self._held.values()))
        self._pending = max(0, len(self._waiting) - free)

    def step(self) -> None:
        try:
            if self.prefix is not None:
                self.prefix.step_started()
            self._step()
            self.counters.kv_bytes = self._live_kv_bytes()
            live = self._kv_claim()
            if self.prefix is not None and self.prefix.ssd is not None:  # after the step's tokens
                self.prefix.flush(None if self.ceiling is None else max(0, self.ceiling - live))
            self._trim()
        finally:
            self._count_pending()

    def _step(self) -> None:
        self._reap_cancelled()
        if self._solo is not None and self._solo[1].prefilled and self._head_fits():
            self._hand_over()  # a second row can join: continue batched
        elif self.drafter is not None and len(self._rows) == 1 and not self._waiting \
                and self.control.alone():
            self._take_back()  # the batch's last row: continue solo
        if not self._rows and self._solo is None and len(self._waiting) == 1 \
                and (self.drafter is None or self.control.alone()
                     or seeded(self._waiting[0].request.sampling)):
            self._start_solo()
        if self._solo is not None:
            return self._solo_step()
        self._admit()
        if not self._rows:
            return
        prefilling = any(r.state is RowState.PREFILL for r in self._rows.values())
        t = time.perf_counter()
        try:
            prompt_responses, responses = self._batch.tick()
            if self.prefix is not None:  # checkpoints: a segment of some prompt just ended
                ends = [p for p in prompt_responses if p.end_of_segment and not p.end_of_prompt]
                for p in ends:
                    cache, tokens = self._batch.extract(p.uid, p.at)
                    row = self._rows[p.uid]
                    self._store(tokens, cache, durable=self._durable(row.handle.request,
                                                                     len(tokens)), row=row)
        except Exception as e:  # a failed forward fails the rows in flight, not the server
            if is_allocation_failure(e):
                return self._out_of_memory(e)
            log.exception("batched step failed; failing its %d rows", len(self._rows))
            self.fail_all(f"{type(e).__name__}: {e}")
            return
        # A step that carries a prefill chunk counts as prefill time (it is what delays
        # first tokens); pure decode steps count as decode time.
        dt = time.perf_counter() - t
        if prefilling:
            self.counters.prefill_seconds += dt
        else:
            self.counters.decode_seconds += dt
        for r in responses:
            if self.prefix is not None and r.finish_reason is not None and r.cache:
                self._store(r.tokens, r.cache, row=self._rows.get(r.uid))  # the whole turn
            self._on_token(r)
        self._release_dropped()

    def _release_dropped(self, every: bool = False) -> None:
        """Give back the reservations of held rows whose KV left the batch (`every`: the
        batch itself was dropped)."""
        gone = list(self._held) if every else self._batch.dropped
        for uid in gone:
            if uid in self._held:
                self.budget.release(self._held.pop(uid))
        # (a row dropped while this step's events are still being read finishes after)
        self._batch.dropped = [] if every else [u for u in gone if u not in self._held
                                                 and u in self._rows]

    def close(self) -> None:
        """After abort_all: flush what the prefix cache still has to write."""
        if self.prefix is not None:
            self.prefix.close()

    def abort_all(self, reason: FinishReason = FinishReason.CANCELLED,
                  error: str | None = None) -> None:
        if self._solo is not None:
            self._end_solo(reason, error)
        for uid in list(self._rows):
            self._end(uid, reason, error)
        while self._waiting:
            self.counters.finished += 1
            finish(self._waiting.popleft(), reason, 0, error)
        self._count_pending()

    def check_integrity(self) -> None:
        c = self.counters
        assert c.submitted - c.finished == len(self._waiting) + self.active_rows()
        assert self.active_rows() <= self.max_rows
        assert self._solo is None or not self._rows, "a solo row never runs beside a batch"
        live = [r.handle.id for r in self._rows.values()] + list(self._held.values())
        live += [self._solo[0].handle.id] if self._solo else []
        assert set(self.budget._held) == set(live)
        assert 1 <= self.row_cap <= self.max_rows
        self.budget.check_integrity()
        if self.prefix is not None and self.ceiling is not None:
            room = self.ceiling - max(c.kv_bytes, self.budget.reserved) - self.prefix.pending_bytes
            assert self.prefix.nbytes <= max(0, room), "the RAM tier is over the ceiling"

    def _end_row(self, row: Row, reason: FinishReason, error: str | None = None,
                 held: int | None = None) -> None:
        """`held`: the row's BatchStep uid where its KV stays in the batch for now
        (step.HOLD): its reservation goes with the KV (`_release_dropped`)."""
        if held is None:
            self.budget.release(row.handle.id)
        else:
            self._held[held] = row.handle.id
        self.counters.finished += 1
        self.row_cap = min(self.max_rows, self.row_cap + 1)  # a row left: memory came back
        finish(row.handle, reason, row.generated, error, cached=row.cached,
               accepted=row.accepted, rejected=row.rejected)

    # -- the prefix cache ---------------------------------------------------------
    def _live_kv_bytes(self) -> int:
        solo = sum(c.nbytes for c in self._solo[1].cache) if self._solo else 0
        return self._batch.nbytes + solo

    def _kv_claim(self) -> int:
        """Live KV, or what admission reserved for the rows if more (a row just admitted
        has not grown yet): the RAM tier may use only what neither claims."""
        return max(self._live_kv_bytes(), self.budget.reserved)

    def _cache_limit(self) -> int | None:
        if self.ceiling is None:
            return None
        return max(0, self.ceiling - self._kv_claim() - self.prefix.pending_bytes)

    def _trim(self) -> None:
        """One ceiling: the rows first, then copies waiting for the SSD, then the RAM tier."""
        if self.prefix is not None and self.ceiling is not None:
            self.prefix.trim(self._cache_limit())

    def _store(self, tokens: list[int], cache: list, live: bool = False,
               durable: bool = True, row: Row | None = None) -> None:
        """`row`: the row `cache` is from. The entries its KV was built from, and those it
        stored, need no bit-for-bit check when a later entry of it extends them (`cache`
        holds the model's layers only, whatever the row's drafter: `BatchStep.extract`)."""
        trust = row is not None
        got = self.prefix.insert(list(tokens), cache, limit=self._cache_limit(), live=live,
                                 durable=durable, trusted=row.trusted if trust else frozenset())
        if trust:
            row.trusted |= got

    @staticmethod
    def _durable(request, n_tokens: int) -> bool:
        """SSD keeps the first checkpoint (the shared system prompt) and whole turns; the
        other message ends and the prompt end stay in RAM (worth no disk write of their own)."""
        return bool(request.checkpoints) and n_tokens == min(request.checkpoints)

    def _checkpointer(self, request, row: Row):
        """on_checkpoint for the solo row, whose cache goes on being filled."""
        def store(tokens: list[int], cache: list) -> None:
            self._store(tokens, cache, live=True, durable=self._durable(request, len(tokens)),
                        row=row)

        return store

    def _emit(self, row: Row, tok: int, logprobs) -> bool:
        row.generated += 1
        row.emitted.append(tok)
        self.counters.tokens_generated += 1
        return safe_deliver(row.handle, token_event(tok, logprobs, row.handle.request.logprobs))

    # -- internals ---------------------------------------------------------------
    def _admit(self) -> None:
        """FIFO, head of line: the first waiting request goes first or nobody does.

        With a prefix cache, a request is admitted (and looked up) only when it can start
        prefilling: agents that arrive together with one system prompt then find it stored
        by the first one's checkpoint, where admitted together they each missed and
        prefilled it again, one after the other."""
        while self._waiting and len(self._rows) < self.row_cap and \
                (self.prefix is None or self._batch.prefill_free()):
            h = self._waiting[0]
            if h.cancelled:
                self._waiting.popleft()
                self.counters.finished += 1
                finish(h, FinishReason.CANCELLED, 0)
                continue
            r = h.request
            if not self.budget.try_admit(h.id, len(r.prompt), r.max_tokens):
                if not (self._held and self._batch.drop_retired()):
                    return  # wait for running rows to free their KV
                self._release_dropped()  # held rows gave their KV back: try again
                continue
            self._waiting.popleft()
            self._trim()  # before the hit's copy: the RAM tier gives back what the row claims
            try:
                cached, cache = self.prefix.lookup(r.prompt) if self.prefix is not None \
                    else (0, None)
                uid = self._batch.insert(
                    self._segments(r.prompt, cached, r.checkpoints), r.max_tokens,
                    make_sampler(r.sampling), make_processors(r.sampling), cache=cache,
                    tokens=r.prompt[:cached], params=r.sampling)
                h.cached_tokens = cached
            except Exception as e:  # e.g. an empty prompt: this request only
                self.budget.release(h.id)
                if is_allocation_failure(e):  # the hit's copy: wait for memory
                    return self._out_of_memory(e, [Row(h, RowState.PREFILL)])
                log.error("a row could not be admitted", exc_info=e)
                self.counters.finished += 1
                finish(h, FinishReason.ERROR, 0, f"{type(e).__name__}: {e}")
                continue
            self._rows[uid] = Row(h, RowState.PREFILL, cached=cached,
                                  trusted=self.prefix.hit_chain if cached else frozenset())

    def _segments(self, prompt: list[int], cached: int,
                  checkpoints: tuple[int, ...]) -> list[list[int]]:
        """The uncached prompt cut at checkpoints (prefill stops there, so a checkpoint is
        taken exactly at the boundary; the step adds the cut before the last token)."""
        if self.prefix is None:
            return [prompt[cached:]]
        cuts = [c for c in sorted(set(checkpoints)) if cached < c < len(prompt) - 1]
        bounds = [cached, *cuts, len(prompt)]
        return [prompt[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]

    def _on_token(self, r) -> None:
        row = self._rows.get(r.uid)
        if row is None:
            return
        row.state = RowState.DECODE
        held = r.uid if r.held else None
        if r.finish_reason == "stop":  # stop_tokens are the EOS ids: never delivered
            return self._end(r.uid, FinishReason.STOP, removed=True, held=held)
        if not self._emit(row, r.token, r.logprobs):
            return self._end(r.uid, FinishReason.CANCELLED, removed=r.finish_reason is not None,
                             held=held)
        if r.finish_reason == "length":
            self._end(r.uid, FinishReason.LENGTH, removed=True, held=held)

    def _reap_cancelled(self) -> None:
        if self._solo is not None and self._solo[0].handle.cancelled:
            self._end_solo(FinishReason.CANCELLED)
        for uid in [u for u, row in self._rows.items() if row.handle.cancelled]:
            self._end(uid, FinishReason.CANCELLED)

    def _end(self, uid: int, reason: FinishReason, error: str | None = None,
             removed: bool = False, held: int | None = None) -> None:
        """Finish one row and free its KV now (the step already dropped finished rows, or
        holds them: `held`)."""
        row = self._rows.pop(uid)
        if not removed:
            self._batch.remove(uid)  # (held rows go with it)
            self._release_dropped()
        self._take_drafts(uid, row)
        self._end_row(row, reason, error, held=held)

    def _take_drafts(self, uid: int, row: Row) -> None:
        """Row `uid`'s draft counts, out of the batch, into its usage and the counters."""
        drafted = self._batch.drafts.pop(uid, None)
        if drafted is not None:
            row.accepted += drafted.accepted  # (a row batched twice, solo between)
            row.rejected += drafted.proposed - drafted.accepted
            self.counters.draft_proposed += drafted.proposed
            self.counters.draft_accepted += drafted.accepted

    def _out_of_memory(self, e: BaseException, rows: list[Row] | None = None) -> None:
        """An allocation failed: drop what can be rebuilt (the RAM tier, MLX's buffer cache)
        and requeue the rows in flight (oldest first, ahead of new arrivals), each to go on
        from what it already delivered; the batch runs one row smaller until a row ends.
        A request that keeps failing, or one whose output is constrained, fails alone."""
        import mlx.core as mx

        if rows is None:  # the whole batch: its state is unknown after a failed step
            rows, self._rows = list(self._rows.values()), {}
            self._release_dropped(every=True)
            self._batch = self._new_step()
            for row in rows:
                self.budget.release(row.handle.id)
        self.allocation_failures += 1
        log.error("allocation failed with %d rows in flight; dropping the RAM tier and MLX's "
                  "buffer cache, requeueing them", len(rows), exc_info=e)
        if self.prefix is not None:
            self.prefix.trim(0)
        mx.clear_cache()
        repair_random_state()
        self.row_cap = max(1, min(self.row_cap, len(rows) + len(self._rows)) - 1)
        for row in reversed(rows):  # back to the head of the line, oldest first
            h = row.handle
            if len(row.emitted) >= h.request.max_tokens:  # nothing left to generate
                self.counters.finished += 1
                finish(h, FinishReason.LENGTH, row.generated)
                continue
            constrained = h.request.sampling.constraint is not None and row.emitted
            if (isinstance(h, Resumed) and h.retries >= MAX_RETRIES) or constrained:
                self.counters.finished += 1
                finish(h, FinishReason.ERROR, row.generated,
                       f"{OUT_OF_MEMORY} ({type(e).__name__}: {e})")
                continue
            self._waiting.appendleft(Resumed(h, row.emitted))  # counts its retries

    def fail_all(self, error: str) -> None:
        """End every row in flight (solo or batched) with `error`; waiting rows stay."""
        if self._solo is not None:
            self._end_solo(FinishReason.ERROR, error)
        rows, self._rows = self._rows, {}
        for row in rows.values():
            self._end_row(row, FinishReason.ERROR, error)
        self._release_dropped(every=True)
        self._batch = self._new_step()  # its state is unknown after a failed step
        repair_random_state()
