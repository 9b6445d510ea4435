"""Regressions from the outside-in attack (issue: hardening): bad sampling values never reach
MLX, one request never breaks another, and the engine thread survives a failed step."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from conftest import resolve_overrides, run_engine

from appliance.engine import FinishReason, GenerationRequest, Rejected, SamplingParams

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _post(server, plan, **body):
    return httpx.post(f"{server}/v1/chat/completions", timeout=60,
                      json={"model": plan.model.id, **CHAT, **body})


@pytest.mark.parametrize("top_k", [4096, 5000, 2**63, 2**70])
def test_top_k_past_the_vocabulary_is_a_400_and_harms_no_later_request(server, plan, top_k):
    """F1: top_k >= vocab was a 500 that left MLX's global random state broken, so every
    later unseeded sampled request failed until a restart."""
    r = _post(server, plan, temperature=0.7, top_k=top_k)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "top_k" and str(plan.model.vocab_size) in err["message"]
    after = _post(server, plan, temperature=0.7)
    assert after.status_code == 200, after.text  # was 500 "[eval] ... without a primitive"
    assert after.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("seed", [-1, 2**64, 2**80])
def test_seed_out_of_range_is_a_400_naming_seed(server, plan, seed):
    """F2: a negative seed or one past 64 bits was a 500 TypeError from mx.random.key."""
    r = _post(server, plan, temperature=0.7, seed=seed)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "seed"


def test_the_largest_seed_is_served(server, plan):
    r = _post(server, plan, temperature=0.7, seed=2**64 - 1)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("sampling,field", [
    (SamplingParams(temperature=0.7, top_k=4096), "top_k"),
    (SamplingParams(temperature=0.7, seed=-1), "seed"),
])
def test_the_engine_itself_refuses_what_mlx_would_fail_on(engine, sampling, field):
    """Callers that skip the API (benchmarks, tests) are checked at submit too."""
    async def go():
        engine.submit(GenerationRequest([1, 2, 3], 2, sampling))

    with pytest.raises(Rejected) as e:
        asyncio.run(go())
    assert e.value.status == 400 and e.value.param == field


def test_a_broken_global_random_state_is_repaired():
    """mlx-lm's compiled top-k raising mid-trace leaves mx.random.state unusable; the engine
    repairs it after a failed step."""
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    from appliance.engine.sampling import repair_random_state

    x = mx.zeros((1, 16))
    with pytest.raises(ValueError):
        make_sampler(temp=0.7, top_k=99)(x)
    with pytest.raises(RuntimeError):
        mx.eval(mx.random.categorical(x))
    repair_random_state()
    assert 0 <= mx.random.categorical(x).item() < 16


@pytest.fixture
def fresh_engine():
    from appliance.engine import build_engine

    eng = build_engine(resolve_overrides([]))
    yield eng
    eng.stop()


def test_a_step_that_raises_fails_its_rows_and_the_engine_goes_on(fresh_engine):
    """F8: an exception escaping the scheduler's step used to end the engine thread; every
    request then hung while /health said ok."""
    s = fresh_engine.scheduler
    real = s.step
    calls = {"n": 0}

    def step_once_broken():
        calls["n"] += 1
        if calls["n"] == 2:  # after the request's first step: it is in flight
            raise RuntimeError("injected fault")
        return real()

    s.step = step_once_broken
    toks, fin = run_engine(fresh_engine, GenerationRequest([1, 2, 3, 4], 8))
    assert fin.reason is FinishReason.ERROR and "injected fault" in fin.error
    toks, fin = run_engine(fresh_engine, GenerationRequest([1, 2, 3, 4], 4))
    assert fin.reason is FinishReason.LENGTH and len(toks) == 4
    assert fresh_engine.failure is None


def test_an_engine_that_cannot_recover_says_so(fresh_engine):
    """When even failing the rows fails, the engine records why: new requests get 503 (not a
    hang) and /health answers 503."""
    from litestar.testing import TestClient

    from appliance.api import create_app

    s = fresh_engine.scheduler

    def broken(*_):
        raise RuntimeError("injected fault")

    s.step, s.fail_all = broken, broken
    toks, fin = run_engine(fresh_engine, GenerationRequest([1, 2, 3, 4], 8))
    assert fin.reason is FinishReason.ERROR
    deadline = time.time() + 10
    while fresh_engine.failure is None and time.time() < deadline:
        time.sleep(0.01)
    assert "injected fault" in fresh_engine.failure

    plan = resolve_overrides([])
    with TestClient(create_app(plan, fresh_engine), base_url="http://127.0.0.1") as c:
        h = c.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "failed"
        r = c.post("/v1/completions", json={"model": plan.model.id, "prompt": "x",
                                            "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_failed"


def test_a_body_nested_too_deep_is_a_400(server, plan):
    """F4: 10,000 brackets inside an unknown field was a 500 RecursionError."""
    body = (f'{{"model":"{plan.model.id}","prompt":"x","max_tokens":2,"junk":'
            + "[" * 10000 + "]" * 10000 + "}")
    r = httpx.post(f"{server}/v1/completions", content=body, timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert _post(server, plan).status_code == 200  # and the server goes on


def _strict(line: str):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(line, parse_constant=refuse)


def test_stream_events_are_strict_json_even_for_nan_logprobs(server, plan):
    """F5: an extreme repetition_penalty makes log-probabilities NaN / -inf; the stream wrote
    bare NaN and -Infinity (invalid JSON), where the non-streaming body has null."""
    from appliance.api import wire

    assert _strict(wire.sse({"x": float("nan"), "y": float("-inf")})[6:].decode()) \
        == {"x": None, "y": None}
    with httpx.stream("POST", f"{server}/v1/chat/completions", timeout=60, json={
            "model": plan.model.id, **CHAT, "stream": True, "logprobs": True,
            "top_logprobs": 2, "repetition_penalty": 1e-30, "max_tokens": 4}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert all(_strict(e) is not None for e in events[:-1])
    # and a number, as OpenAI's schema has it (-9999 for a token ruled out), never null
    assert wire._lp(float("nan")) == wire._lp(float("-inf")) == wire.FLOOR == -9999.0
    lps = [x["logprob"] for e in events[:-1] for c in _strict(e)["choices"]
           if c.get("logprobs") for t in c["logprobs"]["content"] for x in [t, *t["top_logprobs"]]]
    assert lps and all(isinstance(v, float) for v in lps)


def test_an_unexpected_500_is_logged():
    """F9: a 500 from an unexpected exception left nothing in the log."""
    import logging

    from litestar import Litestar, get
    from litestar.testing import TestClient

    from appliance.api.errors import HANDLERS

    @get("/boom")
    async def boom() -> dict:
        raise KeyError("injected")

    app = Litestar([boom], exception_handlers=HANDLERS)  # (it configures logging itself)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append
    logging.getLogger("appliance.api").addHandler(handler)
    try:
        with TestClient(app) as c:
            r = c.get("/boom")
    finally:
        logging.getLogger("appliance.api").removeHandler(handler)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert any("500 on GET /boom" in rec.getMessage() and rec.exc_info for rec in records)


def test_a_key_no_schema_declares_is_refused_naming_the_nearest():
    """F10: `+batch.max_row=4`, which Hydra's own hint suggests for a typo, was accepted and
    did nothing."""
    from appliance.plan import PlanError

    with pytest.raises(PlanError) as e:
        resolve_overrides(["+batch.max_row=4", "+server.hots=0.0.0.0"])
    msg = str(e.value)
    assert "batch.max_row is not a setting" in msg and "did you mean batch.max_rows?" in msg
    assert "server.hots" in msg and "did you mean server.host?" in msg


def test_a_prompt_far_past_the_context_is_refused_before_tokenizing(server, plan):
    """F3 (and issue 14): a 5 MB prompt was tokenized in full first (10 s, /health stalled
    9.5 s) and the 400 named max_tokens; agent frameworks look for context_length_exceeded."""
    t = time.perf_counter()
    r = httpx.post(f"{server}/v1/completions", timeout=60, json={
        "model": plan.model.id, "prompt": "def f(x):\n    return x\n" * 200_000,
        "max_tokens": 4})
    assert time.perf_counter() - t < 2.0
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded"
    assert err["param"] == "prompt"
    r = _post(server, plan, messages=[{"role": "user", "content": "x " * 5000}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert r.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("path,body,param", [
    ("chat/completions", {"max_tokens": "5"}, "max_tokens"),
    ("chat/completions", {"temperature": "0.5"}, "temperature"),
    ("chat/completions", {"stream": "true"}, "stream"),
    ("chat/completions", {"max_tokens": 2.5}, "max_tokens"),
    ("completions", {"prompt": "x", "max_tokens": "4"}, "max_tokens"),
    ("responses", {"input": "x", "max_output_tokens": "16"}, "max_output_tokens"),
    ("messages", {"max_tokens": "4"}, "max_tokens"),
])
def test_a_value_of_the_wrong_json_type_is_a_400_naming_it(server, plan, path, body, param):
    """A string where the API takes a number or a boolean is refused, as OpenAI's API does,
    not coerced (Litestar's lenient conversion let "5" through as 5)."""
    base = {"model": plan.model.id, "messages": [{"role": "user", "content": "hi"}]}
    if path in ("completions", "responses"):
        base = {"model": plan.model.id}
    if path == "messages":
        base["max_tokens"] = 4
    r = httpx.post(f"{server}/v1/{path}", json={**base, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert param in err["message"] and "got `" in err["message"]
    if path != "messages":  # (Anthropic's error body has no param)
        assert err["param"] == param
    assert _post(server, plan).status_code == 200  # and the right types still serve


def test_max_tokens_and_max_completion_tokens_must_agree(server, plan):
    """Both names set to different values: which one to honor is a guess; a 400 says so."""
    r = _post(server, plan, max_tokens=3, max_completion_tokens=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens"
    assert _post(server, plan, max_tokens=3, max_completion_tokens=3).status_code == 200
