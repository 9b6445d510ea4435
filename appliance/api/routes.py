"""The OpenAI-compatible endpoints, plus /v1/plan and /health."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from litestar import Request, get, post
from litestar.datastructures import State
from litestar.response import Response, Stream

from appliance.api.errors import APIError
from appliance.api.requests import Prepared, prepare_chat, prepare_completion
from appliance.api.schemas import ChatCompletionRequest, CompletionRequest
from appliance.api.textgen import Done, generate_text


def _usage(done: Done) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def _envelope(state: State, kind: str, rid: str, created: int) -> dict:
    return {"id": rid, "object": kind, "created": created, "model": state.plan.model.id,
            "system_fingerprint": state.plan.fingerprint}


def _sse(obj) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


async def _watch_disconnect(request: Request) -> None:
    """Returns when the client goes away (the body is already read, so only
    http.disconnect can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _complete(request: Request, state: State, prep: Prepared) -> tuple[str, Done]:
    """Run a non-streaming request to the end; cancel it if the client disconnects."""
    parts: list[str] = []

    async def collect() -> Done:
        async for item in generate_text(state.engine, state.tokenizer, prep.engine_request,
                                        prep.stop):
            if isinstance(item, Done):
                return item
            parts.append(item)
        raise RuntimeError("generation ended without a result")

    work = asyncio.ensure_future(collect())
    watcher = asyncio.ensure_future(_watch_disconnect(request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not work.done():  # disconnected: closing the generator cancels the engine request
        work.cancel()
        raise asyncio.CancelledError
    done = work.result()
    if done.error:
        raise APIError(500, f"generation failed: {done.error}", code="generation_error")
    return "".join(parts), done


async def _stream(state: State, prep: Prepared, chunk, rid: str, created: int,
                  kind: str) -> AsyncIterator[bytes]:
    """SSE frames; the generator is closed by Litestar when the client disconnects."""
    env = _envelope(state, kind, rid, created)
    first = chunk(None, None, first=True)
    if first is not None:
        yield _sse({**env, "choices": [first]})
    async for item in generate_text(state.engine, state.tokenizer, prep.engine_request,
                                    prep.stop):
        if isinstance(item, Done):
            if item.error:
                yield _sse(APIError(500, f"generation failed: {item.error}").body())
                break
            yield _sse({**env, "choices": [chunk(None, item.finish_reason)]})
            if prep.include_usage:
                yield _sse({**env, "choices": [], "usage": _usage(item)})
        else:
            yield _sse({**env, "choices": [chunk(item, None)]})
    yield b"data: [DONE]\n\n"


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request, state: State,
                           data: ChatCompletionRequest) -> Response | Stream:
    prep = prepare_chat(data, state.plan, state.tokenizer)
    rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    if data.stream:
        def chunk(text, finish, first=False):
            delta = {"role": "assistant", "content": ""} if first else (
                {"content": text} if text is not None else {})
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

        return Stream(_stream(state, prep, chunk, rid, created, "chat.completion.chunk"),
                      media_type="text/event-stream", headers=SSE_HEADERS)
    text, done = await _complete(request, state, prep)
    return Response({**_envelope(state, "chat.completion", rid, created),
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": done.finish_reason}],
                     "usage": _usage(done)})


@post("/v1/completions", status_code=200)
async def completions(request: Request, state: State,
                      data: CompletionRequest) -> Response | Stream:
    prep = prepare_completion(data, state.plan, state.tokenizer)
    rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    if data.stream:
        def chunk(text, finish, first=False):
            if first:
                return None
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

        return Stream(_stream(state, prep, chunk, rid, created, "text_completion"),
                      media_type="text/event-stream", headers=SSE_HEADERS)
    text, done = await _complete(request, state, prep)
    return Response({**_envelope(state, "text_completion", rid, created),
                     "choices": [{"index": 0, "text": text, "logprobs": None,
                                  "finish_reason": done.finish_reason}],
                     "usage": _usage(done)})


@get("/v1/models")
async def models(state: State) -> dict:
    return {"object": "list", "data": [{"id": state.plan.model.id, "object": "model",
                                        "created": state.started, "owned_by": "appliance"}]}


@get("/v1/plan")
async def plan(state: State) -> dict:
    return state.plan.to_dict()


@get("/health")
async def health(state: State) -> dict:
    return {"status": "ok", "model": state.plan.model.id, "fingerprint": state.plan.fingerprint}


ROUTES = [chat_completions, completions, models, plan, health]
