"""Anthropic's Messages API (`POST /v1/messages`) over the same engine and chat pipeline.

The request is translated into OpenAI chat terms (`anthropic_request.py`). Output comes back
as content blocks, with Anthropic's stream events, stop reasons, usage
(`cache_read_input_tokens`: prompt tokens the prefix cache served) and error shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.exceptions import HTTPException, ValidationException
from litestar.params import JSONBody
from litestar.response import Stream

from appliance.api import metrics
from appliance.api.anthropic_request import (
    CountTokensRequest,
    MessagesRequest,
    prepare_messages,
    user_id,
)
from appliance.api.errors import (
    APIError,
    generation_failed,
    handle_http,
    handle_too_deep,
    handle_validation,
    typed,
)
from appliance.api.textgen import Done, Piece, generate
from appliance.api.toolstream import CallArgs, CallStart, ToolCall

log = logging.getLogger("appliance.api")


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               415: "invalid_request_error", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error"}


# -- errors in Anthropic's shape -------------------------------------------------------------
def error_body(err: APIError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(err.status, "api_error"),
                                       "message": err.message}}


def _as_anthropic(handler):
    """Wrap an OpenAI-shaped error handler: same status and message, Anthropic's body."""
    def handle(request: Request, exc: Exception) -> Response:
        r = handler(request, exc)
        err = r.content["error"]
        body = {"type": "error", "error": {"type": ERROR_TYPES.get(r.status_code, "api_error"),
                                           "message": err["message"]}}
        return Response(body, status_code=r.status_code, headers=r.headers)
    return handle


def _api_error(_: Request, exc: APIError) -> Response:
    return Response(error_body(exc), status_code=exc.status, headers=exc.headers)


def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("500 on %s %s", request.method, request.url.path, exc_info=exc)
    return _api_error(request, APIError(500, f"internal error: {exc}"))


HANDLERS = {APIError: _api_error, ValidationException: _as_anthropic(handle_validation),
            HTTPException: _as_anthropic(handle_http),
            RecursionError: _as_anthropic(handle_too_deep), Exception: _unexpected}


# -- output ------------------------------------------------------------------------------------
def _stop_reason(done: Done, user_stops: tuple[str, ...]) -> tuple[str, str | None]:
    if done.finish_reason == "length":
        return "max_tokens", None
    if done.finish_reason == "tool_calls":
        return "tool_use", None
    if done.stop_sequence is not None and done.stop_sequence in user_stops:
        return "stop_sequence", done.stop_sequence
    return "end_turn", None


def _usage(done: Done) -> dict:
    return {"input_tokens": done.prompt_tokens - done.cached_tokens,
            "output_tokens": done.completion_tokens,
            "cache_read_input_tokens": done.cached_tokens,
            "cache_creation_input_tokens": 0}


def _tool_use(c: ToolCall) -> dict:
    try:
        args = json.loads(c.arguments)
    except ValueError:  # cut off by max_tokens (stop_reason says so), or malformed
        args = None
    return {"type": "tool_use", "id": c.id, "name": c.name,
            "input": args if isinstance(args, dict) else {}}


def _event(kind: str, data: dict) -> bytes:
    return (f"event: {kind}\n".encode() + b"data: " + msgspec.json.encode({"type": kind, **data})
            + b"\n\n")


@post("/v1/messages", status_code=200, exception_handlers=HANDLERS)
async def messages(request: Request, state: State,
                   data: JSONBody[MessagesRequest]) -> Response | Stream:
    from appliance.api.routes import SSE_HEADERS, _complete, _unless_disconnected

    await typed(request, MessagesRequest)
    metrics.tag_agent(request, user_id(data))
    prep = await asyncio.to_thread(prepare_messages, data, state.plan, state.tokenizer)
    user_stops = tuple(data.stop_sequences or ())
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    head = {"id": mid, "type": "message", "role": "assistant", "model": state.plan.model.id}
    if not data.stream:
        items, done = await _complete(request, state, prep)
        content, text = [], "".join(p.text for p in items if isinstance(p, Piece))
        if text:
            content.append({"type": "text", "text": text})
        content += [_tool_use(c) for c in items if isinstance(c, ToolCall) and c.complete]
        reason, seq = _stop_reason(done, user_stops)
        return Response({**head, "content": content, "stop_reason": reason,
                         "stop_sequence": seq, "usage": _usage(done)})

    handles = []
    gen = metrics.watch(request, generate(state.engine, state.tokenizer, prep, handles.append))
    first = await _unless_disconnected(request, gen, gen.__anext__())
    if isinstance(first, Done) and first.error:
        raise generation_failed(first.error)
    # the engine admitted the request before its first output: its prefix-cache hit is known
    # (as Anthropic's own message_start reports it; the usage at the end says the same)
    cached = handles[0].cached_tokens

    async def events() -> AsyncIterator[bytes]:
        n_prompt = len(prep.engine_request.prompt)
        yield _event("message_start", {"message": {
            **head, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": n_prompt - cached, "output_tokens": 0,
                      "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}}})
        index, open_text, item = 0, False, first
        try:
            while not isinstance(item, Done):
                if isinstance(item, Piece) and item.text:
                    if not open_text:
                        yield _event("content_block_start", {
                            "index": index, "content_block": {"type": "text", "text": ""}})
                        open_text = True
                    yield _event("content_block_delta", {
                        "index": index, "delta": {"type": "text_delta", "text": item.text}})
                elif isinstance(item, CallStart):
                    if open_text:
                        yield _event("content_block_stop", {"index": index})
                        index, open_text = index + 1, False
                    yield _event("content_block_start", {"index": index, "content_block": {
                        "type": "tool_use", "id": item.id, "name": item.name, "input": {}}})
                elif isinstance(item, CallArgs) and item.text:
                    yield _event("content_block_delta", {"index": index, "delta": {
                        "type": "input_json_delta", "partial_json": item.text}})
                elif isinstance(item, ToolCall):
                    yield _event("content_block_stop", {"index": index})
                    index += 1
                item = await gen.__anext__()
            if open_text:
                yield _event("content_block_stop", {"index": index})
            if item.error:
                yield _event("error", error_body(generation_failed(item.error)))
                return
            reason, seq = _stop_reason(item, user_stops)
            yield _event("message_delta", {"delta": {"stop_reason": reason,
                                                     "stop_sequence": seq},
                                           "usage": _usage(item)})
            yield _event("message_stop", {})
        finally:
            await gen.aclose()

    return Stream(events(), media_type="text/event-stream", headers=SSE_HEADERS)


@post("/v1/messages/count_tokens", status_code=200, exception_handlers=HANDLERS)
async def count_tokens(request: Request, state: State,
                       data: JSONBody[CountTokensRequest]) -> dict:
    """The prompt's tokens as /v1/messages would count them."""
    await typed(request, CountTokensRequest)
    body = MessagesRequest(max_tokens=1, **{f: getattr(data, f) for f in data.__struct_fields__})
    prep = await asyncio.to_thread(prepare_messages, body, state.plan, state.tokenizer, True)
    return {"input_tokens": len(prep.engine_request.prompt)}


ROUTES = [messages, count_tokens]
