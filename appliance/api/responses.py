"""OpenAI's Responses API (`POST /v1/responses`): text, function tools, structured output and
streaming events, over the same chat pipeline. Stateless: nothing is stored, so
`previous_response_id` and `store=true` are refused (send the whole conversation)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody
from litestar.response import Stream
from msgspec import Meta

from appliance.api import metrics
from appliance.api.errors import APIError, generation_failed, invalid, only_known, typed
from appliance.api.output import annotations, response_schema
from appliance.api.requests import (
    Conversation,
    Prepared,
    nucleus,
    prepare_conversation,
    stream_options,
)
from appliance.api.schemas import Refused, no_effect
from appliance.api.textgen import Done, Piece, generate
from appliance.api.tools import message_tool_calls
from appliance.api.toolstream import CallArgs, CallStart, ToolCall
from appliance.engine import SamplingParams


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    stream: bool = False
    stream_options: Annotated[dict[str, Any], Meta(
        description="include_obfuscation: false only (events are not obfuscated)")] | None = None
    metadata: Annotated[dict[str, Any], no_effect("echoed in the response")] | None = None
    user: Annotated[str, Meta(description="The `agent` label of the metrics")] | None = None
    store: Annotated[bool, Meta(description="false only: nothing is stored")] | None = None
    truncation: Annotated[str, Meta(description="'disabled' only")] | None = None
    service_tier: Annotated[str, no_effect("one tier; 'auto' or 'default' only")] | None = None
    prompt_cache_key: Annotated[str, no_effect("prefix caching is automatic")] | None = None
    safety_identifier: Annotated[str, no_effect("no moderation runs here")] | None = None
    # Known, not supported: refused when set.
    previous_response_id: Refused = None
    reasoning: Refused = None
    include: Refused = None
    background: Refused = None
    background_options: Refused = None
    prompt: Refused = None
    conversation: Refused = None
    top_logprobs: Refused = None
    max_tool_calls: Refused = None
    context_management: Refused = None
    access_programs: Refused = None
    image: Refused = None
    moderation: Refused = None
    prompt_cache_options: Refused = None
    prompt_cache_retention: Refused = None


REFUSED = {"previous_response_id": "this server stores no responses; send the conversation",
           "conversation": "this server stores no conversations; send the conversation",
           "reasoning": "reasoning settings are not supported",
           "background": "background responses are not supported",
           "background_options": "background responses are not supported",
           "prompt": "stored prompts are not supported",
           "top_logprobs": "is not supported on /v1/responses (use /v1/chat/completions)",
           "max_tool_calls": "is not supported",
           "context_management": "context management is not supported",
           "access_programs": "is not supported",
           "image": "image options are not supported",
           "moderation": "no moderation runs here",
           "prompt_cache_options": "prefix caching is automatic: no breakpoints or TTLs",
           "prompt_cache_retention": "prefix caching is automatic: no retention policy"}


# What each input item may carry: an agent sends the API's own output items back, so their
# ids, statuses, phases and annotations are accepted (they describe that output, nothing to honor).
PART_KEYS = ("type", "text", "annotations", "logprobs")
ITEM_KEYS = {"message": ("type", "role", "content", "id", "status"),
             "function_call": ("type", "call_id", "name", "arguments", "id", "status"),
             "function_call_output": ("type", "call_id", "output", "id", "status")}


# What the SDK writes for fields it knows, where they ask for nothing: a call the model made
# itself, in no namespace, not run asynchronously; the phase a message's output was in
INERT = {"caller": (None, {"type": "direct"}), "namespace": (None,), "async": (None, False),
         "phase": (None, "commentary", "final_answer")}


def _content_text(content, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(param, "must be a string or a list of content parts")
    parts = []
    for j, p in enumerate(content):
        if not isinstance(p, dict) or p.get("type") not in ("input_text", "output_text",
                                                            "text"):
            kind = p.get("type") if isinstance(p, dict) else None
            raise invalid(f"{param}[{j}].type", f"{kind!r}: only text parts are supported")
        only_known(p, PART_KEYS, f"{param}[{j}]")
        parts.append(p.get("text") or "")
    return "".join(parts)


def _messages(body: ResponsesRequest) -> tuple[list[dict], list[str]]:
    """The conversation in chat terms, and where each of its messages came from."""
    out: list[dict] = []
    sources: list[str] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
        sources.append("instructions")
    if isinstance(body.input, str):
        return [*out, {"role": "user", "content": body.input}], [*sources, "input"]
    for i, item in enumerate(body.input):
        kind = item.get("type", "message")
        if kind in ITEM_KEYS:
            only_known(item, ITEM_KEYS[kind], f"input[{i}]", INERT)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise invalid(f"input[{i}].role", f"{role!r} is not one of user, assistant, "
                                                  "system, developer")
            out.append({"role": role, "content": _content_text(item.get("content"),
                                                               f"input[{i}].content")})
        elif kind in ("function_call", "function_call_output"):
            if not isinstance(item.get("call_id"), str) or not item["call_id"]:
                raise invalid(f"input[{i}].call_id", "is required (the id an output answers)")
            if kind == "function_call_output":
                out.append({"role": "tool", "tool_call_id": item["call_id"],
                            "content": _content_text(item.get("output") or "",
                                                     f"input[{i}].output")})
                sources.append(f"input[{i}]")
                continue
            if not isinstance(item.get("name"), str) or not item["name"]:
                raise invalid(f"input[{i}].name", "is required in a function_call")
            (call,) = message_tool_calls([{"id": item["call_id"], "type": "function",
                                           "function": {"name": item["name"], "arguments":
                                                        item.get("arguments") or "{}"}}],
                                         f"input[{i}]")
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)  # (a parallel call: the same turn)
                continue
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            raise invalid(f"input[{i}].type", f"{kind!r} items are not supported")
        sources.append(f"input[{i}]")
    return out, sources


def _tools(tools) -> list[dict] | None:
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise invalid(f"tools[{i}].type", f"{kind!r}: only function tools are supported")
        only_known(t, ("type", "name", "description", "parameters", "strict"), f"tools[{i}]")
        if not isinstance(t.get("strict", False), bool | None):
            raise invalid(f"tools[{i}].strict", "must be a boolean")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict")
              if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice):
    """Responses' tool_choice in chat terms (a named function is flat here)."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        only_known(choice, ("type", "name"), "tool_choice")
        if isinstance(choice.get("name"), str):
            return {"type": "function", "function": {"name": choice["name"]}}
    raise invalid("tool_choice", "must be 'none', 'auto', 'required' or "
                                 "{'type': 'function', 'name': ...}")


