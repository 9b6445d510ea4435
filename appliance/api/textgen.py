"""From engine events to text: streaming detokenization and stop sequences.

Stop sequences are matched on text (as OpenAI documents), not on token ids, and on
content only (never inside a tool call's markup: `_Calls`):
text that could be the start of a stop sequence is held back until it is
known not to be one, and a match cancels the engine request at once. Each
released `Piece` carries the tokens consumed since the previous one, so
log-probabilities stay aligned with the text they produced.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from appliance.api.errors import APIError
from appliance.api.toolstream import CallArgs, CallStart, ToolCall, ToolCallSplitter, partial
from appliance.engine import Engine, Finished, FinishReason, GenerationRequest, Rejected, Token


@dataclass(frozen=True)
class Piece:
    text: str
    tokens: tuple[Token, ...]


@dataclass(frozen=True)
class Done:
    finish_reason: str  # "stop" | "length" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    cached_tokens: int = 0
    stop_sequence: str | None = None  # the stop sequence that ended the text, if one did
    accepted_prediction_tokens: int = 0  # speculative decoding: draft tokens kept
    rejected_prediction_tokens: int = 0


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop sequence."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class _Calls:
    """Where tool-call markup lies in the text so far: stop sequences do not apply there
    (OpenAI matches them on content only; a stop inside a forced call's arguments cut the
    call to invalid JSON, or to none)."""

    def __init__(self, fmt):
        self.start, self.end = fmt.start, fmt.end
        self.text, self.spans, self.open, self._at = "", [], None, 0

    def add(self, seg: str) -> None:
        self.text += seg
        while True:
            mark = self.start if self.open is None else self.end
            i = self.text.find(mark, self._at)
            if i < 0:
                self._at = max(self._at, len(self.text) - len(mark) + 1)
                return
            if self.open is None:
                self.open = i
            else:
                self.spans.append((self.open, i + len(mark)))
                self.open = None
            self._at = i + len(mark)

    def tail(self) -> int:
        """Characters at the end that may be the start of a call's markup."""
        return partial(self.text, self.start) if self.open is None else 0

    def content(self, a: int, b: int) -> bool:
        """Whether text[a:b] is content: in no call, nor where one may be starting."""
        return not ((self.open is not None and b > self.open)
                    or any(a < y and x < b for x, y in self.spans)
                    or b > len(self.text) - self.tail())


def _find(pending: str, stop: str, base: int, calls: _Calls | None) -> int:
    """The first match of `stop` in `pending` (at `base` in the text) that is content."""
    i = pending.find(stop)
    while i >= 0 and calls is not None and not calls.content(base + i, base + i + len(stop)):
        i = pending.find(stop, i + 1)
    return i


def submit(engine: Engine, request: GenerationRequest):
    """engine.submit, with its refusals turned into HTTP errors (400 / 429 + Retry-After)."""
    try:
        return engine.submit(request)
    except Rejected as e:
        headers = {"Retry-After": str(e.retry_after)} if e.retry_after else None
        code = e.code or {400: "kv_budget_exceeded", 429: "queue_full"}.get(e.status)
        param = e.param or ("max_tokens" if code == "kv_budget_exceeded" else None)
        raise APIError(e.status, e.message, param=param, code=code, headers=headers) from e


async def generate_text(engine: Engine, tokenizer, request: GenerationRequest,
                        stops: tuple[str, ...], on_submit=None,
                        calls=None) -> AsyncIterator[Piece | Done]:
    """Yield text pieces, then one Done. Cancels the engine request if abandoned.
    `on_submit`: called with the engine's RequestHandle once submitted. `calls`: the
    tool-call format (a ToolFormat), whose markup stop sequences skip."""
    handle = submit(engine, request)
    if on_submit is not None:
        on_submit(handle)
    detok = tokenizer.detokenizer
    marks = _Calls(calls) if calls is not None and stops else None
    base = 0  # where `pending` starts in the text
    pending, toks = "", []  # text decoded but not yet released, and its tokens
    starts: list[int] = []  # where each of those tokens' text starts in `pending`
    stopped: str | None = None  # the stop sequence matched
    used = 0  # tokens that made it into the text (in-flight ones after a stop do not count)
    try:
        async for event in handle:
            if isinstance(event, Finished):
                if not stopped:
                    detok.finalize()
                    pending += detok.last_segment
                    if pending or toks:
                        yield Piece(pending, tuple(toks))
                # a matched stop ends the text even where tokens in flight (a pipelined
                # step, a run of accepted drafts, a slow reader) reached max_tokens
                reason = "length" if event.reason == FinishReason.LENGTH and not stopped \
                    else "stop"
                yield Done(reason, event.prompt_tokens, used, event.error, event.cached_tokens,
                           stopped, event.accepted_prediction_tokens,
                           event.rejected_prediction_tokens)
                return
            if stopped:
                continue  # tokens already in flight when we cancelled
            used += 1
            toks.append(event)
            starts.append(len(pending))
            detok.add_token(event.id)
            pending += detok.last_segment
            if marks is not None:
                marks.add(detok.last_segment)
            hits = [(i, s) for s in stops if (i := _find(pending, s, base, marks)) >= 0]
            if hits:
                at, stopped = min(hits)
                handle.cancel()
                # only the tokens whose text starts before the stop: nothing past it is
                # released, log-probabilities included
                yield Piece(pending[:at], tuple(t for t, a in zip(toks, starts, strict=True)
                                                    if a < at))
                continue
            keep = _held_back(pending, stops)
            if marks is not None and marks.tail():  # (a stop there may match once the
                # start of a call's markup proves to be content)
                keep = max(keep, min(len(pending), marks.tail() + max(map(len, stops)) - 1))
            if len(pending) > keep:
                yield Piece(pending[: len(pending) - keep], tuple(toks))
                base += len(pending) - keep
                pending, toks, starts = pending[len(pending) - keep:], [], []
    finally:
        handle.cancel()  # client gone or generator closed: stop at the next step


Item = Piece | CallStart | CallArgs | ToolCall | Done


def generate(engine: Engine, tokenizer, prep, on_submit=None) -> AsyncIterator[Item]:
    """A prepared request's output: text pieces, then one Done. With tools on
    (`prep.tools`), tool calls are parsed out of the text as it streams: each call is a
    CallStart, CallArgs fragments and the complete ToolCall; the finish reason is
    `tool_calls` when a call was made. `on_submit`: as in `generate_text`."""
    gen = generate_text(engine, tokenizer, prep.engine_request, prep.stop, on_submit,
                        prep.tools)
    return gen if prep.tools is None else _with_tool_calls(gen, ToolCallSplitter(prep.tools))


async def _with_tool_calls(gen, splitter: ToolCallSplitter):
    try:
        async for item in gen:
            if isinstance(item, Done):
                for x in splitter.finish():
                    yield Piece(x, ()) if isinstance(x, str) else x
                if splitter.calls and item.finish_reason == "stop":
                    item = replace(item, finish_reason="tool_calls")
                yield item
                return
            toks = item.tokens  # log-probabilities go with the first content released
            for x in splitter.feed(item.text):
                if isinstance(x, str):
                    yield Piece(x, toks)
                    toks = ()
                else:
                    yield x
    finally:
        await gen.aclose()
