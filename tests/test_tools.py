"""Tool calls over the real server with the official openai client: tools in the template,
calls parsed with mlx-lm's parser, tool_choice (forced calls decode under a grammar)."""

from __future__ import annotations

import json
import random

import httpx
import jsonschema
import openai
import pytest

from appliance.api.tools import tool_format
from appliance.api.toolstream import CallArgs, CallStart, ToolCall, ToolCallSplitter
from appliance.plan.source import EMBEDDED_MODEL

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
    # tool_choice none keeps the tools in the prompt, as OpenAI does (calls are masked)
    assert usage(messages=MSGS, tools=TOOLS, tool_choice="none").prompt_tokens == with_tools
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
    assert {d.index for d in deltas} == {0}
    # as OpenAI streams a call: the first delta names it, the arguments follow in pieces
    head, *rest = deltas
    assert head.id and head.type == "function" and head.function.name in SCHEMAS
    assert head.function.arguments == "" and len(rest) > 3
    assert all(d.id is None and d.function.name is None for d in rest)
    args = "".join(d.function.arguments for d in rest)
    jsonschema.validate(json.loads(args), SCHEMAS[head.function.name])


def test_streamed_arguments_equal_the_whole_response_and_the_client_assembles_them(client,
                                                                                   plan):
    """Temperature 0: the fragments joined are the non-streamed call's arguments; the
    openai client's stream helper assembles the deltas into the same call; nothing of the
    markup reaches the content."""
    kw = dict(model=plan.model.id, messages=MSGS, tools=TOOLS, max_tokens=120, temperature=0,
              tool_choice={"type": "function", "function": {"name": "get_weather"}},
              parallel_tool_calls=False)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    with client.chat.completions.stream(**kw) as s:
        pieces = [e for e in s if e.type == "tool_calls.function.arguments.delta"]
        final = s.get_final_completion().choices[0]
    assert len(pieces) > 3  # incremental, not one delta per call
    assert final.finish_reason == "tool_calls" and not final.message.content
    streamed = final.message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in streamed] == \
        [(c.function.name, c.function.arguments) for c in whole]
    _check_calls(streamed)


def test_tool_choice_none_keeps_the_tools_and_makes_no_call(client, plan):
    r = client.chat.completions.create(model=plan.model.id, messages=MSGS, tools=TOOLS,
                                       tool_choice="none", max_tokens=30, temperature=0)
    auto = client.chat.completions.create(model=plan.model.id, messages=MSGS, tools=TOOLS,
                                          max_tokens=1)
    assert r.usage.prompt_tokens == auto.usage.prompt_tokens  # the tools are in the prompt
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.choices[0].message.tool_calls is None
    assert "<tool_call>" not in r.choices[0].message.content


def test_tool_choice_none_masks_the_start_of_a_call(plan):
    """The grammar a tool_choice none row decodes under, as the engine calls it: the start
    markup cannot be completed, any other text can, and the row may end."""
    import mlx.core as mx
    from mlx_lm.tokenizer_utils import load

    from appliance.api.output import output_spec

    tok = load(EMBEDDED_MODEL)
    out = output_spec(tok, plan.model.vocab_size, TOOLS, "none", None, None)
    assert out.template_tools == TOOLS and out.tools is None and out.grammar is not None
    logits = mx.zeros((1, plan.model.vocab_size))
    prompt = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)

    def allowed(proc, text):
        ids = tok.encode(text, add_special_tokens=False) if text else []
        return (proc(mx.array(prompt + ids), logits) > -mx.inf).tolist()[0]

    p = out.grammar.make_processor()
    close = tok.encode(">", add_special_tokens=False)[0]
    start = allowed(p, "")
    assert start[tok.encode("<", add_special_tokens=False)[0]] and start[tok.eos_token_id]
    assert not allowed(p, "Sure. <tool_call")[close]  # "<tool_call>" never completes
    assert allowed(p, "Sure. <tool_cal")[tok.encode("l", add_special_tokens=False)[0]]
    assert allowed(p, "if a <b and c> d:")[close]  # other markup is text as usual


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