def _schema(text: dict | None) -> dict | None:
    only_known(text or {}, ("format",), "text")
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":  # flat, unlike chat's
        only_known(fmt, ("type", "name", "description", "schema", "strict"), "text.format")
        annotations(fmt, "text.format")
        spec = {k: v for k, v in fmt.items() if k != "type"}
        return response_schema({"type": "json_schema", "json_schema": spec}, "text.format")
    return response_schema(fmt, "text.format")


def prepare_response(body: ResponsesRequest, plan, tokenizer) -> Prepared:
    if body.model != plan.model.id:
        raise APIError(404, f"model: {body.model!r} does not exist; this server serves "
                            f"{plan.model.id!r}", param="model", code="model_not_found")
    for name, why in REFUSED.items():
        if getattr(body, name) is not None:
            raise invalid(name, why)
    if body.include:
        raise invalid("include", "no extra output data is supported")
    if body.store:
        raise invalid("store", "this server stores no responses")
    if body.truncation not in (None, "disabled"):
        raise invalid("truncation", "only 'disabled' is supported")
    if body.service_tier not in (None, "auto", "default"):
        raise invalid("service_tier", f"{body.service_tier!r}: this server has one tier "
                                      "('auto' or 'default')")
    stream_options(body, ("include_obfuscation",))
    if not body.input:
        raise invalid("input", "must not be empty")
    sampling = SamplingParams(
        temperature=plan.server.default_temperature if body.temperature is None
        else body.temperature,
        **nucleus(plan, body.top_p, None))
    messages, sources = _messages(body)
    conv = Conversation(messages, _tools(body.tools), _tool_choice(body.tool_choice),
                        body.parallel_tool_calls, _schema(body.text), sources=tuple(sources),
                        max_tokens=("max_output_tokens", body.max_output_tokens),
                        prompt_param="input", schema_param="text.format.schema")
    return prepare_conversation(conv, sampling, (), plan, tokenizer)


class _Builder:
    """The response object and its output items, as they accumulate."""

    def __init__(self, plan, body: ResponsesRequest):
        self.id, self.created = f"resp_{uuid.uuid4().hex[:24]}", int(time.time())
        self.msg_id = f"msg_{uuid.uuid4().hex[:24]}"
        self.plan, self.body, self.output, self.text = plan, body, [], None

    def response(self, status: str, done: Done | None = None) -> dict:
        b = self.body
        r = {"id": self.id, "object": "response", "created_at": self.created,
             "status": status, "model": self.plan.model.id, "output": self.output,
             "error": None, "incomplete_details": None, "instructions": b.instructions,
             "max_output_tokens": b.max_output_tokens, "metadata": b.metadata or {},
             "parallel_tool_calls": b.parallel_tool_calls is not False,
             "temperature": b.temperature, "top_p": b.top_p, "tools": b.tools or [],
             "tool_choice": b.tool_choice or "auto", "text": b.text or {"format":
                                                                         {"type": "text"}},
             "truncation": "disabled", "store": False, "previous_response_id": None,
             "reasoning": None, "user": b.user, "usage": None}
        if done is not None:
            if done.finish_reason == "length":
                r["incomplete_details"] = {"reason": "max_output_tokens"}
            r["usage"] = {"input_tokens": done.prompt_tokens,
                          "input_tokens_details": {"cached_tokens": done.cached_tokens},
                          "output_tokens": done.completion_tokens,
                          "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": done.prompt_tokens + done.completion_tokens}
        return r

    def message(self, text: str, status: str) -> dict:
        """`status` in_progress (no content yet), completed, or incomplete (cut off at
        max_output_tokens: OpenAI marks the message so)."""
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]
                if status != "in_progress" else []}

    @staticmethod
    def call(c: ToolCall, status: str) -> dict:
        return {"type": "function_call", "id": f"fc_{c.id.removeprefix('call_')}",
                "call_id": c.id, "name": c.name,
                "arguments": c.arguments if status != "in_progress" else "", "status": status}


