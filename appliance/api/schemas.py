"""Request bodies of the OpenAI-compatible endpoints (msgspec: fast, and in the OpenAPI schema).

Unknown fields are accepted and ignored, as OpenAI clients send many; fields
that would change the output but are not implemented are refused in
`appliance.api.requests`, never silently dropped.
"""

from __future__ import annotations

from typing import Any

import msgspec


class _Sampling(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_Sampling, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None  # 0..20, needs logprobs=true


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | list[int]
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None  # 0..20: the chosen token's log-probability and the top k