def test_a_forced_call_cut_before_its_start_markup_ends_leaves_no_text(server, client, plan):
    """A forced call (required, a named function, Anthropic's `any`) is markup from its
    first token: cut by max_tokens inside "<tool_call>", nothing of it comes back as text
    ('<', '<tool', '<tool_call' did, on every endpoint); the finish reason says the cut."""
    import anthropic

    named = {"type": "function", "function": {"name": "add"}}
    for mt in (1, 2, 3):
        for choice in ("required", named):
            kw = dict(model=plan.model.id, messages=MSGS, tools=TOOLS, tool_choice=choice,
                      max_tokens=mt, temperature=0)
            r = client.chat.completions.create(**kw)
            assert r.choices[0].finish_reason == "length"
            assert not r.choices[0].message.content and not r.choices[0].message.tool_calls
            chunks = list(client.chat.completions.create(**kw, stream=True))
            assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        resp = client.responses.create(model=plan.model.id, input=MSGS[0]["content"],
                                       tools=[{"type": "function", "name": "add",
                                               "parameters": ADD}],
                                       tool_choice="required", max_output_tokens=mt)
        assert resp.status == "incomplete" and not resp.output_text
        claude = anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0)
        m = claude.messages.create(model=plan.model.id, max_tokens=mt, messages=MSGS,
                                   tools=[{"name": "add", "input_schema": ADD}],
                                   tool_choice={"type": "any"})
        assert m.stop_reason == "max_tokens" and not [b for b in m.content if b.type == "text"]


def test_a_tools_own_references_resolve_when_a_call_is_forced(client, plan):
    """Parameters that name their parts in `$defs` or `definitions` (what pydantic, and the
    openai client's `pydantic_function_tool`, write for a nested model; MCP servers too)
    compile into the call's grammar: they were a 400, "Pointer '/$defs/Loc' does not
    exist", once the parameters sat inside the call's schema."""
    import pydantic

    class Loc(pydantic.BaseModel):
        file: str
        line: int

    class Goto(pydantic.BaseModel):
        loc: Loc

    assert "$defs" in openai.pydantic_function_tool(Goto)["function"]["parameters"]
    loc = {"type": "object", "properties": {"file": {"enum": ["a.py", "b.py"]},
                                            "line": {"type": "integer", "minimum": 1,
                                                     "maximum": 99}},
           "required": ["file", "line"], "additionalProperties": False}
    for defs in ("$defs", "definitions"):
        params = {"type": "object", defs: {"Loc": loc},
                  "properties": {"loc": {"$ref": f"#/{defs}/Loc"},
                                 "then": {"anyOf": [{"$ref": f"#/{defs}/Loc"},
                                                    {"type": "null"}]}},
                  "required": ["loc", "then"], "additionalProperties": False}
        tool = {"type": "function", "function": {"name": "goto", "parameters": params}}
        for choice in ("required", {"type": "function", "function": {"name": "goto"}}):
            r = client.chat.completions.create(model=plan.model.id, messages=MSGS,
                                               tools=[tool], tool_choice=choice,
                                               parallel_tool_calls=False, max_tokens=80)
            (call,) = r.choices[0].message.tool_calls
            jsonschema.validate(json.loads(call.function.arguments), params)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences_do_not_apply_inside_a_call(client, plan, stream):
    """Stop sequences match content, not a call's markup or arguments (as OpenAI's): a
    forced call with stops that its markup and arguments hold ("\n", a property name, the
    markup's own tags) comes back whole. It came back cut: finish_reason "tool_calls" with
    no call, or arguments that were not JSON."""
    stops = ["\n", "city", "<tool_call>", "</tool_call>"]
    r = client.chat.completions.create(model=plan.model.id, messages=MSGS, tools=TOOLS,
                                       tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=80, stop=stops, stream=stream)
    if stream:
        chunks = [c.choices[0] for c in r if c.choices]
        args = "".join(t.function.arguments or "" for c in chunks
                       for t in c.delta.tool_calls or [])
        names = [t.function.name for c in chunks for t in c.delta.tool_calls or []
                 if t.function.name]
        finish = chunks[-1].finish_reason
        assert not "".join(c.delta.content or "" for c in chunks)
    else:
        (call,) = r.choices[0].message.tool_calls
        args, names, finish = call.function.arguments, [call.function.name], \
            r.choices[0].finish_reason
    assert finish == "tool_calls" and len(names) == 1
    jsonschema.validate(json.loads(args), SCHEMAS[names[0]])


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
        assert all(c.complete for c in calls) and [c.index for c in calls] == [0, 1]
        starts = [x for x in out if isinstance(x, CallStart)]
        assert [(s.index, s.id, s.name) for s in starts] == [(c.index, c.id, c.name)
                                                             for c in calls]
        for c in calls:  # each call: start, fragments that join to its arguments, the call
            mine = [x for x in out if getattr(x, "index", None) == c.index
                    and not isinstance(x, str)]
            assert isinstance(mine[0], CallStart) and mine[-1] is c
            assert "".join(x.text for x in mine[1:-1]) == c.arguments
            if cut < 7:
                assert len(mine) > 4  # released as it arrived
    one = ToolCallSplitter(type(fmt)(fmt.start, fmt.end, fmt.parser, max_calls=1))
    assert [type(x) for x in one.feed(text) + one.finish()] == [str, CallStart, CallArgs,
                                                                 ToolCall]
    # cut off inside the arguments (max_tokens): streamed, but not a complete call
    cut = ToolCallSplitter(fmt)
    out = cut.feed('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b"') + cut.finish()
    assert [type(x) for x in out] == [CallStart, CallArgs, ToolCall]
    assert out[1].text == '{"a": 1, "b"' and not out[2].complete
    # cut off inside the start markup of a call after one (max_tokens): no markup as content;
    # with no call before it, the held text may be prose ("a < b"), and stays content
    for tail in ("\n<", "\n<tool", "<tool_ca"):
        after = ToolCallSplitter(fmt)
        out = after.feed(text[:text.rindex("<tool_call>")] + tail) + after.finish()
        assert [type(x) for x in out if not isinstance(x, (CallStart, CallArgs))] == \
            [str, ToolCall, ToolCall], out
    prose = ToolCallSplitter(fmt)
    assert prose.feed("if a <") + prose.finish() == ["if a ", "<"]
    # a call that is not JSON is content, markup included
    bad = ToolCallSplitter(fmt)
    assert bad.feed("<tool_call>oops</tool_call> ok") + bad.finish() == \
        ["<tool_call>oops</tool_call>", " ok"]


