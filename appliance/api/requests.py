"""Validate an OpenAI request and turn it into token ids + engine settings.

Prompts are tokenized exactly as mlx-lm's server does, so the appliance is a
drop-in replacement with the same outputs: completions use
`tokenizer.encode(prompt)`, chat uses the model's chat template with the
generation prompt.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from appliance.api.errors import APIError, invalid
from appliance.api.schemas import ChatCompletionRequest, CompletionRequest, _Sampling
from appliance.engine import GenerationRequest, SamplingParams
from appliance.plan import ExecutionPlan

ROLES = ("system", "developer", "user", "assistant", "tool")


MAX_TOP_LOGPROBS = 20


def _logprobs(name: str, value: int | None) -> int | None:
    if value is not None and not 0 <= value <= MAX_TOP_LOGPROBS:
        raise invalid(name, f"{value} is out of range [0, {MAX_TOP_LOGPROBS}]")
    return value


@dataclass(frozen=True)
class Prepared:
    engine_request: GenerationRequest
    stop: tuple[str, ...]
    include_usage: bool


def _check_model(body: _Sampling, plan: ExecutionPlan) -> None:
    if body.model != plan.model.id:
        raise APIError(404, f"model {body.model!r} does not exist; this server serves "
                            f"{plan.model.id!r} (GET /v1/models)", param="model",
                       code="model_not_found")


def _range(name: str, value, lo, hi, lo_open=False) -> None:
    if value is None:
        return
    if value < lo or value > hi or (lo_open and value == lo):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise invalid(name, f"{value} is out of range {bound}")


def _sampling(body: _Sampling, plan: ExecutionPlan, vocab: int) -> SamplingParams:
    _range("temperature", body.temperature, 0, 2)
    _range("top_p", body.top_p, 0, 1, lo_open=True)
    _range("min_p", body.min_p, 0, 1)
    _range("presence_penalty", body.presence_penalty, -2, 2)
    _range("frequency_penalty", body.frequency_penalty, -2, 2)
    _range("repetition_penalty", body.repetition_penalty, 0, 10, lo_open=True)
    if body.top_k is not None and body.top_k < 0:
        raise invalid("top_k", f"{body.top_k} must be >= 0")
    if body.n != 1:
        raise invalid("n", f"{body.n}: only n=1 is supported")
    bias = None
    if body.logit_bias:
        bias = {}
        for k, v in body.logit_bias.items():
            if not k.lstrip("-").isdigit() or not 0 <= int(k) < vocab:
                raise invalid("logit_bias", f"key {k!r} is not a token id in [0, {vocab})")
            _range("logit_bias", v, -100, 100)
            bias[int(k)] = float(v)
    return SamplingParams(
        temperature=plan.server.default_temperature if body.temperature is None
        else body.temperature,
        top_p=plan.server.default_top_p if body.top_p is None else body.top_p,
        top_k=body.top_k or 0, min_p=body.min_p or 0.0, seed=body.seed,
        repetition_penalty=body.repetition_penalty, presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty, logit_bias=bias,
    )


def _stops(stop) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not s for s in stops):
        raise invalid("stop", "stop sequences must be non-empty strings")
    return tuple(stops)


def _max_tokens(requested: int | None, prompt_len: int, plan: ExecutionPlan, name: str) -> int:
    limit = plan.server.max_context
    if prompt_len == 0:
        raise invalid("prompt" if name == "max_tokens" else "messages", "the prompt is empty")
    if prompt_len >= limit:
        raise invalid(name, f"the prompt has {prompt_len} tokens; this server's context "
                            f"limit is {limit} tokens (server.max_context)")
    if requested is None:  # unspecified: as much as fits, up to the default
        return min(plan.server.default_max_tokens, limit - prompt_len)
    if requested < 1:
        raise invalid(name, f"{requested} must be >= 1")
    if prompt_len + requested > limit:
        raise invalid(name, f"prompt ({prompt_len} tokens) + {name} ({requested}) exceeds "
                            f"this server's context limit of {limit} tokens (server.max_context)")
    return requested


def _message_dict(i: int, m) -> dict:
    if m.role not in ROLES:
        raise invalid(f"messages[{i}].role", f"{m.role!r} is not one of {', '.join(ROLES)}")
    content = m.content
    if isinstance(content, list):  # text parts only, joined (as mlx-lm's server does)
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in content):
            raise invalid(f"messages[{i}].content", "only 'text' content parts are supported")
        content = "".join(p["text"] for p in content)
    d = {"role": m.role, "content": content or ""}
    for k in ("name", "tool_calls", "tool_call_id"):
        if getattr(m, k) is not None:
            d[k] = getattr(m, k)
    return d


def prepare_chat(body: ChatCompletionRequest, plan: ExecutionPlan, tokenizer) -> Prepared:
    _check_model(body, plan)
    if not body.messages:
        raise invalid("messages", "must contain at least one message")
    if body.response_format and body.response_format.get("type") not in (None, "text"):
        raise invalid("response_format", "structured output is not supported yet")
    messages = [_message_dict(i, m) for i, m in enumerate(body.messages)]
    sampling = _sampling(body, plan, plan.model.vocab_size)
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                            tools=body.tools, tokenize=True)
    except Exception as e:  # template errors (e.g. bad role order) are the caller's
        raise invalid("messages", f"the chat template rejected them: {e}") from e
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    checkpoints = _message_boundaries(tokenizer, messages, body.tools, ids)
    if body.max_completion_tokens is not None:
        name, requested = "max_completion_tokens", body.max_completion_tokens
    else:
        name, requested = "max_tokens", body.max_tokens
    max_tokens = _max_tokens(requested, len(ids), plan, name)
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs", "requires logprobs=true")
    k = _logprobs("top_logprobs", body.top_logprobs or 0) if body.logprobs else None
    return Prepared(GenerationRequest(ids, max_tokens, sampling, logprobs=k,
                                      checkpoints=checkpoints), _stops(body.stop),
                    bool((body.stream_options or {}).get("include_usage")))


MAX_CHECKPOINT_RENDERS = 8  # templates rendered per request to find message ends


def _message_boundaries(tokenizer, messages: list[dict], tools, ids: list[int]) -> tuple[int, ...]:
    """Where messages end in `ids`: prefixes other requests share (the system prompt for
    every agent, earlier turns for a branch), so prefix-cache checkpoints belong there.
    Short conversations get every message end; long ones the system end and the last two."""
    n = len(messages)
    n_sys = next((i for i, m in enumerate(messages) if m["role"] not in ("system", "developer")),
                 n)
    ks = range(1, n) if n <= MAX_CHECKPOINT_RENDERS else sorted({n_sys, n - 2, n - 1} - {0, n})
    out = []
    tools_json = json.dumps(tools)  # key order kept: a template may render it
    for k in ks:
        head = _head_ids(tokenizer, json.dumps(messages[:k]), tools_json)
        if head and len(head) < len(ids) and ids[:len(head)] == list(head):
            out.append(len(head))
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _head_ids(tokenizer, messages_json: str, tools_json: str) -> tuple[int, ...]:
    """The template's ids for the first messages of a conversation (no generation prompt).
    Agents resend one system prompt and their earlier turns, so these repeat: each is
    rendered and tokenized once (at 8k tokens that is ~8 ms off every request's path)."""
    try:
        head = tokenizer.apply_chat_template(json.loads(messages_json),
                                             tools=json.loads(tools_json),
                                             add_generation_prompt=False, tokenize=True)
    except Exception:  # e.g. a template that needs a user turn first: no checkpoint here
        return ()
    return tuple(head["input_ids"] if isinstance(head, dict) else head)


def prepare_completion(body: CompletionRequest, plan: ExecutionPlan, tokenizer) -> Prepared:
    _check_model(body, plan)
    if body.echo or body.suffix:
        raise invalid("echo" if body.echo else "suffix", "is not supported")
    sampling = _sampling(body, plan, plan.model.vocab_size)
    if isinstance(body.prompt, str):
        ids = list(tokenizer.encode(body.prompt))
    else:
        if any(not 0 <= t < plan.model.vocab_size for t in body.prompt):
            raise invalid("prompt", f"token ids must be in [0, {plan.model.vocab_size})")
        ids = list(body.prompt)
    max_tokens = _max_tokens(body.max_tokens, len(ids), plan, "max_tokens")
    k = _logprobs("logprobs", body.logprobs)
    return Prepared(GenerationRequest(ids, max_tokens, sampling, logprobs=k), _stops(body.stop),
                    bool((body.stream_options or {}).get("include_usage")))
