"""Validate an OpenAI request and turn it into token ids + engine settings.

Prompts are tokenized exactly as mlx-lm's server does, so the appliance is a
drop-in replacement with the same outputs: completions use
`tokenizer.encode(prompt)`, chat uses the model's chat template with the
generation prompt.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from typing import Any

from appliance.api.errors import APIError, invalid, only_known
from appliance.api.output import output_spec, response_schema
from appliance.api.schemas import ChatCompletionRequest, CompletionRequest, _Sampling
from appliance.api.tools import ToolFormat, check_answers, message_tool_calls
from appliance.engine import GenerationRequest, SamplingParams
from appliance.engine.sampling import MAX_SEED
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
    tools: ToolFormat | None = None  # set: tool calls are parsed out of the text


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


def nucleus(plan: ExecutionPlan, top_p: float | None, top_k: int | None) -> dict:
    """The sampler's top_p and top_k. A top_p of 0, which OpenAI and Anthropic accept, keeps
    the smallest set of tokens whose probability reaches it: the most likely token alone,
    so top_k=1 (MLX's samplers read a top_p of 0 as no top-p at all)."""
    p = plan.server.default_top_p if top_p is None else top_p
    return {"top_p": 1.0, "top_k": 1} if p == 0 else {"top_p": p, "top_k": top_k or 0}


def _sampling(body: _Sampling, plan: ExecutionPlan, vocab: int) -> SamplingParams:
    _range("temperature", body.temperature, 0, 2)
    _range("top_p", body.top_p, 0, 1)
    _range("min_p", body.min_p, 0, 1)
    _range("presence_penalty", body.presence_penalty, -2, 2)
    _range("frequency_penalty", body.frequency_penalty, -2, 2)
    _range("repetition_penalty", body.repetition_penalty, 0, 10, lo_open=True)
    if body.top_k is not None and not 0 <= body.top_k < vocab:
        raise invalid("top_k", f"{body.top_k} is out of range [0, {vocab}) (0: no top-k; "
                               f"the vocabulary has {vocab} tokens)")
    if body.seed is not None and not 0 <= body.seed <= MAX_SEED:
        raise invalid("seed", f"{body.seed} is out of range [0, {MAX_SEED}]")
    if body.n not in (1, None):
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
        **nucleus(plan, body.top_p, body.top_k), min_p=body.min_p or 0.0, seed=body.seed,
        repetition_penalty=body.repetition_penalty, presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty, logit_bias=bias,
    )


