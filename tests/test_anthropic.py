"""Anthropic's Messages API on the real server, driven by the official anthropic client."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest
from conftest import app_for

from appliance.plan.source import EMBEDDED_MODEL

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER}]
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0)


def test_text_matches_chat_completions(claude, client, plan):
    system = "You are terse."
    m = claude.messages.create(model=plan.model.id, max_tokens=12, system=system,
                               messages=MSGS, extra_body={"temperature": 0})
    r = client.chat.completions.create(model=plan.model.id, max_tokens=12, temperature=0,
                                       messages=[{"role": "system", "content": system}, *MSGS])
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == r.choices[0].message.content
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[
        r.choices[0].finish_reason]
    u = m.usage
    assert u.input_tokens + u.cache_read_input_tokens == r.usage.prompt_tokens
    assert u.output_tokens == r.usage.completion_tokens


def test_a_final_assistant_turn_is_continued(claude, client, plan):
    """Anthropic's prefill: the reply continues the final assistant turn, and only the
    continuation comes back; it equals a raw completion of the continued template."""
    turns = [{"role": "user", "content": "Write an add function."},
             {"role": "assistant", "content": "def add(a, b):"}]
    m = claude.messages.create(model=plan.model.id, max_tokens=12, messages=turns,
                               extra_body={"temperature": 0})
    from mlx_lm.tokenizer_utils import load

    prompt = load(EMBEDDED_MODEL).apply_chat_template(turns, continue_final_message=True,
                                                      tokenize=False)
    assert prompt.endswith("def add(a, b):")
    r = client.completions.create(model=plan.model.id, prompt=prompt, max_tokens=12,
                                  temperature=0)
    assert m.content[0].text == r.choices[0].text
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == r.usage.prompt_tokens
    # where a continuation cannot be what was asked, refused by name
    strict = [{**TOOLS[0], "strict": True}]
    for last, extra, why in (("def add(a, b): ", {}, "cannot end with whitespace"),
                             ("{", {"output_config": {"format": {
                                 "type": "json_schema", "schema": WEATHER}}},
                              "under a forced tool choice or an output format"),
                             ("Sure: <tool_call>", {"tools": strict}, "starts a tool call"),
                             ("Sure: <tool_call>", {"tools": TOOLS,
                                                    "tool_choice": {"type": "none"}},
                              "starts a tool call")):
        with pytest.raises(anthropic.BadRequestError, match=why):
            claude.messages.create(model=plan.model.id, max_tokens=4, **extra, messages=[
                turns[0], {"role": "assistant", "content": last}])
    # a grammar that starts with free text (strict tools under auto; tool_choice none)
    # continues a prefill (it was a 400 naming a forced choice the request did not make)
    for extra in ({"tools": strict}, {"tools": TOOLS, "tool_choice": {"type": "none"}}):
        m = claude.messages.create(model=plan.model.id, max_tokens=4, **extra, messages=turns)
        assert m.stop_reason in ("end_turn", "max_tokens") and m.content[0].type == "text"


def test_prefix_cache_reads_are_reported():
    long = [{"role": "user", "content": "def f(x):\n    return x\n" * 40}]
    with app_for(["cache=ram"]) as (plan, _, url):
        c = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
        cold = c.messages.create(model=plan.model.id, max_tokens=2, messages=long)
        m = c.messages.create(model=plan.model.id, max_tokens=2, messages=long)
        with c.messages.stream(model=plan.model.id, max_tokens=2, messages=long) as s:
            start = next(e for e in s if e.type == "message_start").message.usage
            streamed = s.get_final_message().usage
    assert cold.usage.cache_read_input_tokens == 0
    assert m.usage.cache_read_input_tokens > 100
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == cold.usage.input_tokens
    # a stream says so from its first event, as Anthropic's does (not only at its end)
    assert start.cache_read_input_tokens == streamed.cache_read_input_tokens > 100
    assert start.input_tokens == streamed.input_tokens


def test_streaming_event_sequence(claude, plan):
    with claude.messages.stream(model=plan.model.id, max_tokens=16, messages=MSGS,
                                extra_body={"temperature": 0.7, "top_p": 0.9,
                                            "top_k": 40}) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[-2] == "message_delta"
    if not final.usage.output_tokens:  # sampled: the first draw can be the model's end (EOS)
        assert kinds == ["message_start", "message_delta", "message_stop"]
        assert final.stop_reason == "end_turn" and final.content == []
        return
    assert "content_block_start" in kinds
    assert kinds.index("content_block_start") < kinds.index("content_block_stop")
    assert final.stop_reason in ("max_tokens", "end_turn") and final.usage.output_tokens > 0
    assert final.content[0].type == "text" and final.content[0].text


def test_top_p_zero_keeps_the_most_likely_token(claude, plan):
    """Anthropic accepts top_p=0 as OpenAI does: the most likely token alone (greedy)."""
    def ask(**kw):
        m = claude.messages.create(model=plan.model.id, max_tokens=24, messages=MSGS, **kw)
        return "".join(b.text for b in m.content if b.type == "text")

    greedy = ask(extra_body={"temperature": 0})
    assert all(ask(extra_body={"temperature": 1.0, "top_p": 0}) == greedy for _ in range(3))
    # (the check has teeth: sampling the whole distribution parts from greedy)
    assert any(ask(extra_body={"temperature": 1.0}) != greedy for _ in range(3))


def test_stop_sequences(claude, plan):
    full = claude.messages.create(model=plan.model.id, max_tokens=30, messages=MSGS,
                                  extra_body={"temperature": 0}).content[0].text
    stop = full[6:9]
    m = claude.messages.create(model=plan.model.id, max_tokens=30, messages=MSGS,
                               extra_body={"temperature": 0}, stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == full[:full.find(stop)]


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_use_and_a_tool_result_turn(claude, plan, stream):
    kw = dict(model=plan.model.id, max_tokens=60, messages=MSGS, tools=TOOLS,
              tool_choice={"type": "any", "disable_parallel_tool_use": True})
    if stream:
        with claude.messages.stream(**kw) as s:
            pieces = [e.delta.partial_json for e in s if e.type == "content_block_delta"
                      and e.delta.type == "input_json_delta"]
            m = s.get_final_message()
        assert len(pieces) > 3  # the input arrives as it is written
        assert json.loads("".join(pieces)) == m.content[-1].input
    else:
        m = claude.messages.create(**kw)
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER)
    follow = [*MSGS, {"role": "assistant", "content": m.content},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                            "content": "sunny, 21C"},
                                           {"type": "text", "text": "And tomorrow?"}]}]
    m2 = claude.messages.create(model=plan.model.id, max_tokens=5, messages=follow,
                                tools=TOOLS, tool_choice={"type": "tool",
                                                          "name": "get_weather"})
    assert [b.type for b in m2.content] == ["tool_use"] or m2.stop_reason == "max_tokens"
    n = claude.messages.count_tokens(model=plan.model.id, messages=follow, tools=TOOLS)
    assert n.input_tokens == m2.usage.input_tokens + m2.usage.cache_read_input_tokens


def test_tool_choice_none_keeps_the_tools_and_answers_in_text(claude, plan):
    kw = dict(model=plan.model.id, max_tokens=12, messages=MSGS, tools=TOOLS,
              extra_body={"temperature": 0})
    m = claude.messages.create(tool_choice={"type": "none"}, **kw)
    n = claude.messages.count_tokens(model=plan.model.id, messages=MSGS, tools=TOOLS)
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == n.input_tokens
    assert n.input_tokens > claude.messages.count_tokens(model=plan.model.id,
                                                         messages=MSGS).input_tokens
    assert [b.type for b in m.content] == ["text"] and m.stop_reason != "tool_use"
    assert "<tool_call>" not in m.content[0].text


def test_count_tokens_counts_past_the_context_limit(claude, plan):
    """A client counts to learn when to compact: a prompt the server could not serve is
    counted, not refused (generating from it is)."""
    long = [{"role": "user", "content": "word " * 5000}]
    n = claude.messages.count_tokens(model=plan.model.id, messages=long).input_tokens
    assert n > plan.server.max_context
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        claude.messages.create(model=plan.model.id, max_tokens=2, messages=long)
    # a prompt that fits, with max_tokens past the limit: in the words Anthropic's API uses
    with pytest.raises(anthropic.BadRequestError,
                       match="input length and `max_tokens` exceed context limit"):
        claude.messages.create(model=plan.model.id, max_tokens=plan.server.max_context,
                               messages=MSGS)


@pytest.mark.parametrize("extra,status,fragment", [
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, 400, "thinking"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "tools[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "messages[0].content[0].type"),
    ({"extra_body": {"temperature": 1.5}}, 400, "temperature"),
    ({"output_config": {"effort": "high"}}, 400, "output_config.effort"),
    ({"output_config": {"task_budget": {"type": "tokens", "total": 100}}}, 400,
     "output_config.task_budget"),
    # each tool_choice type's own keys: a misspelt disable_parallel_tool_use was dropped
    ({"tools": TOOLS, "tool_choice": {"type": "any", "disable_parallel_tool_us": True}}, 400,
     "tool_choice.disable_parallel_tool_us"),
    ({"tools": TOOLS, "tool_choice": {"type": "none", "disable_parallel_tool_use": True}}, 400,
     "tool_choice.disable_parallel_tool_use"),
    ({"tools": TOOLS, "tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}}, 400,
     "tool_choice.disable_parallel_tool_use: must be a boolean"),
    ({"tools": TOOLS, "tool_choice": {"type": "any", "disable_parallel_tool_use": 1}}, 400,
     "tool_choice.disable_parallel_tool_use: must be a boolean"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_weather", "foo": 1}}, 400,
     "tool_choice.foo"),
    ({"tools": TOOLS, "tool_choice": {"type": ["any"]}}, 400, "tool_choice.type"),
    ({"inference_geo": "us"}, 400, "inference_geo"),
    ({"extra_body": {"thread": {"type": "create"}}}, 400, "threads are not kept"),
    ({"extra_body": {"not_a_field": 1}}, 400, "not_a_field"),
    ({"service_tier": "priority"}, 400, "service_tier"),
    ({"model": "claude-nope"}, 404, "claude-nope"),
    ({"max_tokens": 20000}, 400, "max_tokens"),
    # nested fields this server does not read are refused too, never ignored
    ({"messages": [{"role": "user", "content": "hi", "bogus": 1}]}, 400, "messages[0].bogus"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "bogus": 1}]}]},
     400, "messages[0].content[0].bogus"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}, "bogus": 1}]}, 400,
     "tools[0].bogus"),
    ({"messages": [{"role": "user", "content": "word " * 5000}]}, 400, "messages"),
    ({"stop_sequences": [""]}, 400, "stop_sequences: "),
    ({"tools": [*TOOLS, {**TOOLS[0], "description": "again"}]}, 400,
     "tools[1]: 'get_weather' is also the name of tools[0]"),
])
def test_errors_have_anthropics_shape(claude, plan, extra, status, fragment):
    kw = {"model": plan.model.id, "max_tokens": 5, "messages": MSGS, **extra}
    with pytest.raises(anthropic.APIStatusError) as e:
        claude.messages.create(**kw)
    assert e.value.status_code == status
    body = e.value.body
    assert body["type"] == "error" and fragment in body["error"]["message"]
    assert body["error"]["type"] == ("not_found_error" if status == 404
                                     else "invalid_request_error")


def _use(i, **kw):
    return {"type": "tool_use", "id": i, "name": "get_weather",
            "input": {"city": "Paris", "days": 1}, **kw}


def _result(i):
    return {"type": "tool_result", "tool_use_id": i, "content": "sunny"}


ASKED = [*MSGS, {"role": "assistant", "content": [_use("u1")]}]


@pytest.mark.parametrize("messages,fragment", [
    ([{"role": "user", "content": [_result("u1")]}],
     "messages[0].content[0]: a tool result for call 'u1'"),
    ([*ASKED, {"role": "user", "content": "and?"}], "messages[1]: tool call 'u1' has no result"),
    ([*ASKED, {"role": "user", "content": [_result("u2")]}], "messages[2].content[0]: "),
    ([*ASKED, {"role": "user", "content": [{"type": "text", "text": "here"}, _result("u1")]}],
     "messages[2].content[1]: tool_result blocks come first"),
    ([*MSGS, {"role": "assistant", "content": [{"type": "tool_use", "name": "get_weather",
                                                  "input": {}}]}],
     "messages[1].content[0].id: is required"),
    ([*ASKED, {"role": "user", "content": [{"type": "tool_result", "content": "x"}]}],
     "messages[2].content[0].tool_use_id: is required"),
])
def test_tool_results_and_uses_pair_up_as_anthropic_requires(claude, plan, messages, fragment):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=plan.model.id, max_tokens=2, tools=TOOLS,
                               messages=messages)
    assert fragment in e.value.body["error"]["message"]


def test_a_results_turn_answers_parallel_uses_in_any_order_then_text(claude, plan):
    m = claude.messages.create(model=plan.model.id, max_tokens=2, tools=TOOLS, messages=[
        *MSGS, {"role": "assistant", "content": [_use("u1"), _use("u2")]},
        {"role": "user", "content": [_result("u2"), _result("u1"),
                                     {"type": "text", "text": "and?"}]}])
    assert m.usage.input_tokens > 0
    # consecutive assistant messages are one turn (Anthropic merges them), and a block as
    # the SDK's model_dump() echoes it carries caller / toolset_name, null
    m = claude.messages.create(model=plan.model.id, max_tokens=2, tools=TOOLS, messages=[
        *MSGS, {"role": "assistant", "content": [_use("u1", caller=None, toolset_name=None)]},
        {"role": "assistant", "content": "checking"},
        {"role": "user", "content": [{**_result("u1"), "toolset_name": None}]}])
    assert m.usage.input_tokens > 0
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[1\].content\[0\].caller"):
        claude.messages.create(model=plan.model.id, max_tokens=2, tools=TOOLS, messages=[
            *MSGS, {"role": "assistant", "content": [
                _use("u1", caller={"type": "code_execution_20250825", "tool_id": "x"})]},
            {"role": "user", "content": [_result("u1")]}])


def _refused():
    from appliance.api.anthropic_request import REFUSED

    return sorted(REFUSED)


@pytest.mark.parametrize("field", [*_refused(), "speed", "service_tier"])
@pytest.mark.parametrize("path", ["messages", "count_tokens"])
def test_every_known_unsupported_field_is_refused_by_name(claude, plan, field, path):
    """Each Messages API field this server declares but does not implement, through the
    official client; count_tokens declares only the fields that shape the prompt."""
    value = {"speed": "fast", "service_tier": "priority"}.get(field, {"x": 1})
    kw = dict(model=plan.model.id, messages=MSGS, extra_body={field: value})
    with pytest.raises(anthropic.BadRequestError) as e:
        if path == "messages":
            claude.messages.create(max_tokens=3, **kw)
        else:
            claude.messages.count_tokens(**kw)
    assert e.value.body["error"]["message"].startswith(f"{field}: ")


def test_metadata_holds_user_id_alone(claude, plan):
    """Anthropic's `metadata` is `user_id` (the agent label of the metrics); another key is
    refused by name, as Anthropic's API does, not accepted and ignored."""
    kw = dict(model=plan.model.id, max_tokens=2, messages=MSGS)
    assert claude.messages.create(metadata={"user_id": "coder-7"}, **kw).usage.output_tokens
    for bad, says in (({"user_id": "a", "session": "s1"}, "metadata.session: "),
                      ({"user_id": 7}, "metadata.user_id"), ({"user_id": "x" * 257},
                                                             "metadata.user_id")):
        with pytest.raises(anthropic.BadRequestError) as e:
            claude.messages.create(**kw, extra_body={"metadata": bad})
        assert e.value.body["error"]["message"].startswith(says), e.value.body


def test_output_config_format_is_enforced(claude, plan):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
              "required": ["city"], "additionalProperties": False}
    m = claude.messages.create(model=plan.model.id, max_tokens=40, messages=MSGS,
                               output_config={"format": {"type": "json_schema",
                                                         "schema": schema}})
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_a_bad_body_is_an_anthropic_error(server):
    r = httpx.post(f"{server}/v1/messages", content=b"{}",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "model" in r.json()["error"]["message"]
    json.dumps(r.json())