@post("/v1/responses", status_code=200)
async def responses(request: Request, state: State,
                    data: JSONBody[ResponsesRequest]) -> Response | Stream:
    from appliance.api.routes import SSE_HEADERS, _complete, _unless_disconnected

    await typed(request, ResponsesRequest)
    metrics.tag_agent(request, data.user)
    prep = await asyncio.to_thread(prepare_response, data, state.plan, state.tokenizer)
    out = _Builder(state.plan, data)
    if not data.stream:
        items, done = await _complete(request, state, prep)
        text = "".join(p.text for p in items if isinstance(p, Piece))
        status = "incomplete" if done.finish_reason == "length" else "completed"
        calls = [c for c in items if isinstance(c, ToolCall) and c.complete]
        if text or not calls:
            out.output.append(out.message(text, status))
        out.output += [out.call(c, "completed") for c in calls]
        return Response(out.response(status, done))

    gen = metrics.watch(request, generate(state.engine, state.tokenizer, prep))
    first = await _unless_disconnected(request, gen, gen.__anext__())
    if isinstance(first, Done) and first.error:
        raise generation_failed(first.error)

    async def events() -> AsyncIterator[bytes]:
        seq = iter(range(1 << 62))

        def ev(kind: str, **data) -> bytes:
            return (f"event: {kind}\n".encode() + b"data: " + msgspec.json.encode(
                {"type": kind, "sequence_number": next(seq), **data}) + b"\n\n")

        yield ev("response.created", response=out.response("in_progress"))
        yield ev("response.in_progress", response=out.response("in_progress"))
        text, text_index, call_index, item = None, None, None, first
        try:
            while not isinstance(item, Done):
                if isinstance(item, Piece) and item.text:
                    if text is None:
                        text, text_index = "", len(out.output)
                        out.output.append(out.message("", "in_progress"))
                        yield ev("response.output_item.added", output_index=text_index,
                                 item=out.output[text_index])
                        yield ev("response.content_part.added", item_id=out.msg_id,
                                 output_index=text_index, content_index=0,
                                 part={"type": "output_text", "text": "", "annotations": []})
                    text += item.text
                    yield ev("response.output_text.delta", item_id=out.msg_id,
                             output_index=text_index, content_index=0, delta=item.text,
                             logprobs=[])
                elif isinstance(item, CallStart):
                    for b in _close_text(ev, out, text, text_index, "completed"):
                        yield b
                    text, call_index = None, len(out.output)
                    out.output.append(out.call(ToolCall(item.id, item.name, ""), "in_progress"))
                    yield ev("response.output_item.added", output_index=call_index,
                             item=out.output[call_index])
                elif isinstance(item, CallArgs) and item.text:
                    yield ev("response.function_call_arguments.delta",
                             item_id=out.output[call_index]["id"], output_index=call_index,
                             delta=item.text)
                elif isinstance(item, ToolCall):
                    fc = out.output[call_index]
                    yield ev("response.function_call_arguments.done", item_id=fc["id"],
                             output_index=call_index, arguments=item.arguments, name=item.name)
                    out.output[call_index] = out.call(item, "completed" if item.complete
                                                      else "incomplete")
                    yield ev("response.output_item.done", output_index=call_index,
                             item=out.output[call_index])
                item = await gen.__anext__()
            cut = item.finish_reason == "length"
            for b in _close_text(ev, out, text, text_index,
                                 "incomplete" if cut else "completed"):
                yield b
            if item.error:
                yield ev("error", code="generation_error", message=item.error, param=None)
                return
            # at max_output_tokens OpenAI ends with response.incomplete (not .completed)
            kind = "incomplete" if cut else "completed"
            yield ev(f"response.{kind}", response=out.response(kind, item))
        finally:
            await gen.aclose()

    return Stream(events(), media_type="text/event-stream", headers=SSE_HEADERS)


def _close_text(ev, out: _Builder, text: str | None, index: int | None, status: str):
    if text is None:
        return
    part = {"type": "output_text", "text": text, "annotations": []}
    yield ev("response.output_text.done", item_id=out.msg_id, output_index=index,
             content_index=0, text=text, logprobs=[])
    yield ev("response.content_part.done", item_id=out.msg_id, output_index=index,
             content_index=0, part=part)
    out.output[index] = out.message(text, status)
    yield ev("response.output_item.done", output_index=index, item=out.output[index])


ROUTES = [responses]
