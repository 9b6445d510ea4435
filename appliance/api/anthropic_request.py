"""Anthropic's Messages API, the request side: the body's fields (unknown ones refused,
those that change nothing named), and its translation into OpenAI chat terms
(`Conversation`): system prompt, content blocks, `tool_use` as assistant tool calls,
`tool_result` as tool messages, Anthropic's `tool_choice` as OpenAI's."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from appliance.api.errors import APIError, invalid, only_known
from appliance.api.output import response_schema
from appliance.api.requests import (
    Conversation,
    Prepared,
    _stops,
    nucleus,
    prepare_conversation,
)
from appliance.api.schemas import Refused, no_effect
from appliance.engine import SamplingParams

# (each message's blocks are checked in `_messages`, naming the field)
Messages = Annotated[list[Annotated[dict[str, Any], Meta(extra_json_schema={
    "required": ["role", "content"], "properties": {"role": {"enum": ["user", "assistant"]}}})]],
    Meta(min_length=1)]


class MessagesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    max_tokens: Annotated[int, Meta(ge=1)]
    messages: Messages
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None  # (below the vocabulary: checked below)
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    output_config: Annotated[dict[str, Any], Meta(
        description="format: a JSON schema, enforced by constrained decoding")] | None = None
    cache_control: Annotated[dict[str, Any], no_effect("prefix caching is automatic")
                             ] | None = None
    # (checked in `user_id`: Litestar names a nested struct's field by deleting "data."
    # from its path, so `metadata.user_id` read "metauser_id")
    metadata: Annotated[dict[str, Any], Meta(description="user_id: the `agent` label of the "
                                                         "metrics", extra_json_schema={
        "properties": {"user_id": {"type": ["string", "null"], "maxLength": 256}},
        "additionalProperties": False})] | None = None
    service_tier: Annotated[str, no_effect("one tier; 'auto' or 'standard_only'")
                            ] | None = None
    user_profile_id: Annotated[str, no_effect("attribution only")] | None = None
    workspace_id: Annotated[str, no_effect("attribution only")] | None = None
    speed: Annotated[str, Meta(description="'standard' only")] | None = None
    # Known, not supported: refused when set.
    thinking: Refused = None
    container: Refused = None
    mcp_servers: Refused = None
    context_management: Refused = None
    diagnostics: Refused = None
    inference_geo: Refused = None
    thread: Refused = None


REFUSED = {"thinking": "extended thinking is not supported",
           "container": "code-execution containers are not supported",
           "mcp_servers": "MCP servers are not supported",
           "context_management": "context management is not supported",
           "diagnostics": "prompt-cache diagnostics are not supported",
           "inference_geo": "this server runs where it runs",
           # (the SDK's beta tool_runner asks for one)
           "thread": "server-side message threads are not kept: send the conversation in "
                     "messages"}

# What each block may carry. cache_control is accepted: prefix caching here is automatic,
# so every breakpoint is honored (and more).
BLOCK_KEYS = {"text": ("type", "text", "cache_control", "citations"),
              "tool_use": ("type", "id", "name", "input", "cache_control"),
              "tool_result": ("type", "tool_use_id", "content", "is_error", "cache_control")}


# Fields the SDK writes when it echoes a block back (`model_dump()`): taken where they ask for
# nothing, a call the model made itself (no toolset, no code-execution caller)
INERT = {"caller": (None, {"type": "direct"}), "toolset_name": (None,)}


def _text(blocks, param: str) -> str:
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise invalid(param, "must be a string or a list of text blocks")
    for j, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"),
                                                                                 str):
            kind = b.get("type") if isinstance(b, dict) else type(b).__name__
            raise invalid(f"{param}[{j}].type", f"{kind!r} blocks are not supported here "
                                                "(text only)")
        only_known(b, BLOCK_KEYS["text"], f"{param}[{j}]")
    return "".join(b["text"] for b in blocks)


def _messages(body: MessagesRequest) -> tuple[list[dict], list[str]]:
    """The conversation in chat terms, and where each of its messages came from."""
    out: list[dict] = []
    sources: list[str] = []

    def add(msg: dict, src: str) -> None:
        out.append(msg)
        sources.append(src)

    if body.system is not None:
        add({"role": "system", "content": _text(body.system, "system")}, "system")
    for i, m in enumerate(body.messages):
        role, content = m.get("role"), m.get("content")
        only_known(m, ("role", "content"), f"messages[{i}]")
        if role not in ("user", "assistant"):
            raise invalid(f"messages[{i}].role", f"{role!r} is not one of user, assistant")
        if isinstance(content, str):
            add({"role": role, "content": content}, f"messages[{i}]")
            continue
        if not isinstance(content, list):
            raise invalid(f"messages[{i}].content", "must be a string or a list of blocks")
        text, calls = [], []
        for j, b in enumerate(content):
            kind = b.get("type") if isinstance(b, dict) else None
            where = f"messages[{i}].content[{j}]"
            if kind in BLOCK_KEYS:
                only_known(b, BLOCK_KEYS[kind], where, INERT)
            if kind == "text" and isinstance(b.get("text"), str):
                text.append(b["text"])
            elif kind == "tool_use" and role == "assistant":
                for key in ("id", "name"):
                    if not isinstance(b.get(key), str) or not b[key]:
                        raise invalid(f"{where}.{key}", "is required in a tool_use block")
                if not isinstance(b.get("input", {}), dict):
                    raise invalid(f"{where}.input", "must be an object")
                calls.append({"id": b["id"], "type": "function",
                              "function": {"name": b["name"], "arguments": b.get("input") or {}}})
            elif kind == "tool_result" and role == "user":
                if text:  # (as Anthropic's API: the results answer the turn before them)
                    raise invalid(where, "tool_result blocks come first in a user message, "
                                         "before any text")
                if not isinstance(b.get("tool_use_id"), str) or not b["tool_use_id"]:
                    raise invalid(f"{where}.tool_use_id", "is required in a tool_result block")
                result = _text(b.get("content") or "", f"{where}.content")
                if b.get("is_error"):
                    result = f"Error: {result}"
                add({"role": "tool", "tool_call_id": b["tool_use_id"], "content": result}, where)
            else:
                raise invalid(f"{where}.type", f"{kind!r} blocks are not supported in "
                                               f"{role} messages")
        if text or calls or not any(isinstance(b, dict) and b.get("type") == "tool_result"
                                    for b in content):
            msg = {"role": role, "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            add(msg, f"messages[{i}]")
    return out, sources


def _tools(tools) -> list[dict] | None:
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
            kind = t.get("type") if isinstance(t, dict) else None
            raise invalid(f"tools[{i}].type", f"{kind!r}: only client tools (name, "
                                              "input_schema) are supported")
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise invalid(f"tools[{i}].name", "every tool needs a name")
        only_known(t, ("type", "name", "description", "input_schema", "cache_control",
                       "strict"), f"tools[{i}]")
        if not isinstance(t.get("input_schema"), dict):
            raise invalid(f"tools[{i}].input_schema", "must be a JSON schema object")
        if not isinstance(t.get("strict", False), bool | None):
            raise invalid(f"tools[{i}].strict", "must be a boolean")
        fn = {"name": t["name"], "parameters": t["input_schema"]}
        fn |= {k: t[k] for k in ("description", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


# the keys each of Anthropic's tool_choice types has
CHOICE_KEYS = {"auto": ("type", "disable_parallel_tool_use"),
               "any": ("type", "disable_parallel_tool_use"),
               "tool": ("type", "name", "disable_parallel_tool_use"), "none": ("type",)}


def _tool_choice(choice) -> tuple[Any, bool | None]:
    """Anthropic's tool_choice as (OpenAI's tool_choice, parallel_tool_calls)."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    if not isinstance(kind, str) or kind not in CHOICE_KEYS:
        raise invalid("tool_choice.type", f"{kind!r} is not one of auto, any, tool, none")
    only_known(choice, CHOICE_KEYS[kind], "tool_choice")
    if not isinstance(choice.get("disable_parallel_tool_use", False), bool | None):
        raise invalid("tool_choice.disable_parallel_tool_use", "must be a boolean")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise invalid("tool_choice.name", "names the tool to use (a string)")
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    return {"any": "required"}.get(kind, kind), parallel