def _stops(stop, param: str = "stop") -> tuple[str, ...]:
    """`param`: the field the request named them in."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not s for s in stops):
        raise invalid(param, "stop sequences must be non-empty strings")
    return tuple(stops)


def _max_tokens(requested: int | None, prompt_len: int, plan: ExecutionPlan, name: str,
                prompt: str) -> int:
    """`name`: the max-tokens field the request used; `prompt`: its prompt field."""
    limit = plan.server.max_context
    if prompt_len == 0:
        raise invalid(prompt, "the prompt is empty")
    if prompt_len >= limit:
        raise too_long(prompt, f"prompt is too long: {prompt_len} tokens > {limit - 1} "
                               "maximum (server.max_context, one token left to generate)")
    if requested is None:  # unspecified: as much as fits, up to the default
        return min(plan.server.default_max_tokens, limit - prompt_len)
    if requested < 1:
        raise invalid(name, f"{requested} must be >= 1")
    if prompt_len + requested > limit:  # (as OpenAI's and Anthropic's APIs say it)
        raise too_long(prompt, f"input length and `{name}` exceed context limit: "
                               f"{prompt_len} + {requested} > {limit}, decrease input length "
                               f"or `{name}` and try again (server.max_context)")
    return requested


def too_long(param: str, message: str) -> APIError:
    """The code agent frameworks look for to trim their history (OpenAI's; Anthropic's
    clients read the message's words), naming the prompt's field as OpenAI does."""
    return APIError(400, f"{param}: {message}", param=param, code="context_length_exceeded")


@functools.lru_cache(maxsize=8)
def _longest_token_bytes(tokenizer) -> int:
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return max((len(t.encode()) for t in vocab), default=0) or 64


def _refuse_if_surely_too_long(tokenizer, texts, plan: ExecutionPlan, param: str) -> None:
    """Before tokenizing: no token holds more than the vocabulary's longest entry, so text
    of more than that many bytes per token of the context limit cannot fit. A 5 MB prompt
    is refused here at once instead of being tokenized first (it took 10 s)."""
    size = sum(len(t.encode()) for t in texts if isinstance(t, str))
    floor = size // _longest_token_bytes(tokenizer)
    if floor >= plan.server.max_context:
        raise too_long(param, f"prompt is too long: {size:,} bytes, at least {floor:,} "
                              f"tokens > {plan.server.max_context - 1} maximum "
                              "(server.max_context)")


def _message_dict(i: int, m) -> dict:
    if m.role not in ROLES:
        raise invalid(f"messages[{i}].role", f"{m.role!r} is not one of {', '.join(ROLES)}")
    for name in ("refusal", "audio", "function_call"):
        if getattr(m, name) is not None:
            raise invalid(f"messages[{i}].{name}", "is not supported in messages")
    content = m.content
    if content is None and not (m.role == "assistant" and m.tool_calls):  # as OpenAI's
        raise invalid(f"messages[{i}].content", f"is required in a {m.role} message"
                      + (" without tool_calls" if m.role == "assistant" else ""))
    if m.role == "tool" and not m.tool_call_id:
        raise invalid(f"messages[{i}].tool_call_id", "is required in a tool message")
    if isinstance(content, list):  # text parts only, joined (as mlx-lm's server does)
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in content):
            raise invalid(f"messages[{i}].content", "only 'text' content parts are supported")
        for j, p in enumerate(content):
            only_known(p, ("type", "text"), f"messages[{i}].content[{j}]")
        content = "".join(p["text"] for p in content)
    d = {"role": m.role, "content": content or ""}
    for k in ("name", "tool_call_id"):
        if getattr(m, k) is not None:
            d[k] = getattr(m, k)
    if m.tool_calls:
        d["tool_calls"] = message_tool_calls(m.tool_calls, f"messages[{i}].tool_calls")
    return d


UNSUPPORTED = {
    "functions": "use tools (the legacy functions field is not supported)",
    "function_call": "use tool_choice (the legacy function_call field is not supported)",
    "reasoning_effort": "this server runs no reasoning models' effort control",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "verbosity": "is not supported",
    "moderation": "no moderation runs here",
    "prompt_cache_options": "prefix caching is automatic: no breakpoints or TTLs",
    "prompt_cache_retention": "prefix caching is automatic: no retention policy",
}


def refuse_unsupported(body, unsupported: dict[str, str]) -> None:
    """A 400 naming the first known-but-unsupported field the request sets."""
    for name, why in unsupported.items():
        if getattr(body, name, None) is not None:
            raise invalid(name, why)


def _chat_fields(body: ChatCompletionRequest) -> None:
    refuse_unsupported(body, UNSUPPORTED)
    if body.modalities is not None and body.modalities != ["text"]:
        raise invalid("modalities", "only ['text'] is supported")
    if body.store:
        raise invalid("store", "this server stores no completions")
    if body.service_tier not in (None, "auto", "default"):
        raise invalid("service_tier", f"{body.service_tier!r}: this server has one tier "
                                      "('auto' or 'default')")
    stream_options(body)


def stream_options(body, known: tuple[str, ...] = ("include_usage", "include_obfuscation")
                   ) -> None:
    """stream_options: include_usage is read (chat, completions); include_obfuscation only as
    false (no obfuscation padding is ever added); only with stream=true, as OpenAI requires."""
    so = body.stream_options
    if so is None:
        return
    if not body.stream:
        raise invalid("stream_options", "is only allowed when stream is true")
    only_known(so, known, "stream_options")
    if so.get("include_obfuscation"):
        raise invalid("stream_options.include_obfuscation",
                      "obfuscation padding is not supported (false is the only value)")


@dataclass(frozen=True)
class Conversation:
    """A chat request in OpenAI chat terms; the Anthropic and Responses endpoints build one.
    `*_param` name the fields of the endpoint's own request in errors."""

    messages: list[dict]
    tools: list | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    schema: dict | None = None
    max_tokens: tuple[str, int | None] = ("max_tokens", None)
    prompt_param: str = "messages"
    tools_param: str = "tools"
    schema_param: str = "response_format.json_schema.schema"
    # the final message is the assistant's, to continue (Anthropic's prefill), not to answer
    continue_final: bool = False
    count_only: bool = False  # only its tokens are asked for: no context limit applies
    sources: tuple[str, ...] = ()  # where each message came from (default: prompt_param[i])


def prepare_chat(body: ChatCompletionRequest, plan: ExecutionPlan, tokenizer) -> Prepared:
    _check_model(body, plan)
    _chat_fields(body)
    if not body.messages:
        raise invalid("messages", "must contain at least one message")
    messages = [_message_dict(i, m) for i, m in enumerate(body.messages)]
    if None not in (body.max_tokens, body.max_completion_tokens) and \
            body.max_tokens != body.max_completion_tokens:  # which one to honor? neither
        raise invalid("max_completion_tokens", f"is {body.max_completion_tokens} but max_tokens "
                      f"is {body.max_tokens}; send one of them (max_tokens is the older name)")
    if body.max_completion_tokens is not None:
        mt = ("max_completion_tokens", body.max_completion_tokens)
    else:
        mt = ("max_tokens", body.max_tokens)
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs", "requires logprobs=true")
    k = _logprobs("top_logprobs", body.top_logprobs or 0) if body.logprobs else None
    if body.parallel_tool_calls is not None and not body.tools:  # (OpenAI's 400 too)
        raise invalid("parallel_tool_calls", "is only allowed when tools are specified")
    conv = Conversation(messages, body.tools, body.tool_choice, body.parallel_tool_calls,
                        response_schema(body.response_format), mt)
    return prepare_conversation(conv, _sampling(body, plan, plan.model.vocab_size),
                                _stops(body.stop), plan, tokenizer, logprobs=k,
                                include_usage=bool((body.stream_options or {})
                                                   .get("include_usage")))


def prepare_conversation(conv: Conversation, sampling: SamplingParams, stops: tuple[str, ...],
                         plan: ExecutionPlan, tokenizer, logprobs: int | None = None,
                         include_usage: bool = False) -> Prepared:
    """Template, tokens, limits and output constraints of a conversation."""
    messages = conv.messages
    if not conv.count_only:
        _refuse_if_surely_too_long(tokenizer, [m["content"] for m in messages], plan,
                                   conv.prompt_param)
    out = output_spec(tokenizer, plan.model.vocab_size, conv.tools, conv.tool_choice,
                      conv.parallel_tool_calls, conv.schema, conv.tools_param,
                      conv.schema_param)
    if conv.continue_final:
        _check_prefill(messages[-1], out, conv.prompt_param)
    check_answers(messages, list(conv.sources) or
                  [f"{conv.prompt_param}[{i}]" for i in range(len(messages))])
    cont = conv.continue_final
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=not cont,
                                             continue_final_message=cont,
                                             tools=out.template_tools, tokenize=False)
    except Exception as e:  # template errors (e.g. bad role order) are the caller's
        raise invalid(conv.prompt_param, f"the chat template rejected them: {e}") from e
    ids, checkpoints = _chat_ids(tokenizer, messages, out.template_tools, text)
    max_tokens = 1 if conv.count_only else _max_tokens(
        conv.max_tokens[1], len(ids), plan, conv.max_tokens[0], conv.prompt_param)
    if out.grammar is not None:
        sampling = replace(sampling, constraint=out.grammar)
    if out.tools is not None and out.tools.max_calls == 1 and out.grammar is None:
        stops = (*stops, out.tools.end)  # one call: stop where it ends
    return Prepared(GenerationRequest(ids, max_tokens, sampling, logprobs=logprobs,
                                      checkpoints=checkpoints), stops, include_usage,
                    tools=out.tools)


