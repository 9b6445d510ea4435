"""The engine: one thread owns every MLX object; callers submit token ids and await events.

MLX streams are thread-local (servers that touched MLX from request threads
crashed: mlx-lm issue 1181), so the model is loaded, run and freed on the
engine thread only. Handlers get a `RequestHandle`: an async iterator of
`Token` / `Finished` events, and `cancel()`, honoured at the next token.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from appliance.engine.types import Event, Finished, FinishReason, GenerationRequest, Token

log = logging.getLogger(__name__)


class RequestHandle:
    """A submitted request as its submitter sees it."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, rid: int):
        self.request = request
        self.id = rid
        self._loop = loop
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop generating at the next token; the engine then emits Finished(CANCELLED)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def deliver(self, event: Event) -> None:
        """Called on the engine thread: hand the event to the submitter's loop."""
        self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, Finished):
                return


@dataclass
class EngineStats:
    """Run-time measurements (the plan stays immutable)."""

    submitted: int = 0
    finished: int = 0
    running: int = 0
    tokens_generated: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0


class Engine:
    """Serial engine: requests run one at a time, in arrival order."""

    def __init__(self, path: str, dtype: str, revision: str | None, prefill_chunk: int):
        self._path, self._dtype, self._revision = path, dtype, revision
        self.prefill_chunk = prefill_chunk
        self.stats = EngineStats()
        self._queue: queue.Queue[RequestHandle | None] = queue.Queue()
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._stopping = False
        self.model = self.tokenizer = None
        self.eos_ids: set[int] = set()

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> Engine:
        """Start the engine thread and wait until the model is loaded."""
        self._thread = threading.Thread(target=self._main, name="appliance-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error
        return self

    def stop(self) -> None:
        """Cancel running and queued work at the next token, then join the thread."""
        if self._thread is None:
            return
        self._stopping = True
        self._queue.put(None)
        self._thread.join()
        self._thread = None

    # -- submitting (any thread with an asyncio loop) -------------------------
    def submit(self, request: GenerationRequest) -> RequestHandle:
        handle = RequestHandle(request, asyncio.get_running_loop(), next(self._ids))
        self.stats.submitted += 1
        self._queue.put(handle)
        return handle

    # -- the engine thread -----------------------------------------------------
    def _main(self) -> None:
        import mlx.core as mx

        from appliance.engine import runner

        try:
            stream = mx.new_stream(mx.default_device())
            with mx.stream(stream):
                self.model, self.tokenizer = runner.load(self._path, self._dtype, self._revision)
                self.eos_ids = set(self.tokenizer.eos_token_ids)
        except BaseException as e:  # reported by start()
            self._load_error = e
            self._ready.set()
            return
        self._ready.set()
        with mx.stream(stream):
            while (handle := self._queue.get()) is not None:
                self._run(handle)
        while not self._queue.empty():  # shut down: whatever came after the sentinel
            if (h := self._queue.get()) is not None:
                h.deliver(Finished(FinishReason.CANCELLED, len(h.request.prompt), 0))

    def _run(self, handle: RequestHandle) -> None:
        from appliance.engine.runner import generate

        req, n, reason, error = handle.request, 0, FinishReason.LENGTH, None
        if self._stopping:
            handle.deliver(Finished(FinishReason.CANCELLED, len(req.prompt), 0))
            return
        self.stats.running = 1
        start = time.perf_counter()
        first = None
        try:
            for tok in generate(self.model, req.prompt, req.max_tokens, req.sampling,
                                self.prefill_chunk):
                if first is None:
                    first = time.perf_counter()
                if handle.cancelled or self._stopping:
                    reason = FinishReason.CANCELLED
                    break
                if tok in self.eos_ids:
                    reason = FinishReason.STOP
                    break
                n += 1
                handle.deliver(Token(tok))
        except Exception as e:  # a failed forward fails this request, not the engine
            log.exception("generation failed for request %d", handle.id)
            reason, error = FinishReason.ERROR, f"{type(e).__name__}: {e}"
        end = time.perf_counter()
        first = first or end
        self.stats.prefill_seconds += first - start
        self.stats.decode_seconds += end - first
        self.stats.tokens_generated += n
        self.stats.finished += 1
        self.stats.running = 0
        handle.deliver(Finished(reason, len(req.prompt), n, error))