def prepare_messages(body: MessagesRequest, plan, tokenizer, count_only: bool = False
                     ) -> Prepared:
    """`count_only`: for count_tokens, which counts a prompt past the context limit too
    (a client counts to learn when to compact)."""
    if body.model != plan.model.id:
        raise APIError(404, f"model: {body.model!r} does not exist; this server serves "
                            f"{plan.model.id!r}", param="model", code="model_not_found")
    for name, why in REFUSED.items():
        if getattr(body, name) is not None:
            raise invalid(name, why)
    if body.service_tier not in (None, "auto", "standard_only"):
        raise invalid("service_tier", f"{body.service_tier!r}: this server has one tier "
                                      "('auto' or 'standard_only')")
    if body.speed not in (None, "standard"):
        raise invalid("speed", f"{body.speed!r}: only 'standard' is supported")
    oc = body.output_config or {}
    if oc.get("effort") is not None:
        raise invalid("output_config.effort", "effort control is not supported")
    only_known(oc, ("format",), "output_config", inert={"effort": (None,)})
    schema = None
    if oc.get("format") is not None:
        fmt = oc["format"]
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            raise invalid("output_config.format.type", "only 'json_schema' is supported")
        only_known(fmt, ("type", "schema"), "output_config.format")
        schema = response_schema({"type": "json_schema", "json_schema": {"schema":
                                  fmt.get("schema")}}, "output_config.format")
    vocab = plan.model.vocab_size
    if body.top_k is not None and not 0 <= body.top_k < vocab:
        raise invalid("top_k", f"{body.top_k} is out of range [0, {vocab})")
    sampling = SamplingParams(
        temperature=plan.server.default_temperature if body.temperature is None
        else body.temperature,
        **nucleus(plan, body.top_p, body.top_k))
    tool_choice, parallel = _tool_choice(body.tool_choice)
    messages, sources = _messages(body)
    conv = Conversation(messages, _tools(body.tools), tool_choice, parallel, schema,
                        max_tokens=("max_tokens", body.max_tokens), sources=tuple(sources),
                        schema_param="output_config.format.schema",
                        continue_final=body.messages[-1].get("role") == "assistant",
                        count_only=count_only)
    return prepare_conversation(conv, sampling, _stops(body.stop_sequences, "stop_sequences"), plan,
                                tokenizer)


def user_id(body: MessagesRequest) -> str | None:
    """`metadata.user_id`, the one key Anthropic's `metadata` holds (its API refuses others)."""
    meta = body.metadata or {}
    only_known(meta, ("user_id",), "metadata")
    user = meta.get("user_id")
    if user is not None and (not isinstance(user, str) or len(user) > 256):
        raise invalid("metadata.user_id", "must be a string of at most 256 characters")
    return user


class CountTokensRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The fields of /v1/messages that shape the prompt (and those that change nothing)."""

    model: str
    messages: Messages
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    cache_control: Annotated[dict[str, Any], no_effect("prefix caching is automatic")
                             ] | None = None
    speed: Annotated[str, Meta(description="'standard' only")] | None = None
    user_profile_id: Annotated[str, no_effect("attribution only")] | None = None
    workspace_id: Annotated[str, no_effect("attribution only")] | None = None
    thinking: Refused = None
