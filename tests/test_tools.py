"""Tool calls over the real server with the official openai client: tools in the template,
calls parsed with mlx-lm's parser, tool_choice (forced calls decode under a grammar)."""

from __future__ import annotations

import json
import random

import httpx
import jsonschema
import openai
import pytest

from appliance.api.tools import ToolCall, ToolCallSplitter, tool_format
from appliance.plan.resolve import EMBEDDED_MODEL

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


def _check_calls(calls, names=("get_weather", "add")):
    assert calls
    for c in calls:
        assert c.id and c.type == "function" and c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def test_the_template_renders_tools_and_leaves_plain_chats_alone(client, plan):
    from mlx_lm.tokenizer_utils import load

    tok = load(EMBEDDED_MODEL)
    chatml = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
              "message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt "
              "%}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    r = random.Random(0)
    for _ in range(100):
        msgs = [{"role": r.choice(["system", "user", "assistant"]),
                 "content": r.choice(["", "x", " def f():\n", "<|im_end|>", "é"])}
                for _ in range(r.randrange(1, 6))]
        for gp in (True, False):
            assert tok.apply_chat_template(msgs, add_generation_prompt=gp, tokenize=False) == \
                tok.apply_chat_template(msgs, add_generation_prompt=gp, tokenize=False,
                                        chat_template=chatml)
    assert tok.has_tool_calling and tok.tool_call_start == "<tool_call>"  # mlx-lm's json_tools

    def usage(**kw):
        return client.chat.completions.create(model=plan.model.id, max_tokens=1, **kw).usage

    plain = usage(messages=MSGS).prompt_tokens
    with_tools = usage(messages=MSGS, tools=TOOLS).prompt_tokens
    assert with_tools > plain + 50  # the tools' JSON is in the prompt
    assert usage(messages=MSGS, tools=TOOLS, tool_choice="none").prompt_tokens == plain
    history = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"}]
    text = tok.apply_chat_template(
        [*MSGS, {**history[1], "tool_calls": [{**history[1]["tool_calls"][0], "function": {
            "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}], "content": ""},
         history[2]], tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}' \
        '\n</tool_call>' in text and "<tool_response>\nsunny, 21C\n</tool_response>" in text
    assert usage(messages=history, tools=TOOLS).prompt_tokens == len(tok.encode(text))


@pytest.mark.parametrize("stream", [False, True])
def test_required_gives_one_valid_call(client, plan, stream):
    kw = dict(model=plan.model.id, messages=MSGS, tools=TOOLS, tool_choice="required",
              parallel_tool_calls=False, max_tokens=60)
    if not stream:
        r = client.chat.completions.create(**kw)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        assert len(choice.message.tool_calls) == 1
        _check_calls(choice.message.tool_calls)
        return
    deltas, finishes, content = [], [], ""
    for chunk in client.chat.completions.create(stream=True, temperature=0.9, **kw):
        for c in chunk.choices:
            content += c.delta.content or ""
            deltas += c.delta.tool_calls or []
            finishes.append(c.finish_reason)
    assert content == "" and [f for f in finishes if f] == ["tool_calls"]
    assert [d.index for d in deltas] == [0]
    _check_calls(deltas)


def test_named_function_and_parallel_calls(client, plan):
    for seed in range(3):
        r = client.chat.completions.create(
            model=plan.model.id, messages=MSGS, tools=TOOLS, max_tokens=120,
            tool_choice={"type": "function", "function": {"name": "add"}},
            temperature=1.0, seed=seed)
        _check_calls(r.choices[0].message.tool_calls, names=("add",))
        ids = [c.id for c in r.choices[0].message.tool_calls]
        assert len(set(ids)) == len(ids)
    # parallel calls allowed: every call returned is complete and valid, none leaks as text
    r = client.chat.completions.create(model=plan.model.id, messages=MSGS, tools=TOOLS,
                                       tool_choice="required", max_tokens=120)
    assert r.choices[0].message.content is None
    _check_calls(r.choices[0].message.tool_calls)


def test_auto_parses_calls_out_of_the_text_as_it_streams():
    from mlx_lm.tokenizer_utils import load

    fmt = tool_format(load(EMBEDDED_MODEL))
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Nice", '
            '"days": 1}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, '
            '"b": 2}}\n</tool_call><tool_call>\n{"name": "add", "arg')
    for cut in (1, 3, 7, len(text)):
        sp = ToolCallSplitter(fmt)
        out = [x for i in range(0, len(text), cut) for x in sp.feed(text[i:i + cut])]
        out += sp.finish()
        assert "".join(x for x in out if isinstance(x, str)) == "Let me look.\n"
        calls = [x for x in out if isinstance(x, ToolCall)]
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("get_weather", {"city": "Nice", "days": 1}), ("add", {"a": 1, "b": 2})]
    one = ToolCallSplitter(type(fmt)(fmt.start, fmt.end, fmt.parser, max_calls=1))
    assert [type(x) for x in one.feed(text) + one.finish()] == [str, ToolCall]


def test_auto_with_free_text_is_plain_content(client, plan):
    r = client.chat.completions.create(model=plan.model.id, messages=MSGS, tools=TOOLS,
                                       max_tokens=20)
    assert r.choices[0].finish_reason in ("stop", "length")  # the tiny model writes prose
    assert "<tool_call>" not in (r.choices[0].message.content or "")


@pytest.mark.parametrize("extra,param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]},
     "tools[0].function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
])
def test_bad_tool_requests_name_the_field(server, plan, extra, param):
    body = {"model": plan.model.id, "messages": MSGS, "max_tokens": 2, **extra}
    r = httpx.post(f"{server}/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_the_openai_client_sees_the_400(client, plan):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=plan.model.id, messages=MSGS, max_tokens=2,
                                       tools=TOOLS, tool_choice={"type": "function",
                                                                 "function": {"name": "x"}})
    assert e.value.body["param"] == "tool_choice"


UNSUPPORTED_CHAT = {"functions": [{"name": "f"}], "function_call": "auto", "n": 2,
                    "reasoning_effort": "high", "modalities": ["text", "audio"],
                    "audio": {"voice": "alloy", "format": "wav"}, "verbosity": "low",
                    "prediction": {"type": "content", "content": "x"},
                    "web_search_options": {}, "store": True}
UNSUPPORTED_COMPLETION = {"best_of": 2, "echo": True, "suffix": "x", "n": 3}


@pytest.mark.parametrize("path,field,value", [
    *(("chat/completions", k, v) for k, v in UNSUPPORTED_CHAT.items()),
    *(("completions", k, v) for k, v in UNSUPPORTED_COMPLETION.items())])
def test_unsupported_openai_fields_are_refused_by_name(server, plan, path, field, value):
    body = {"model": plan.model.id, "max_tokens": 2, field: value}
    body.update({"messages": MSGS} if path.startswith("chat") else {"prompt": "x"})
    r = httpx.post(f"{server}/v1/{path}", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


@pytest.mark.parametrize("body,param", [
    (b"", None), (b"{}", "model"), (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
    (b'{"model": "appliance-tiny"}', "messages")])
def test_body_problems_name_the_field(server, body, param):
    r = httpx.post(f"{server}/v1/chat/completions", content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert "data" not in r.json()["error"]["message"]


def test_context_overflow_is_context_length_exceeded(client, plan):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=plan.model.id, max_tokens=2, messages=[
            {"role": "user", "content": "word " * (plan.server.max_context + 10)}])
    assert e.value.code == "context_length_exceeded" and e.value.param == "messages"