@pytest.mark.parametrize("stream", [False, True])
def test_auto_parses_a_call_the_model_chose_to_write(client, plan, engine, stream):
    """tool_choice auto with a response format: the grammar allows JSON content or a call,
    and the model's choice decides. A bias on "<" makes it choose the call, which is then
    parsed out of its text by the auto path (streamed: as it is written)."""
    lt = engine.tokenizer.encode("<", add_special_tokens=False)[0]
    kw = dict(model=plan.model.id, messages=MSGS, tools=TOOLS, max_tokens=80, temperature=0,
              parallel_tool_calls=False, response_format={"type": "json_object"},
              logit_bias={str(lt): 100})
    if not stream:
        choice = client.chat.completions.create(**kw).choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        _check_calls(choice.message.tool_calls)
        return
    deltas, content, finishes = [], "", []
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            content += c.delta.content or ""
            deltas += c.delta.tool_calls or []
            finishes.append(c.finish_reason)
    assert content == "" and [f for f in finishes if f] == ["tool_calls"]
    assert deltas[0].function.name in SCHEMAS and len(deltas) > 3
    jsonschema.validate(json.loads("".join(d.function.arguments for d in deltas)),
                        SCHEMAS[deltas[0].function.name])


def _special_markup_model(tmp_path):
    """The embedded model's tokenizer with <tool_call> and </tool_call> added as special
    tokens (`special: true`), as some vocabularies hold them; its ids."""
    for f in EMBEDDED_MODEL.iterdir():
        if f.name != "tokenizer.json":
            (tmp_path / f.name).symlink_to(f)
    spec = json.loads((EMBEDDED_MODEL / "tokenizer.json").read_text())
    n = len(spec["model"]["vocab"])
    spec["added_tokens"] += [{"id": n + i, "content": c, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True}
                             for i, c in enumerate(("<tool_call>", "</tool_call>"))]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    return n, n + 1


