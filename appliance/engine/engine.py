"""The engine: one thread owns every MLX object; callers submit token ids and await events.

MLX streams are thread-local (servers that touched MLX from request threads
crashed: mlx-lm issue 1181), so the model is loaded, run and freed on the
engine thread only. Handlers get a `RequestHandle`: an async iterator of
`Token` / `Finished` events, and `cancel()`, honoured at the next step.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

from appliance.engine import memory, sampling, threads
from appliance.engine.budget import Budget
from appliance.engine.scheduler import Scheduler, finish
from appliance.engine.types import Event, Finished, FinishReason, GenerationRequest, Rejected

log = logging.getLogger(__name__)


_outbox = threading.local()


def _put_all(held: list) -> None:
    for handle, event in held:
        handle._events.put_nowait(event)


class outbox:
    """`with outbox():` on the engine thread: the events delivered inside go to each
    event loop in one call at the end, not one call per token: a step of 16 rows woke the
    loop 16 times, and each wake-up is GIL the next step waits for. A loop that is gone
    cancels its requests, as a failed delivery does (`safe_deliver`)."""

    def __enter__(self):
        _outbox.held = []

    def __exit__(self, *exc):
        held, _outbox.held = _outbox.held, None
        by_loop: dict = {}
        for handle, event in held:
            by_loop.setdefault(handle._loop, []).append((handle, event))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except Exception:  # closed loop: its requests stop at the next step
                for handle, _ in items:
                    handle.cancel()


class RequestHandle:
    """A submitted request as its submitter sees it."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, rid: int):
        self.request = request
        self.id = rid
        self._loop = loop
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()
        self.submitted_at = time.perf_counter()
        # prompt tokens the prefix cache serves, set on the engine thread when it admits the
        # request, so before its first token reaches the submitter (an Anthropic stream's
        # message_start reports them)
        self.cached_tokens = 0

    def cancel(self) -> None:
        """Stop generating at the next step; the engine then emits Finished(CANCELLED)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def deliver(self, event: Event) -> None:
        """Called on the engine thread: hand the event to the submitter's loop (within a
        step, with the step's other events: `outbox`)."""
        held = getattr(_outbox, "held", None)
        if held is None:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        else:
            held.append((self, event))

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, Finished):
                return