def _check_prefill(last: dict, out, param: str) -> None:
    """A final assistant turn is continued as written: refused where that cannot hold."""
    if last.get("tool_calls"):
        raise invalid(param, "a final assistant turn with a tool call cannot be continued")
    if last["content"] != last["content"].rstrip():
        raise invalid(param, "a final assistant turn cannot end with whitespace")
    if out.grammar is not None and out.text_until is None:  # (it holds the reply from its start)
        raise invalid(param, "a final assistant turn cannot be continued under a forced "
                             "tool choice or an output format")
    if out.text_until and out.text_until in last["content"]:  # (a call begun: held to nothing)
        raise invalid(param, "a final assistant turn that starts a tool call cannot be "
                             "continued under strict tools or tool_choice none")


MAX_CHECKPOINT_RENDERS = 8  # templates rendered per request to find message ends


def _chat_ids(tokenizer, messages: list[dict], tools, text: str) -> tuple[list[int], tuple]:
    """The ids of the rendered conversation `text`, exactly `tokenizer.encode(text)` as the
    chat template's own tokenization gives them, and where its messages end in them.

    Agents resend one system prompt and their earlier turns, so a conversation's heads
    repeat: each head is rendered and tokenized once (LRU). Its ids are then reused for this
    request's text when the remaining text starts with a special token that splits the text
    there (tokenizers encode the pieces between such tokens independently); only the new
    tail is encoded. At 8k tokens that takes ~10 ms off every request's path."""
    n = len(messages)
    n_sys = next((i for i, m in enumerate(messages) if m["role"] not in ("system", "developer")),
                 n)
    ks = range(1, n) if n <= MAX_CHECKPOINT_RENDERS else sorted({n_sys, n - 2, n - 1} - {0, n})
    tools_json = json.dumps(tools)  # key order kept: a template may render it
    heads = [h for k in ks if (h := _head(tokenizer, json.dumps(messages[:k]), tools_json))[1]]
    splits = _splitting_tokens(tokenizer)
    reuse = next((h for h in reversed(heads) if text.startswith(h[0])
                  and text.startswith(splits, len(h[0]))), None)
    if reuse is not None:
        ids = list(reuse[1]) + list(tokenizer.encode(text[len(reuse[0]):],
                                                     add_special_tokens=False))
    else:
        ids = list(tokenizer.encode(text, add_special_tokens=False))
    ends = tuple(len(h_ids) for _, h_ids in heads
                 if len(h_ids) < len(ids) and ids[:len(h_ids)] == list(h_ids))
    return ids, ends


