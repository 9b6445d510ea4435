"""Request and response bodies of the OpenAI-compatible endpoints (msgspec: fast, and the
source of the OpenAPI schema, `appliance.api.openapi`).

Unknown fields are accepted and ignored, as OpenAI clients send many; fields
that would change the output but are not implemented are refused in
`appliance.api.requests`, never silently dropped. Value ranges are msgspec
constraints, so what the schema states is what is enforced; ranges msgspec cannot
express (a 64-bit seed, the vocabulary's top_k) are stated with `extra_json_schema`
and enforced in `appliance.api.requests`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

MAX_LOGPROBS = 20
ROLES = ("system", "developer", "user", "assistant", "tool")

Penalty = Annotated[float, Meta(ge=-2, le=2)]
NonEmpty = Annotated[str, Meta(extra_json_schema={"minLength": 1})]  # checked in requests.py


class _Sampling(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=0, description="0: no top-k; below the vocabulary size")] \
        | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    seed: Annotated[int, Meta(ge=0, extra_json_schema={"maximum": 2**64 - 1})] | None = None
    stop: NonEmpty | list[NonEmpty] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: Annotated[int, Meta(extra_json_schema={"minimum": 1, "maximum": 1})] = 1
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Meta(gt=0, le=10)] | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100, le=100)]] | None = None
    user: str | None = None  # also the `agent` label of the metrics (GET /metrics)


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Annotated[str, Meta(extra_json_schema={"enum": list(ROLES)})]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None  # needs logprobs


class CompletionRequest(_Sampling, kw_only=True):
    prompt: Annotated[str, Meta(extra_json_schema={"minLength": 1})] \
        | Annotated[list[Annotated[int, Meta(ge=0)]], Meta(min_length=1)]
    echo: bool = False
    suffix: str | None = None
    # 0..20: the chosen token's log-probability and the top k
    logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None


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
