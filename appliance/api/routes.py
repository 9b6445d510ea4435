"""The OpenAI-compatible endpoints, plus /v1/plan, /stats and /health."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator

from litestar import Request, get, post
from litestar.datastructures import State
from litestar.params import FromPath, JSONBody
from litestar.response import Response, Stream

from appliance.api import anthropic, metrics, responses, wire
from appliance.api.errors import APIError, ClientGone, generation_failed, typed
from appliance.api.requests import Prepared, prepare_chat, prepare_completion
from appliance.api.schemas import ChatCompletionRequest, CompletionRequest
from appliance.api.textgen import Done, Piece, generate
from appliance.plan.plan import without_paths

log = logging.getLogger("appliance.api")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def _watch_disconnect(request: Request) -> None:
    """Returns when the client goes away (the body is already read, so only
    http.disconnect can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, gen, awaitable):
    """Await `awaitable`; if the client goes away first, close `gen` (cancelling the
    engine request) and answer 499 to nobody."""
    work = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_watch_disconnect(request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not work.done():
        work.cancel()
        # Let the cancelled task leave `gen` first: closing a generator that is still
        # running raises (that surfaced as a 500 for a client that had gone).
        await asyncio.gather(work, return_exceptions=True)
        await gen.aclose()
        raise ClientGone
    return work.result()


async def _complete(request: Request, state: State, prep: Prepared) -> tuple[list[Piece], Done]:
    """Run a non-streaming request to the end."""
    pieces: list[Piece] = []
    gen = metrics.watch(request, generate(state.engine, state.tokenizer, prep))

    async def collect() -> Done:
        async for item in gen:
            if isinstance(item, Done):
                return item
            pieces.append(item)
        raise RuntimeError("generation ended without a result")

    done = await _unless_disconnected(request, gen, collect())
    if done.error:
        raise generation_failed(done.error)
    return pieces, done


async def _respond(request: Request, state: State, prep: Prepared, fmt, stream: bool):
    rid, created = f"{fmt.id_prefix}{uuid.uuid4().hex[:24]}", int(time.time())
    if not stream:
        pieces, done = await _complete(request, state, prep)
        text = "".join(p.text for p in pieces if isinstance(p, Piece))  # not tool calls
        return Response({**wire.envelope(state.plan, fmt.kind, rid, created),
                         "choices": [fmt.choice(text, pieces, done.finish_reason)],
                         "usage": wire.usage(done)})
    gen = metrics.watch(request, generate(state.engine, state.tokenizer, prep))
    # Refusals (400/429) must be HTTP errors, not a broken stream: wait for the first piece.
    first = await _unless_disconnected(request, gen, gen.__anext__())
    if isinstance(first, Done) and first.error:  # failed before any token: a plain 500
        raise generation_failed(first.error)

    async def frames() -> AsyncIterator[bytes]:
        env = wire.envelope(state.plan, fmt.chunk_kind, rid, created)
        if prep.include_usage:  # every chunk but the last carries usage null (OpenAI's)
            env["usage"] = None
        if (c := fmt.first_chunk()) is not None:
            yield wire.sse({**env, "choices": [c]})
        item = first
        try:
            while True:
                if isinstance(item, Done):
                    if item.error:
                        yield wire.sse(generation_failed(item.error).body())
                        break
                    yield wire.sse({**env, "choices": [fmt.chunk(None, item.finish_reason)]})
                    if prep.include_usage:
                        yield wire.sse({**env, "choices": [], "usage": wire.usage(item)})
                    break
                if (c := fmt.chunk(item, None)) is not None:
                    yield wire.sse({**env, "choices": [c]})
                item = await gen.__anext__()
        finally:
            await gen.aclose()  # client gone: cancels the engine request
        yield b"data: [DONE]\n\n"

    return Stream(frames(), media_type="text/event-stream", headers=SSE_HEADERS)


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request, state: State,
                           data: JSONBody[ChatCompletionRequest]) -> Response | Stream:
    await typed(request, ChatCompletionRequest)
    metrics.tag_agent(request, data.user)
    # templates and tokenization run off the event loop: /health never waits behind them
    prep = await asyncio.to_thread(prepare_chat, data, state.plan, state.tokenizer)
    fmt = wire.Chat(state.tokenizer, prep.engine_request.logprobs is not None)
    return await _respond(request, state, prep, fmt, data.stream)


@post("/v1/completions", status_code=200)
async def completions(request: Request, state: State,
                      data: JSONBody[CompletionRequest]) -> Response | Stream:
    await typed(request, CompletionRequest)
    metrics.tag_agent(request, data.user)
    prep = await asyncio.to_thread(prepare_completion, data, state.plan, state.tokenizer)
    fmt = wire.Completion(state.tokenizer, prep.engine_request.logprobs is not None)
    return await _respond(request, state, prep, fmt, data.stream)


def _model(state: State) -> dict:
    return {"id": state.plan.model.id, "object": "model", "created": state.started,
            "owned_by": "appliance"}


@get("/v1/models")
async def models(state: State) -> dict:
    return {"object": "list", "data": [_model(state)]}


@get("/v1/models/{model_id:path}")
async def model(state: State, model_id: FromPath[str]) -> dict:
    """One model (the openai client's `models.retrieve`); ids may hold a '/'."""
    model_id = model_id.lstrip("/")  # (a path parameter keeps its leading '/')
    if model_id != state.plan.model.id:
        raise APIError(404, f"model {model_id!r} does not exist; this server "
                            f"serves {state.plan.model.id!r}", param="model",
                       code="model_not_found")
    return _model(state)


@get("/v1/plan")
async def plan(state: State) -> dict:
    """Without an API key anyone on the bind can read it: no absolute paths then."""
    return state.plan.to_dict(public=not state.plan.server.api_key)


@get("/stats")
async def stats(state: State) -> dict:
    """Without an API key, as /v1/plan: no absolute paths (the SSD tier's)."""
    body = {"fingerprint": state.plan.fingerprint, **state.engine.stats()}
    return body if state.plan.server.api_key else without_paths(body)


@get("/health")
async def health(state: State) -> Response:
    """200 while the engine serves; 503 once it has failed (a supervisor's signal)."""
    failure = state.engine.failure
    body = {"status": "ok" if failure is None else "failed", "model": state.plan.model.id,
            "fingerprint": state.plan.fingerprint}
    if failure is not None:
        body["error"] = failure
    return Response(body, status_code=200 if failure is None else 503)


ROUTES = [chat_completions, completions, models, model, plan, stats, health,
          *anthropic.ROUTES, *responses.ROUTES]
