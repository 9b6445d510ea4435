"""Structured output: response_format enforced by llguidance masks, per row, in the batch."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import mlx.core as mx
import pytest
from conftest import run_engine

from appliance.api.grammar import compile_grammar, json_rule
from appliance.engine import GenerationRequest, SamplingParams

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    "ok": {"type": "boolean"}},
    "required": ["name", "age", "tags", "ok"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "strict": True,
                                                 "schema": PERSON}}
MSGS = [{"role": "user", "content": "Describe a person as JSON."}]
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOL_SCHEMAS = {"add": ADD, "describe": PERSON}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": p}}
         for n, p in TOOL_SCHEMAS.items()]
ASK = [{"role": "user", "content": "Add 2 and 3."}]


def _ask(client, plan, **kw):
    return client.chat.completions.create(model=plan.model.id, messages=MSGS, max_tokens=80,
                                          response_format=FORMAT, **kw)


def test_json_schema_output_validates(client, plan):
    r = _ask(client, plan)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_streaming_and_seeded_sampling(client, plan):
    texts = []
    for seed in (1, 1, 2, 3):
        chunks = _ask(client, plan, stream=True, temperature=1.0, top_p=0.95, seed=seed)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        jsonschema.validate(json.loads(text), PERSON)
        texts.append(text)
    assert texts[0] == texts[1]  # same seed, same constrained sample


def test_logprobs_under_a_grammar_are_numbers(server, plan):
    """The alternatives the grammar masks are left out of top_logprobs (they were -inf,
    written as null, which OpenAI's schema does not allow: logprob is a number)."""
    r = httpx.post(f"{server}/v1/chat/completions", timeout=60, json={
        "model": plan.model.id, "messages": MSGS, "max_tokens": 12, "temperature": 0,
        "response_format": FORMAT, "logprobs": True, "top_logprobs": 5}).json()
    content = r["choices"][0]["logprobs"]["content"]
    values = [e["logprob"] for t in content for e in [t, *t["top_logprobs"]]]
    assert values and all(isinstance(v, float) and v > -1e4 for v in values)
    assert min(len(t["top_logprobs"]) for t in content) < 5  # a forced token: fewer left


def test_constrained_and_free_rows_share_a_batch(client, plan, engine):
    """Eight concurrent requests, half constrained (various sampling), half free."""
    def one(i):
        if i % 2:
            r = _ask(client, plan, temperature=0.7 * (i % 3), seed=i, logprobs=i == 5,
                     top_logprobs=2 if i == 5 else None,
                     extra_body={"top_k": 50} if i == 3 else None)
            jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
            return "json"
        r = client.chat.completions.create(model=plan.model.id, messages=MSGS, max_tokens=40,
                                           temperature=0.5, seed=i)
        return r.choices[0].message.content

    before = engine.stats()
    with ThreadPoolExecutor(8) as pool:
        out = list(pool.map(one, range(8)))
    assert out[1::2] == ["json"] * 4 and all(isinstance(t, str) for t in out[::2])
    assert engine.stats()["finished_rows"] - before["finished_rows"] == 8


def test_json_object_and_bias_compose(client, plan, engine):
    brace = engine.tokenizer.encode("}", add_special_tokens=False)[0]
    r = client.chat.completions.create(model=plan.model.id, messages=MSGS, max_tokens=40,
                                       response_format={"type": "json_object"},
                                       logit_bias={str(brace): 100})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_a_format_s_description_is_an_annotation_as_langchain_sends_it(server, client, plan):
    """LangChain's structured output from a JSON schema sends its description beside the
    name; both are annotations (the output is held to the schema), each a string. The
    output is the same as without them; the Responses API's flat format reads them too."""
    described = {**FORMAT["json_schema"], "description": "A person, as JSON."}
    r = client.chat.completions.create(model=plan.model.id, messages=MSGS, max_tokens=80,
                                       temperature=0, response_format={
                                           "type": "json_schema", "json_schema": described})
    assert r.choices[0].message.content == _ask(client, plan, temperature=0).choices[0] \
        .message.content
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    text = {"format": {"type": "json_schema", **described}}
    out = client.responses.create(model=plan.model.id, input=MSGS[0]["content"],
                                  max_output_tokens=80, text=text)
    jsonschema.validate(json.loads(out.output_text), PERSON)
    for path, body in (("chat/completions", {"messages": MSGS, "response_format": {
            "type": "json_schema", "json_schema": {**described, "description": 7}}}),
                       ("responses", {"input": "x", "text": {"format": {**text["format"],
                                                                        "name": ["x"]}}})):
        r = httpx.post(f"{server}/v1/{path}", json={"model": plan.model.id, **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] in ("response_format.json_schema.description",
                                              "text.format.name")


@pytest.mark.parametrize("schema", [{"type": "foo"}, {"$ref": "#/definitions/nope"}])
def test_a_schema_llguidance_cannot_compile_is_a_400(server, plan, schema):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    r = httpx.post(f"{server}/v1/chat/completions", json={
        "model": plan.model.id, "messages": MSGS, "response_format": fmt})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format.json_schema.schema"
    r = httpx.post(f"{server}/v1/chat/completions", json={
        "model": plan.model.id, "messages": MSGS, "response_format": {"type": "xml"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.type"


def test_the_serial_engine_obeys_the_grammar_too(serial_engine, plan):
    tok = serial_engine.tokenizer
    g = compile_grammar(tok, plan.model.vocab_size, f"start: {json_rule(PERSON)}", "x", "")
    ids = tok.encode("<|im_start|>user\nJSON<|im_end|>\n<|im_start|>assistant\n")
    toks, fin = run_engine(serial_engine, GenerationRequest(
        ids, 80, SamplingParams(temperature=0.8, seed=4, constraint=g)))
    jsonschema.validate(json.loads(tok.decode(toks)), PERSON)


def test_the_processor_follows_rollbacks(engine, plan):
    """Called at several positions and rolled back, as speculative decoding will: each call's
    mask is the mask of the history it is given."""
    tok = engine.tokenizer
    g = compile_grammar(tok, plan.model.vocab_size, f"start: {json_rule(PERSON)}", "x", "")
    text = json.dumps({"name": "Al", "age": 7, "tags": ["a"], "ok": True})
    gen = tok.encode(text, add_special_tokens=False)
    prompt = [5, 6, 7]
    logits = mx.zeros((1, plan.model.vocab_size))

    def mask(p, n):
        return (p(mx.array(prompt + gen[:n]), logits) > -mx.inf).tolist()[0]

    def fresh(n):  # a new row's processor: called at the first position, then at n
        q = g.make_processor()
        mask(q, 0)
        return mask(q, n)

    want = [fresh(n) for n in range(len(gen) + 1)]
    assert len({tuple(w) for w in want}) > 5  # the masks differ along the way
    p = g.make_processor()
    for n in range(len(gen) + 1):  # the straight path
        assert mask(p, n) == want[n]
    for n in (3, 9, 2, len(gen), 0, 5):  # jumps back and forth
        assert mask(p, n) == want[n]
    wrong = prompt + gen[:4] + [tok.encode("@", add_special_tokens=False)[0]]
    only_eos = (p(mx.array(wrong), logits) > -mx.inf).tolist()[0]
    assert {i for i, ok in enumerate(only_eos) if ok} == set(tok.eos_token_ids)  # off: end
    assert mask(p, 6) == want[6]  # and back on it


EXAMPLES = ('{"name": "Ada", "age": 36, "tags": ["a", "b"], "ok": true}\n'
            '{"name": "Bob", "age": 41, "tags": ["c"], "ok": false}\n') * 2
EDIT = ("def parse(text):\n    items = []\n    for line in text.splitlines():\n"
        "        items.append(line.strip())\n    return items\n\n"
        "# the same function, renamed\ndef parse_lines(text):\n")


def _mixed_batch(url: str, model: str) -> list[tuple[str, str, int]]:
    """Eight concurrent requests in one batch: JSON-schema rows (two streamed, two seeded
    and sampled), free completions, and a forced tool call. (kind, text, drafts kept)."""
    from openai import OpenAI

    c = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def one(i: int):
        sampled = dict(temperature=0.8, seed=i) if i >= 4 else dict(temperature=0)
        if i % 2:
            r = c.completions.create(model=model, prompt=EDIT, max_tokens=40, **sampled)
            text, usage = r.choices[0].text, r.usage
        elif i == 6:
            r = c.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                          tool_choice="required", parallel_tool_calls=False,
                                          max_tokens=60, **sampled)
            call = r.choices[0].message.tool_calls[0].function
            return "call", f"{call.name} {call.arguments}", 0
        else:
            kw = dict(model=model, max_tokens=80, response_format=FORMAT, **sampled,
                      messages=[{"role": "user", "content": "People as JSON:\n" + EXAMPLES}])
            if i in (2, 4):
                chunks = list(c.chat.completions.create(
                    stream=True, stream_options={"include_usage": True}, **kw))
                text = "".join(ch.choices[0].delta.content or "" for ch in chunks
                               if ch.choices)
                usage = chunks[-1].usage
            else:
                r = c.chat.completions.create(**kw)
                text, usage = r.choices[0].message.content, r.usage
        kind = "free" if i % 2 else "json"
        return kind, text, usage.completion_tokens_details.accepted_prediction_tokens

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(8)))


def test_constrained_rows_speculate_exactly(server, plan):
    """Constrained decoding composes with speculative decoding (draft=lookup, speculating
    at every step): in one batch of JSON-schema rows, free rows and a forced call, streamed
    and not, greedy and seeded, every constrained output validates, drafts are kept on
    greedy constrained rows (seeded sampled rows do not speculate), and the greedy rows
    equal this server's (draft=none) output."""
    from conftest import ORACLE_PIN, app_for

    # this server's settings (ORACLE_PIN), with the draft the only difference
    with app_for(["draft=lookup", "draft.adaptive=false", *ORACLE_PIN]) as (p, engine, url):
        spec = _mixed_batch(url, p.model.id)
        proposed = engine.stats()["speculation"]["lookup"]["proposed"]
    plain = _mixed_batch(server, plan.model.id)
    assert proposed > 0
    for i, ((kind, text, kept), (_, want, _)) in enumerate(zip(spec, plain, strict=True)):
        if kind == "json":
            jsonschema.validate(json.loads(text), PERSON)
            if i < 4:
                assert kept > 0, i  # the row speculated, and drafts survived its grammar
            else:  # seeded and sampled: it proposes nothing, so its text is reproducible
                assert kept == 0, i
        if kind == "call":
            name, args = text.split(" ", 1)
            jsonschema.validate(json.loads(args), TOOL_SCHEMAS[name])
        if i < 4:  # temperature 0: exactly the output without a draft
            assert text == want, i