@pytest.mark.parametrize("special", [False, True])
def test_strict_tools_hold_auto_calls_to_their_schemas(tmp_path, special):
    """tool_choice auto with a `strict: true` tool: text, then calls valid for their schemas,
    or the end (it was parsed, unconstrained: strict was accepted and ignored). Where the
    vocabulary holds the markup as special tokens, the model may write those (a text-only
    grammar masked them)."""
    from mlx_lm.tokenizer_utils import load

    from appliance.api.output import output_spec

    start, end = _special_markup_model(tmp_path) if special else (None, None)
    tok = load(tmp_path if special else EMBEDDED_MODEL)
    n_vocab = len(tok.get_vocab())
    strict = [{"type": "function", "function": {**t["function"], "strict": True}}
              for t in TOOLS]

    def ids(*parts):
        return [t for p in parts for t in ([p] if isinstance(p, int)
                                           else tok.encode(p, add_special_tokens=False))]

    def takes(spec, *parts):
        m = spec.grammar._pristine.deep_copy()
        return m.consume_tokens(ids(*parts)) and m.is_accepting()

    spec = output_spec(tok, n_vocab, strict, "auto", None, None)
    call = '\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
    bad = '\n{"name": "add", "arguments": {"a": 1, "b": 200}}\n'
    marks = (start, end) if special else ("<tool_call>", "</tool_call>")
    assert takes(spec, "Let me add them.\n", marks[0], call, marks[1])
    assert takes(spec, marks[0], call, marks[1], "\n", marks[0], call, marks[1])
    assert takes(spec, "Just text, with a < sign.")
    assert not takes(spec, "Adding.\n", marks[0], bad, marks[1])
    assert not takes(spec, marks[0], call, marks[1], " and more text")
    one = output_spec(tok, n_vocab, strict, "auto", False, None)  # parallel_tool_calls=false
    assert not takes(one, marks[0], call, marks[1], "\n", marks[0], call, marks[1])
    if special:  # a forced call may use the special tokens too
        forced = output_spec(tok, n_vocab, strict, "required", None, None)
        assert takes(forced, start, call, end)
    assert output_spec(tok, n_vocab, TOOLS, "auto", None, None).grammar is None  # not strict


@pytest.mark.parametrize("strict", [False, True])
def test_auto_with_free_text_is_plain_content(client, plan, strict):
    tools = [{"type": "function", "function": {**t["function"], "strict": strict}}
             for t in TOOLS]
    r = client.chat.completions.create(model=plan.model.id, messages=MSGS, tools=tools,
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
    ({"tools": [*TOOLS, {"type": "function", "function": {"name": "add"}}]}, "tools[2]"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"parallel_tool_calls": True}, "parallel_tool_calls"),  # without tools: OpenAI's 400 too
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": 1}}]},
     "tools[0].function.strict"),  # (1 == True in Python: a number is no boolean here)
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
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
                    "web_search_options": {}, "store": True, "moderation": {},
                    "prompt_cache_options": {"mode": "explicit"},
                    "prompt_cache_retention": "24h", "service_tier": "priority",
                    "not_an_openai_field": 1}
UNSUPPORTED_COMPLETION = {"best_of": 2, "echo": True, "suffix": "x", "n": 3,
                          "metadata": {"a": "b"}}


@pytest.mark.parametrize("path,field,value", [
    *(("chat/completions", k, v) for k, v in UNSUPPORTED_CHAT.items()),
    *(("completions", k, v) for k, v in UNSUPPORTED_COMPLETION.items())])
