"""Request and response bodies of the OpenAI-compatible endpoints (msgspec: fast, and the
source of the OpenAPI schema, `appliance.api.openapi`).

Nothing is silently dropped: a field outside these structs is refused with a 400 naming
it (`forbid_unknown_fields`), so every field a request may carry is in the OpenAPI schema.
Known OpenAI fields this server does not implement are declared as `Refused` (documented
as such) and refused by name in `appliance.api.requests` when set; fields that change
nothing here (`user`, `metadata`, `prompt_cache_key`, ...) say why in their description.
Value ranges are msgspec constraints, so what the schema states is what is enforced;
ranges msgspec cannot express (a 64-bit seed, the vocabulary's top_k) are stated with
`extra_json_schema` and enforced in `appliance.api.requests`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

MAX_LOGPROBS = 20
ROLES = ("system", "developer", "user", "assistant", "tool")

Penalty = Annotated[float, Meta(ge=-2, le=2)]
# A known field this server does not implement: refused with a 400 naming it when set.
Refused = Annotated[Any, Meta(description="Not supported: a request that sets it is refused "
                                          "with a 400 naming the field")]


def no_effect(why: str) -> Meta:
    return Meta(description=f"Accepted; it changes nothing here: {why}")
NonEmpty = Annotated[str, Meta(extra_json_schema={"minLength": 1})]  # checked in requests.py


class _Sampling(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=0, description="0: no top-k; below the vocabulary size")] \
        | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    seed: Annotated[int, Meta(ge=0, extra_json_schema={"maximum": 2**64 - 1})] | None = None
    stop: NonEmpty | list[NonEmpty] | None = None
    stream: bool | None = False  # (null: the default, as OpenAI's API reads it)
    stream_options: dict[str, Any] | None = None
    n: Annotated[int, Meta(extra_json_schema={"minimum": 1, "maximum": 1})] | None = 1
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Meta(gt=0, le=10)] | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100, le=100)]] | None = None
    user: Annotated[str, Meta(description="The `agent` label of the metrics (GET /metrics)")
                    ] | None = None


class ChatMessage(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    role: Annotated[str, Meta(extra_json_schema={"enum": list(ROLES)})]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    # What an assistant message returned by the API carries, when it is sent back:
    annotations: Annotated[list[Any], no_effect("output metadata")] | None = None
    refusal: Refused = None
    audio: Refused = None
    function_call: Refused = None


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Annotated[Any, Meta(description=(
        "'none' (tools stay in the prompt, no call is made), 'auto', 'required' or "
        "{type: function, function: {name}}; the last two are enforced by constrained "
        "decoding (models that write calls as JSON)"))] = None
    parallel_tool_calls: Annotated[bool, Meta(description="false: at most one call")
                                   ] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None  # needs logprobs
    store: Annotated[bool, Meta(description="false only: nothing is stored")] | None = None
    metadata: Annotated[dict[str, Any], no_effect("nothing is stored")] | None = None
    service_tier: Annotated[str, no_effect("one tier; 'auto' or 'default' only")] | None = None
    modalities: Annotated[list[str], Meta(description="['text'] only")] | None = None
    prompt_cache_key: Annotated[str, no_effect("prefix caching is automatic")] | None = None
    safety_identifier: Annotated[str, no_effect("no moderation runs here")] | None = None
    # Known, not supported (refused by name when set):
    functions: Refused = None
    function_call: Refused = None
    reasoning_effort: Refused = None
    audio: Refused = None
    prediction: Refused = None
    web_search_options: Refused = None
    verbosity: Refused = None
    moderation: Refused = None
    prompt_cache_options: Refused = None
    prompt_cache_retention: Refused = None


class CompletionRequest(_Sampling, kw_only=True):
    # a string, token ids, or OpenAI's batch form ([string] or [[ids]]) holding one prompt:
    # n=1, so a batch of two or more is refused by name, not read as token ids
    prompt: Annotated[str, Meta(extra_json_schema={"minLength": 1})] \
        | Annotated[list[Annotated[int, Meta(ge=0)] | str | list[Annotated[int, Meta(ge=0)]]],
                    Meta(min_length=1)]
    echo: bool = False
    suffix: str | None = None
    # 0..20: the chosen token's log-probability and the top k
    logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    best_of: Annotated[int, Meta(extra_json_schema={"minimum": 1, "maximum": 1},
                                 description="1 only")] | None = None


# -- responses (documentation only: the handlers build plain dicts) ------------------------
class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct):
    """Every failure, OpenAI's shape."""

    error: ErrorDetail


class AnthropicErrorDetail(msgspec.Struct):
    type: str
    message: str


class AnthropicError(msgspec.Struct):
    """Every failure of /v1/messages*, Anthropic's shape."""

    type: Literal["error"]
    error: AnthropicErrorDetail


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int  # taken from the prefix cache


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


Finish = Literal["stop", "length", "tool_calls"]


class AssistantMessage(msgspec.Struct):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[dict[str, Any]] | msgspec.UnsetType = msgspec.UNSET


class ChatChoice(msgspec.Struct):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None
    finish_reason: Finish


class ChatCompletion(msgspec.Struct):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str  # the plan's fingerprint
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: Finish


class Completion(msgspec.Struct):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: Usage


class Model(msgspec.Struct):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(msgspec.Struct):
    object: Literal["list"]
    data: list[Model]


class Health(msgspec.Struct):
    status: Literal["ok", "failed"]
    model: str
    fingerprint: str
    error: str | msgspec.UnsetType = msgspec.UNSET  # why the engine failed (with 503)