@functools.lru_cache(maxsize=64)
def _head(tokenizer, messages_json: str, tools_json: str) -> tuple[str, tuple[int, ...]]:
    """The template's text and ids for the first messages of a conversation (no generation
    prompt), or ("", ()) where the template cannot render them alone."""
    try:
        text = tokenizer.apply_chat_template(json.loads(messages_json),
                                             tools=json.loads(tools_json),
                                             add_generation_prompt=False, tokenize=False)
    except Exception:  # e.g. a template that needs a user turn first: no checkpoint here
        return "", ()
    return text, tuple(tokenizer.encode(text, add_special_tokens=False))


@functools.lru_cache(maxsize=8)
def _splitting_tokens(tokenizer) -> tuple[str, ...]:
    """Special tokens at which encoding splits the text cleanly: matched as written (not
    normalized, not single-word) and taking no whitespace from the text before them."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return tuple(t.content for t in added.values()
                 if t.special and not (t.lstrip or t.single_word or t.normalized))


def _one_prompt(prompt: str | list) -> str | list[int]:
    """The one prompt a completions body holds: a string, token ids, or OpenAI's batch
    form with one element ([string] or [[ids]])."""
    if isinstance(prompt, str) or all(isinstance(t, int) for t in prompt):
        return prompt
    if any(isinstance(t, int) for t in prompt):
        raise invalid("prompt", "mixes token ids with strings or lists; send one string, "
                      "one list of token ids, or a list holding one of those")
    if len(prompt) > 1:
        raise invalid("prompt", f"holds {len(prompt)} prompts; this server answers one prompt "
                      "per request (n=1): send each as its own request")
    (one,) = prompt
    if not one:
        raise invalid("prompt", "the prompt is empty")
    return one


def prepare_completion(body: CompletionRequest, plan: ExecutionPlan, tokenizer) -> Prepared:
    _check_model(body, plan)
    stream_options(body)
    if body.best_of not in (None, 1):
        raise invalid("best_of", f"{body.best_of}: only best_of=1 is supported")
    if body.echo or body.suffix:
        raise invalid("echo" if body.echo else "suffix", "is not supported")
    sampling = _sampling(body, plan, plan.model.vocab_size)
    prompt = _one_prompt(body.prompt)
    if isinstance(prompt, str):
        _refuse_if_surely_too_long(tokenizer, [prompt], plan, "prompt")
        ids = list(tokenizer.encode(prompt))
    else:
        if any(not 0 <= t < plan.model.vocab_size for t in prompt):
            raise invalid("prompt", f"token ids must be in [0, {plan.model.vocab_size})")
        ids = list(prompt)
    max_tokens = _max_tokens(body.max_tokens, len(ids), plan, "max_tokens", "prompt")
    k = _logprobs("logprobs", body.logprobs)
    return Prepared(GenerationRequest(ids, max_tokens, sampling, logprobs=k), _stops(body.stop),
                    bool((body.stream_options or {}).get("include_usage")))