def test_unsupported_openai_fields_are_refused_by_name(server, plan, path, field, value):
    body = {"model": plan.model.id, "max_tokens": 2, field: value}
    body.update({"messages": MSGS} if path.startswith("chat") else {"prompt": "x"})
    r = httpx.post(f"{server}/v1/{path}", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


@pytest.mark.parametrize("message,param", [
    ({"role": "user", "content": "x", "reasoning_content": "y"}, "messages[0].reasoning_content"),
    ({"role": "user", "content": "x", "audio": {"id": "a"}}, "messages[0].audio"),
    ({"role": "assistant", "content": "", "refusal": "no"}, "messages[0].refusal")])
def test_unknown_and_unsupported_message_fields_are_refused_by_name(server, plan, message,
                                                                      param):
    r = httpx.post(f"{server}/v1/chat/completions",
                   json={"model": plan.model.id, "max_tokens": 2, "messages": [message]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


FN = {"name": "f", "parameters": {"type": "object"}}


@pytest.mark.parametrize("path,extra,param", [
    ("chat/completions", {"stream": True, "stream_options": {"bogus": 1}}, "stream_options.bogus"),
    ("chat/completions", {"stream": True, "stream_options": {"include_obfuscation": True}},
     "stream_options.include_obfuscation"),
    ("chat/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("completions", {"stream": True, "stream_options": {"bogus": 1}}, "stream_options.bogus"),
    ("chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "x", "bogus": 1}]}]}, "messages[0].content[0].bogus"),
    ("chat/completions", {"response_format": {"type": "text", "bogus": 1}},
     "response_format.bogus"),
    ("chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object"}, "bogus": "d"}}},
     "response_format.json_schema.bogus"),
    ("chat/completions", {"tools": [{"type": "function", "function": {**FN, "bogus": 1}}]},
     "tools[0].function.bogus"),
    ("chat/completions", {"tools": [{"type": "function", "function": FN, "bogus": 1}]},
     "tools[0].bogus"),
    ("chat/completions", {"tools": [{"type": "function", "function": FN}], "tool_choice": {
        "type": "function", "function": {"name": "f"}, "bogus": 1}}, "tool_choice.bogus"),
    ("responses", {"text": {"format": {"type": "json_schema", "name": "a",
                                       "schema": {"type": "object"}, "bogus": 1}}},
     "text.format.bogus"),
    # an assistant message's calls, sent back: they were taken with any keys, any type, no id
    ("chat/completions", {"messages": [*MSGS, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f"}, "bogus": 1}]}]},
     "messages[1].tool_calls[0].bogus"),
    ("chat/completions", {"messages": [*MSGS, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}",
                                                     "bogus": 1}}]}]},
     "messages[1].tool_calls[0].function.bogus"),
    ("chat/completions", {"messages": [*MSGS, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "bogus", "function": {"name": "f", "arguments": "{}"}}]}]},
     "messages[1].tool_calls[0].type"),
    ("chat/completions", {"messages": [*MSGS, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
     "messages[1].tool_calls[0].id"),
    ("responses", {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
     "input[0].call_id"),
])
def test_unknown_nested_fields_are_refused_by_name(server, plan, path, extra, param):
    """Never accepted and ignored, inside objects either."""
    body = {"model": plan.model.id, "max_tokens": 2, "messages": MSGS, **extra}
    if path == "completions":
        body = {"model": plan.model.id, "max_tokens": 2, "prompt": "x", **extra}
    if path == "responses":
        body = {"model": plan.model.id, "max_output_tokens": 16, "input": "x", **extra}
    r = httpx.post(f"{server}/v1/{path}", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def _calls(*ids):
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
        for i in ids]}


def _result(i):
    return {"role": "tool", "tool_call_id": i, "content": "2"}


@pytest.mark.parametrize("messages,param,says", [
    ([*MSGS, _result("c1")], "messages[1]", "'c1', which is not an unanswered call"),
    ([*MSGS, _calls("c1"), _result("c2")], "messages[2]", "'c2'"),
    ([*MSGS, _calls("c1"), {"role": "user", "content": "and?"}], "messages[1]",
     "tool call 'c1' has no result"),
    ([*MSGS, _calls("c1", "c2"), _result("c1"), {"role": "user", "content": "and?"}],
     "messages[1]", "tool call 'c2' has no result"),
    ([*MSGS, _calls("c1")], "messages[1]", "tool call 'c1' has no result"),
    ([*MSGS, _calls("c1"), _result("c1"), {"role": "assistant", "content": "3"},
      _result("c1")], "messages[4]", "'c1', which is not an unanswered call"),
    ([*MSGS, _calls("c1", "c1"), _result("c1"), _result("c1")], "messages[1]",
     "tool call id 'c1' is used twice in one turn"),
])
def test_tool_results_and_calls_pair_up_as_openai_requires(server, plan, messages, param,
                                                           says):
    """A result answering no call, or a call with no result, is refused as OpenAI's API
    refuses it (the template would render it, and the model read a made-up conversation)."""
    r = httpx.post(f"{server}/v1/chat/completions", json={
        "model": plan.model.id, "max_tokens": 2, "tools": TOOLS, "messages": messages})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and says in r.json()["error"]["message"]