class Engine:
    """Runs a scheduler on its own thread.

    `make_scheduler(model, tokenizer, stream)` is called on the engine thread
    after `load()`; `budget` (optional) lets `submit` refuse a request that
    could never fit, and `max_queue` bounds the requests waiting for a row.
    `memory_limit` / `cache_limit`: MLX's memory limit and buffer-cache cap (the plan's
    ceiling and its buffer-cache share), set before the model loads.
    """

    def __init__(self, load: Callable[[], tuple], make_scheduler: Callable[..., Scheduler],
                 mode: str, max_rows: int, max_queue: int, budget: Budget | None = None,
                 vocab_size: int | None = None, memory_limit: int | None = None,
                 cache_limit: int | None = None):
        self._load, self._make_scheduler = load, make_scheduler
        self.memory_limit, self.cache_limit = memory_limit, cache_limit
        self.mode, self.max_rows, self.max_queue, self.budget = mode, max_rows, max_queue, budget
        self.vocab_size = vocab_size
        self.failure: str | None = None  # why the engine thread cannot go on (then: 503s)
        self.scheduler: Scheduler | None = None
        self.model = self.tokenizer = None
        self.eos_ids: set[int] = set()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._done: threading.Event | None = None  # set when the engine thread's work ended
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._queued = 0  # submitted, not yet handed to the scheduler
        self._stop_error: str | None = None  # stop(error): what ends the work left, then 503s
        # Called on the engine thread with each request's seconds from submit to admission
        # (the API's metrics). Schedulers admit first in, first out, so the oldest requests
        # beyond pending_rows() are the ones admitted.
        self.on_admitted: Callable[[float], None] | None = None
        self._unadmitted: deque[RequestHandle] = deque()

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> Engine:
        """Start the engine thread and wait until the model is loaded."""
        self._done = threads.start("appliance-engine", self._main)
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error
        return self

    def stop(self, error: str | None = None) -> None:
        """Cancel running and queued work, then wait until the engine thread has finished it.
        With `error` (a graceful stop whose drain time ran out) that work ends as an error
        saying so, and later submits get 503."""
        done = self._done
        if done is None:
            return
        self._stop_error = error or self._stop_error
        self._queue.put(None)
        done.wait()
        self._done = None

    # -- submitting (from any thread running an asyncio loop) ----------------------
    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue a request, or raise Rejected (400: bad settings or can never fit; 429: queue
        full; 503: the engine has failed or is stopping)."""
        if self._stop_error is not None:
            raise Rejected(503, self._stop_error, code="shutting_down")
        if self.failure is not None:
            raise Rejected(503, f"the engine has failed and serves no requests: {self.failure}",
                           code="engine_failed")
        if self.vocab_size is not None and (bad := sampling.check(request.sampling,
                                                                  self.vocab_size)):
            raise Rejected(400, f"{bad[0]}: {bad[1]}", param=bad[0], code="invalid_value")
        if self.budget is not None and not self.budget.fits_alone(len(request.prompt),
                                                                  request.max_tokens):
            need = self.budget.cost(len(request.prompt), request.max_tokens)
            raise Rejected(400, f"this request needs {need:,} bytes of KV cache (prompt "
                                f"{len(request.prompt)} + max_tokens {request.max_tokens} "
                                f"tokens) but batch.kv_budget leaves {self.budget.room:,} bytes "
                                "for a row; lower max_tokens or shorten the prompt")
        if self.pending() >= self.max_queue:
            raise Rejected(429, f"the queue is full ({self.max_queue} requests waiting; "
                                "batch.max_queue); retry shortly", retry_after=1)
        handle = RequestHandle(request, asyncio.get_running_loop(), next(self._ids))
        self._queued += 1
        self._queue.put(handle)
        if self._stop_error is not None:  # stop() came in between: it may have drained already
            self._refuse_rest()
        return handle

    def pending(self) -> int:
        """Requests waiting for a row (queued here or in the scheduler)."""
        s = self.scheduler
        return self._queued + (s.pending_rows() if s is not None else 0)

    def stats(self) -> dict:
        s = self.scheduler
        c = s.counters
        return {
            "mode": self.mode, "max_rows": self.max_rows, "max_queue": self.max_queue,
            "active_rows": s.active_rows(), "pending_rows": self.pending(),
            "submitted_rows": c.submitted + self._queued, "finished_rows": c.finished,
            "kv_bytes": c.kv_bytes,
            "kv_reserved_bytes": self.budget.reserved if self.budget else None,
            "kv_budget_bytes": self.budget.budget if self.budget else None,
            "tokens_generated": c.tokens_generated,
            "prefill_seconds": round(c.prefill_seconds, 6),
            "decode_seconds": round(c.decode_seconds, 6),
            "warmup_seconds": round(c.warmup_seconds, 3),
            "cache": self._cache_stats(),
            "speculation": self._draft_stats(c),
            "memory": {**memory.report(), "cache_limit_bytes": self.cache_limit,
                       "allocation_failures": getattr(s, "allocation_failures", 0)},
        }

    @staticmethod
    def _draft_stats(c) -> dict:
        """Per method: draft tokens proposed and accepted by finished rows."""
        method = getattr(c, "draft_method", None)
        if method is None:
            return {}
        p, a = c.draft_proposed, c.draft_accepted
        return {method: {"proposed": p, "accepted": a,
                         "acceptance_rate": round(a / p, 4) if p else None}}

    def _cache_stats(self) -> dict:
        prefix = getattr(self.scheduler, "prefix", None)
        return prefix.stats() if prefix is not None else {}

    # -- the engine thread -----------------------------------------------------
    def _main(self) -> None:
        import mlx.core as mx

        try:
            memory.set_limits(self.memory_limit, self.cache_limit)
            stream = mx.new_stream(mx.default_device())
            with mx.stream(stream):
                self.model, self.tokenizer = self._load()
                self.eos_ids = set(self.tokenizer.eos_token_ids)
                self.scheduler = self._make_scheduler(self.model, self.eos_ids, stream)
        except BaseException as e:  # reported by start()
            self._load_error = e
            self._ready.set()
            return
        self._ready.set()
        with mx.stream(stream):
            self._loop()

    def _loop(self) -> None:
        """New requests join between steps; block only when there is nothing to run.

        A step that raises past the scheduler's own containment fails the rows in flight
        (with the error), never the thread: the loop goes on. If even that fails, the
        engine records why (`failure`: /health and new requests answer 503), ends every
        request it holds, and returns."""
        s = self.scheduler
        while True:
            items = [] if s.has_work() else [self._queue.get()]
            while not self._queue.empty():
                items.append(self._queue.get())
            for h in items:
                if h is None:
                    s.abort_all(*self._stop_finish())
                    s.close()  # e.g. finish pending SSD writes
                    return self._refuse_rest()
                self._queued -= 1
                s.add(h)
                self._unadmitted.append(h)
            try:
                with outbox():
                    s.step()
            except Exception as e:
                log.exception("engine step failed; failing the rows in flight")
                try:
                    s.fail_all(f"{type(e).__name__}: {e}")
                    sampling.repair_random_state()
                except Exception as again:
                    log.exception("the engine cannot recover; it stops serving")
                    self.failure = f"{type(again).__name__}: {again}"
                    return self._refuse_all(s)
            try:
                self._note_admitted(s)
            except Exception:  # a metrics hook never stops the engine
                log.exception("on_admitted failed")

    def _note_admitted(self, s: Scheduler) -> None:
        now = time.perf_counter()
        while len(self._unadmitted) > s.pending_rows():
            h = self._unadmitted.popleft()
            if self.on_admitted is not None:
                self.on_admitted(now - h.submitted_at)

    def _stop_finish(self) -> tuple[FinishReason, str | None]:
        """How stop() ends the work left: cancelled, or an error saying why."""
        return (FinishReason.ERROR if self._stop_error else FinishReason.CANCELLED,
                self._stop_error)

    def _refuse_rest(self) -> None:
        reason, error = self._stop_finish()
        while True:
            try:
                h = self._queue.get_nowait()
            except queue.Empty:
                return
            if h is not None:
                self._queued -= 1
                finish(h, reason, 0, error)

    def _refuse_all(self, s: Scheduler) -> None:
        """A failed engine: end what the scheduler holds, then answer every request that
        still arrives (one may have passed `submit`'s check just before) until stop()."""
        try:
            s.abort_all(FinishReason.ERROR, self.failure)
        except Exception:
            log.exception("could not end the rows of the failed engine")
        while (h := self._queue.get()) is not None:
            self._queued -= 1
            finish(h, FinishReason.ERROR, 0, self.failure)
