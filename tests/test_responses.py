"""OpenAI's Responses API on the real server, driven by the openai client's `responses`."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather",
          "parameters": WEATHER}]
Q = "What is the weather in Paris?"


def test_text_matches_chat_completions(client, plan):
    r = client.responses.create(model=plan.model.id, input=Q, instructions="Be terse.",
                                max_output_tokens=12, temperature=0)
    c = client.chat.completions.create(model=plan.model.id, max_tokens=12, temperature=0,
                                       messages=[{"role": "system", "content": "Be terse."},
                                                 {"role": "user", "content": Q}])
    assert r.object == "response" and r.output_text == c.choices[0].message.content
    assert r.usage.input_tokens == c.usage.prompt_tokens
    assert r.usage.output_tokens == c.usage.completion_tokens
    assert r.status == ("incomplete" if c.choices[0].finish_reason == "length" else "completed")


def test_streaming_events(client, plan):
    events = list(client.responses.create(model=plan.model.id, input=Q, max_output_tokens=10,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].response.output_text == text
    done = [e for e in events if e.type == "response.output_text.done"]
    assert [e.text for e in done] == [text]


def test_an_incomplete_response_streams_as_openai_ends_one(client, plan):
    """max_output_tokens hit: the stream helper's events end with response.incomplete (as
    OpenAI's do), carrying the whole response: status and reason, the text so far, the
    message marked incomplete. Non-streamed, the same response."""
    kw = dict(model=plan.model.id, input=Q, max_output_tokens=4, temperature=0)
    with client.responses.stream(**kw) as s:
        events = list(s)
    last = events[-1]
    assert last.type == "response.incomplete" and last.sequence_number == len(events) - 1
    assert [e.type for e in events].count("response.incomplete") == 1
    assert not any(e.type in ("response.completed", "error") for e in events)
    r = last.response
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and r.output_text == text and r.usage.output_tokens == 4
    (msg,) = r.output
    assert msg.status == "incomplete"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.id, i.status) for i in done] == [(msg.id, "incomplete")]
    whole = client.responses.create(**kw)
    assert (whole.status, whole.output_text, whole.output[0].status) == \
        ("incomplete", text, "incomplete")
    assert whole.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize("stream", [False, True])
def test_function_call_round_trip(client, plan, stream):
    kw = dict(model=plan.model.id, input=Q, tools=TOOLS, tool_choice="required",
              parallel_tool_calls=False, max_output_tokens=60)
    if stream:
        with client.responses.stream(**kw) as s:
            deltas = [e for e in s if e.type == "response.function_call_arguments.delta"]
            r = s.get_final_response()
        assert len(deltas) > 3  # the arguments arrive as they are written
        assert "".join(d.delta for d in deltas) == r.output[0].arguments
    else:
        r = client.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    follow = client.responses.create(
        model=plan.model.id, max_output_tokens=5, tools=TOOLS, input=[
            {"role": "user", "content": Q}, calls[0].model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": calls[0].call_id,
             "output": "sunny"}])
    assert follow.usage.input_tokens > r.usage.input_tokens


def test_structured_text_format(client, plan):
    r = client.responses.create(model=plan.model.id, input=Q, max_output_tokens=60,
                                text={"format": {"type": "json_schema", "name": "w",
                                                 "schema": WEATHER, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), WEATHER)


@pytest.mark.parametrize("extra,param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"store": True}, "store"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"moderation": {"mode": "strict"}}, "moderation"),
    ({"prompt_cache_retention": "24h"}, "prompt_cache_retention"),
    ({"service_tier": "flex"}, "service_tier"),
    ({"not_a_field": 1}, "not_a_field"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": "hi", "bogus": 1}]}, "input[0].bogus"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi", "x": 1}]}]},
     "input[0].content[0].x"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {}, "bogus": 1}]},
     "tools[0].bogus"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "foo"}}}},
     "text.format.schema"),
    # stream_options as chat's: only with stream, no obfuscation, no other key
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_obfuscation": True}},
     "stream_options.include_obfuscation"),
    ({"stream": True, "stream_options": {"foo": 1}}, "stream_options.foo"),
    ({"stream": True, "stream_options": {"include_usage": True}}, "stream_options.include_usage"),
    # a named function's keys; a choice in chat's shape is not Responses'
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "get_weather", "foo": 1}},
     "tool_choice.foo"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     "tool_choice.function"),
    ({"tools": TOOLS, "tool_choice": "any"}, "tool_choice"),
])
def test_unsupported_fields_are_refused_by_name(server, plan, extra, param):
    body = {"model": plan.model.id, "input": Q, "max_output_tokens": 3, **extra}
    r = httpx.post(f"{server}/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def _call(i, **kw):
    return {"type": "function_call", "call_id": i, "name": "get_weather",
            "arguments": '{"city": "Paris"}', **kw}


def _output(i):
    return {"type": "function_call_output", "call_id": i, "output": "sunny"}


ASK = {"role": "user", "content": Q}


@pytest.mark.parametrize("items,param", [
    ([ASK, _output("c1")], "input[1]"),
    ([ASK, _call("c1")], "input[1]"),
    ([ASK, _call("c1"), ASK], "input[1]"),
    ([ASK, _call("c1"), {"type": "function_call_output", "output": "x"}], "input[2].call_id"),
    ([ASK, {"type": "function_call", "call_id": "c1", "arguments": "{}"}], "input[1].name"),
    ([ASK, _call("c1", namespace="tools"), _output("c1")], "input[1].namespace"),
    ([ASK, {"role": "assistant", "content": "x", "phase": "draft"}], "input[1].phase"),
])
def test_function_calls_and_outputs_pair_up(server, plan, items, param):
    r = httpx.post(f"{server}/v1/responses", json={
        "model": plan.model.id, "input": items, "max_output_tokens": 3, "tools": TOOLS})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_outputs_follow_their_calls_interleaved_or_in_parallel(client, plan):
    said = {"type": "message", "role": "assistant", "phase": "commentary",
            "content": [{"type": "output_text", "text": "checking", "annotations": []}]}
    for items in ([ASK, _call("c1"), _output("c1"), _call("c2"), _output("c2")],
                  [ASK, _call("c1"), _call("c2"), _output("c2"), _output("c1")],
                  # a message of the same turn between, and the SDK's nulls for a call
                  [ASK, _call("c1", caller=None, namespace=None, **{"async": None}), said,
                   _output("c1")]):
        r = client.responses.create(model=plan.model.id, input=items, tools=TOOLS,
                                    max_output_tokens=3)
        assert r.usage.input_tokens > 0


def _refused():
    from appliance.api.responses import REFUSED

    return sorted(REFUSED)


@pytest.mark.parametrize("field", [*_refused(), "truncation", "service_tier"])
def test_every_known_unsupported_field_is_refused_by_name(client, plan, field):
    """Each field of OpenAI's Responses API this server declares but does not implement,
    sent through the official client."""
    value = {"truncation": "auto", "service_tier": "priority"}.get(field, {"x": 1})
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=plan.model.id, input=Q, max_output_tokens=3,
                                extra_body={field: value})
    assert e.value.param == field


def test_the_client_sees_context_overflow(client, plan):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=plan.model.id, input="word " * 5000)
    assert e.value.code == "context_length_exceeded" and e.value.param == "input"