def test_parallel_calls_may_be_answered_in_any_order(client, plan):
    r = client.chat.completions.create(
        model=plan.model.id, max_tokens=2, tools=TOOLS, messages=[
            *MSGS, _calls("c1", "c2"), _result("c2"), _result("c1"),
            {"role": "user", "content": "and?"}])
    assert r.usage.prompt_tokens > 0


def test_what_an_assistant_message_carries_back_is_accepted(client, plan):
    """An agent sends the API's own assistant message back in its history."""
    first = client.chat.completions.create(model=plan.model.id, messages=MSGS, max_tokens=3)
    back = first.choices[0].message.model_dump(exclude_none=False)
    again = client.chat.completions.create(
        model=plan.model.id, max_tokens=2, user="agent-1", metadata={"run": "1"},
        service_tier="auto", store=False, prompt_cache_key="k", safety_identifier="s",
        modalities=["text"], messages=[*MSGS, back, {"role": "user", "content": "more"}])
    assert again.usage.prompt_tokens > first.usage.prompt_tokens
    # a call max_tokens cut, streamed as far as it got (not JSON), comes back too, as
    # OpenAI takes any string: it was a 400, and every later turn of that agent failed
    calls: dict = {}
    for ch in client.chat.completions.create(model=plan.model.id, messages=MSGS, tools=TOOLS,
                                             tool_choice="required", max_tokens=30,
                                             stream=True):
        for t in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            c = calls.setdefault(t.index, {"id": t.id, "name": "", "arguments": ""})
            c["name"] += t.function.name or ""
            c["arguments"] += t.function.arguments or ""
    (cut,) = calls.values()
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut["arguments"])
    history = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": cut["id"], "type": "function",
         "function": {"name": cut["name"], "arguments": cut["arguments"]}}]},
        {"role": "tool", "tool_call_id": cut["id"], "content": "cut off"}]
    again = client.chat.completions.create(model=plan.model.id, messages=history,
                                           tools=TOOLS, max_tokens=2)
    assert again.usage.prompt_tokens > first.usage.prompt_tokens


def test_forcing_a_call_is_refused_by_name_where_calls_are_not_json(tmp_path):
    """The embedded model with mlx-lm's qwen3_coder tool parser (XML-like parameters): its
    calls cannot be forced by the JSON grammar, so required and a named function are a 400
    that says why, through both APIs; auto and none still serve."""
    import anthropic
    from conftest import app_for
    from openai import OpenAI


    for f in EMBEDDED_MODEL.iterdir():
        if f.name != "tokenizer_config.json":
            (tmp_path / f.name).symlink_to(f)
    cfg = json.loads((EMBEDDED_MODEL / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({**cfg, "tool_parser_type": "qwen3_coder"}))
    with app_for(["model=local", f"model.path={tmp_path}"]) as (plan, _, url):
        c = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for choice in ("required", {"type": "function", "function": {"name": "add"}}):
            with pytest.raises(openai.BadRequestError) as e:
                c.chat.completions.create(model=plan.model.id, messages=MSGS, tools=TOOLS,
                                          tool_choice=choice, max_tokens=5)
            assert e.value.param == "tool_choice" and "'qwen3_coder'" in e.value.message
        claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as e:
            claude.messages.create(model=plan.model.id, max_tokens=5, messages=MSGS,
                                   tools=[{"name": "add", "input_schema": ADD}],
                                   tool_choice={"type": "any"})
        assert "qwen3_coder" in e.value.body["error"]["message"]
        for choice in ("auto", "none"):
            r = c.chat.completions.create(model=plan.model.id, messages=MSGS, tools=TOOLS,
                                          tool_choice=choice, max_tokens=5)
            assert r.choices[0].finish_reason in ("stop", "length")
        # a strict tool's calls cannot be held to its schema either: said, not ignored
        strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=plan.model.id, messages=MSGS, tools=strict,
                                      max_tokens=5)
        assert e.value.param == "tools" and "strict tools off" in e.value.message


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
    # the prompt fits, max_tokens does not: the same code, which agent frameworks read to
    # compact their history (it was invalid_value, naming max_tokens)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=plan.model.id, messages=MSGS,
                                       max_tokens=plan.server.max_context)
    assert e.value.code == "context_length_exceeded" and e.value.param == "messages"
    assert "decrease input length or `max_tokens`" in e.value.message
