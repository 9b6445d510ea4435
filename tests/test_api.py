"""The real app over a real socket, driven by the official openai client (and raw HTTP)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest
from conftest import golden_cases

from appliance import oracle

NAMES = [c["name"] for c in oracle.CASES]  # goldens are read per test (golden_cases)


def _sampling(case):
    s = dict(case.get("sampling", {}))
    extra = {k: s.pop(k) for k in ("top_k", "min_p") if k in s}
    return s, extra


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("stream", [False, True])
def test_served_text_equals_the_oracle(client, plan, engine, name, stream):
    case = golden_cases()[name]
    s, extra = _sampling(case)
    kw = dict(model=plan.model.id, max_tokens=case["max_tokens"], stream=stream,
              extra_body=extra or None, **s)
    if case["kind"] == "chat":
        call = lambda: client.chat.completions.create(messages=case["messages"], **kw)  # noqa
    else:
        call = lambda: client.completions.create(prompt=case["prompt"], **kw)  # noqa
    want = engine.tokenizer.decode(case["tokens"])
    finish = "length" if len(case["tokens"]) == case["max_tokens"] else "stop"
    if not stream:
        r = call()
        choice = r.choices[0]
        text = choice.message.content if case["kind"] == "chat" else choice.text
        assert text == want
        assert choice.finish_reason == finish
        assert r.usage.prompt_tokens == len(case["prompt_ids"])
        assert r.usage.completion_tokens == len(case["tokens"])
        assert r.system_fingerprint == plan.fingerprint
    else:
        parts, finishes = [], []
        for chunk in call():
            assert chunk.system_fingerprint == plan.fingerprint
            for c in chunk.choices:
                parts.append((c.delta.content if case["kind"] == "chat" else c.text) or "")
                finishes.append(c.finish_reason)
        assert "".join(parts) == want
        assert [f for f in finishes if f] == [finish]


def test_stop_sequences_cut_the_text(client, plan, engine):
    case = golden_cases()["class-greedy"]
    full = engine.tokenizer.decode(case["tokens"])
    stop = full[5:8]  # somewhere inside the greedy continuation
    for stream in (False, True):
        r = client.completions.create(model=plan.model.id, prompt=case["prompt"],
                                      max_tokens=case["max_tokens"], stop=[stop, "@@never@@"],
                                      stream=stream)
        if stream:
            chunks = list(r)
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            text, finish = r.choices[0].text, r.choices[0].finish_reason
        assert text == full[: full.find(stop)]
        assert finish == "stop"


def test_no_logprobs_past_a_stop(client, plan, engine):
    """The tokens a response's logprobs carry are those whose text starts before the stop:
    the last of them starts inside the text returned (none begins at or after the cut)."""
    case = golden_cases()["class-greedy"]
    full = engine.tokenizer.decode(case["tokens"])
    for cut in range(6, 14, 3):  # stops beginning at several points of the continuation
        stop = full[cut:cut + 3]
        for stream in (False, True):
            r = client.completions.create(model=plan.model.id, prompt=case["prompt"],
                                          max_tokens=case["max_tokens"], stop=[stop],
                                          logprobs=1, stream=stream)
            choices = [c.choices[0] for c in r if c.choices] if stream else r.choices
            text = "".join(c.text for c in choices)
            tokens = [t for c in choices if c.logprobs for t in c.logprobs.tokens]
            assert text == full[: full.find(stop)] and tokens
            assert len("".join(tokens[:-1])) < len(text) <= len("".join(tokens)), (stop, tokens)
            offsets = [o for c in choices if c.logprobs for o in c.logprobs.text_offset]
            assert offsets == [len("".join(tokens[:k])) for k in range(len(tokens))]


def test_a_matched_stop_finishes_with_stop_though_max_tokens_came_first(engine):
    """A stop string cancels the request when its text is read, but the tokens generated
    before that may already have reached max_tokens (a slow reader here; a pipelined step
    or a run of accepted drafts in a server): the finish reason is "stop" (it was
    "length", more often with a draft)."""
    import asyncio

    from appliance.api.textgen import Done, generate_text
    from appliance.engine import GenerationRequest

    case = golden_cases()["class-greedy"]
    full = engine.tokenizer.decode(case["tokens"])
    stop = full[5:8]
    before = engine.stats()["finished_rows"]

    def slow_reader(handle):  # the engine ends the request before its first token is read
        while engine.stats()["finished_rows"] == before:
            time.sleep(0.01)

    async def read():
        return [x async for x in generate_text(
            engine, engine.tokenizer, GenerationRequest(case["prompt_ids"], case["max_tokens"]),
            (stop,), slow_reader)]

    out = asyncio.run(read())
    done = out[-1]
    assert isinstance(done, Done) and done.stop_sequence == stop
    assert "".join(p.text for p in out[:-1]) == full[: full.find(stop)]
    assert done.finish_reason == "stop"


def test_logprob_bytes_rebuild_characters_split_across_tokens(client, plan):
    """OpenAI's `bytes` are each token's own bytes, so characters split across tokens can
    be rebuilt; a token holding part of one reported U+FFFD's bytes. (The output is
    forced to a string of such characters.)"""
    r = client.chat.completions.create(
        model=plan.model.id, messages=[{"role": "user", "content": "smile"}], max_tokens=20,
        logprobs=True, response_format={"type": "json_schema", "json_schema": {
            "name": "e", "schema": {"type": "string", "enum": ["🙂 é"]}}})
    entries = r.choices[0].logprobs.content
    assert any(e.token == "\ufffd" for e in entries)  # (a character split across tokens)
    assert b"".join(bytes(e.bytes) for e in entries).decode() == \
        r.choices[0].message.content == '"🙂 é"'


def test_stream_usage_when_asked(client, server, plan):
    chunks = list(client.chat.completions.create(
        model=plan.model.id, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
        stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].choices == []
    # on the wire, every chunk before the last carries "usage": null, as OpenAI's do
    body = {"model": plan.model.id, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=60) as r:
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    assert all("usage" in e and e["usage"] is None for e in events[:-1])
    assert events[-1]["usage"]["completion_tokens"] == 5


def test_null_n_and_stream_are_their_defaults(server, plan):
    """OpenAI's API reads null as unset; n and stream were 400s."""
    r = httpx.post(f"{server}/v1/chat/completions", timeout=60, json={
        "model": plan.model.id, "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3, "n": None, "stream": None})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"


def test_raw_sse_framing(server, plan):
    body = {"model": plan.model.id, "prompt": "def ", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines)
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_models_plan_health_openapi(client, server, plan):
    assert [m.id for m in client.models.list().data] == [plan.model.id]
    assert client.models.retrieve(plan.model.id).id == plan.model.id
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-nope")
    assert e.value.body["code"] == "model_not_found" and "gpt-nope" in e.value.body["message"]
    p = httpx.get(f"{server}/v1/plan").json()
    assert p["fingerprint"] == plan.fingerprint
    assert p["model"]["path"] == Path(plan.model.path).name  # no key: no absolute paths
    assert httpx.get(f"{server}/health").json()["status"] == "ok"
    schema = httpx.get(f"{server}/schema/openapi.json").json()
    assert "/v1/chat/completions" in schema["paths"]
    assert {"200", "404"} <= set(schema["paths"]["/v1/models/{model_id}"]["get"]["responses"])


@pytest.mark.parametrize("body,param", [
    ({"max_tokens": "many"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 7}, "temperature"),
    ({"top_p": -0.5}, "top_p"),
    ({"n": 2}, "n"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]},
     "messages[1].content"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "4"}]},
     "messages[1].tool_call_id"),
    ({"stop": [""]}, "stop"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"max_tokens": 10**7}, "messages"),  # (past the context: context_length_exceeded)
])
def test_invalid_requests_get_400_naming_the_field(server, plan, body, param):
    req = {"model": plan.model.id, "messages": [{"role": "user", "content": "hi"}], **body}
    r = httpx.post(f"{server}/v1/chat/completions", json=req, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert param.split("[")[0] in err["message"]


def test_a_completions_batch_of_one_prompt_is_that_prompt(server, client, plan, engine):
    """OpenAI's batch forms ([string], [[ids]]) holding one prompt answer as the prompt
    alone; more than one (n=1 here) or a mixed list is a 400 naming `prompt`."""
    text = "def add(a, b):"
    ids = list(engine.tokenizer.encode(text))
    want = client.completions.create(model=plan.model.id, prompt=text,
                                     max_tokens=6).choices[0].text
    for one in ([text], [ids]):
        assert client.completions.create(model=plan.model.id, prompt=one,
                                         max_tokens=6).choices[0].text == want
    for bad, says in (([text, text], "2 prompts"), ([ids[0], text], "mixes"), ([[]], "empty")):
        r = httpx.post(f"{server}/v1/completions",
                       json={"model": plan.model.id, "prompt": bad, "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        assert says in r.json()["error"]["message"]


def test_malformed_json_and_unknown_model(server, client):
    r = httpx.post(f"{server}/v1/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    # a lone UTF-16 surrogate escape (a JS client's sliced emoji) is not JSON either: msgspec
    # says "Input data was truncated", which read as the client's fault of another kind
    for path, body in (("/v1/chat/completions", r'"messages":[{"role":"user","content":"a"}],'
                                                r'"stop":["\ud800"]'),
                       ("/v1/messages", r'"messages":[{"role":"user","content":"\ud800"}]'),
                       ("/v1/completions", r'"prompt":"a\udcffb"'), ("/v1/responses", "")):
        r = httpx.post(f"{server}{path}", content='{"model":"x","max_tokens":2,' + body + "}",
                       headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["message"].startswith("invalid request body: not valid JSON"), r.text
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-9", prompt="x", max_tokens=2)
    assert e.value.body["param"] == "model"


def test_disconnect_cancels_generation(server, plan, engine):
    before = engine.stats()["tokens_generated"]
    no_eos = {str(t): -100 for t in engine.eos_ids}  # only a cancel can end it early
    body = {"model": plan.model.id, "prompt": "def ", "max_tokens": 3000, "stream": True,
            "logit_bias": no_eos}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break  # hang up early
    deadline = time.time() + 30
    while engine.stats()["active_rows"] and time.time() < deadline:
        time.sleep(0.05)
    assert engine.stats()["active_rows"] == 0
    assert engine.stats()["tokens_generated"] - before < 3000  # cancelled before max_tokens
    # and the server still answers
    r = httpx.post(f"{server}/v1/completions", json={**body, "stream": False, "max_tokens": 2})
    assert r.status_code == 200


def _answered(server: str, status: str) -> float:
    """Responses /metrics counted with `status` on the completion endpoints."""
    text = httpx.get(f"{server}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("appliance_requests_total{") and f'status="{status}"' in line
               and "completions" in line)


def test_non_streaming_disconnect_cancels_too(server, plan, engine):
    before = engine.stats()["tokens_generated"]
    errors, gone = _answered(server, "500"), _answered(server, "499")
    no_eos = {str(t): -100 for t in engine.eos_ids}
    body = {"model": plan.model.id, "prompt": "def ", "max_tokens": 3000, "logit_bias": no_eos}
    for timeout in (1.0, 0.05):  # mid-decode, and before the first token
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{server}/v1/completions", json=body, timeout=timeout)  # it gives up
        deadline = time.time() + 30
        while engine.stats()["active_rows"] and time.time() < deadline:
            time.sleep(0.05)
        assert engine.stats()["active_rows"] == 0
    assert engine.stats()["tokens_generated"] - before < 6000
    # A client that left is not a server error: counted as 499 (nobody reads it), never 500
    # (closing the request's generator while its cancelled reader still ran it once was).
    deadline = time.time() + 10
    while _answered(server, "499") - gone < 2 and time.time() < deadline:
        time.sleep(0.05)
    assert _answered(server, "499") - gone == 2
    assert _answered(server, "500") == errors


def test_top_p_zero_keeps_the_most_likely_token(client, plan):
    """OpenAI accepts top_p=0: the smallest nucleus, the most likely token alone, so a
    sampled request decodes as a greedy one (MLX's samplers read 0 as no top-p: sampling
    from the whole distribution). Chat, completions and responses."""
    messages = [{"role": "user", "content": "Write a function that reverses a list."}]

    def chat(**kw):
        return client.chat.completions.create(model=plan.model.id, messages=messages,
                                              max_tokens=24, **kw).choices[0].message.content

    def text(**kw):
        return client.completions.create(model=plan.model.id, prompt="def reverse(xs):",
                                         max_tokens=24, **kw).choices[0].text

    def resp(seed=None, **kw):  # (the Responses API has no seed)
        return client.responses.create(model=plan.model.id, input=messages[0]["content"],
                                       max_output_tokens=24, **kw).output_text

    for ask in (chat, text, resp):
        greedy = ask(temperature=0)
        assert all(ask(temperature=1.0, top_p=0, seed=s) == greedy for s in (1, 2, 3))
        # (the check has teeth: sampling the whole distribution parts from greedy)
        assert any(ask(temperature=1.0, top_p=1, seed=s) != greedy for s in (1, 2, 3))


def test_http_equals_a_live_mlx_lm_run(client, plan):
    """Beyond the goldens: prompts chosen now, served over HTTP, against mlx-lm run directly
    on the model /v1/plan names, in the plan's dtype."""
    model, tok = oracle.load(plan.model.path, plan.model.dtype)
    prompt = "class Cache:\n    def get(self, key):\n        "
    want = oracle.generate(model, tok, tok.encode(prompt), 20,
                           {"temperature": 0.9, "top_k": 30, "seed": 21})
    r = client.completions.create(model=plan.model.id, prompt=prompt, max_tokens=20,
                                  temperature=0.9, seed=21, extra_body={"top_k": 30})
    assert r.choices[0].text == tok.decode(want)
    messages = [{"role": "system", "content": "Answer in Python."},
                {"role": "user", "content": "Parse a CSV line."}]
    ids = oracle.prompt_ids(tok, {"kind": "chat", "messages": messages})
    want = oracle.generate(model, tok, ids, 16, {})
    r = client.chat.completions.create(model=plan.model.id, messages=messages, max_tokens=16)
    assert r.choices[0].message.content == tok.decode(want)
