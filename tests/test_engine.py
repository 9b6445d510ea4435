"""Engines at B=1 against the serial oracle: goldens and a live mlx-lm run, token for token."""

from __future__ import annotations

import asyncio
import threading

import pytest
from conftest import golden, golden_cases, run_engine

from appliance import oracle
from appliance.engine import FinishReason, GenerationRequest, SamplingParams

NAMES = [c["name"] for c in oracle.CASES]  # goldens are read per test: a backend without
DEFS = {c["name"]: c for c in oracle.CASES}  # them still runs the live mlx-lm comparisons


def _request(case: dict, max_tokens: int | None = None) -> GenerationRequest:
    return GenerationRequest(case["prompt_ids"], max_tokens or case["max_tokens"],
                             SamplingParams(**case.get("sampling", {})))


def test_goldens_match_this_model_and_versions(plan):
    from importlib.metadata import version

    gold = golden("tiny")
    assert gold["config_sha256"] == plan.model.config_sha256
    assert gold["dtype"] == plan.model.dtype
    assert gold["versions"] == {"mlx": version("mlx"), "mlx-lm": version("mlx-lm")}


def test_prompts_tokenize_as_mlx_lm_server(engine):
    for case in golden("tiny")["cases"]:
        assert oracle.prompt_ids(engine.tokenizer, case) == case["prompt_ids"]


@pytest.mark.parametrize("name", NAMES)
def test_engine_matches_goldens(any_engine, name):
    case = golden_cases()[name]
    toks, fin = run_engine(any_engine, _request(case))
    assert toks == case["tokens"]
    expected = FinishReason.LENGTH if len(toks) == case["max_tokens"] else FinishReason.STOP
    assert fin.reason == expected
    assert fin.completion_tokens == len(toks) and fin.prompt_tokens == len(case["prompt_ids"])


@pytest.fixture(scope="module")
def oracle_model(plan):
    return oracle.load(plan.model.path, plan.model.dtype)


@pytest.mark.parametrize("sampling", [
    {},
    {"temperature": 0.9, "seed": 1234},
    {"temperature": 1.2, "top_k": 5, "seed": 5},
    {"temperature": 1.0, "top_p": 0.5, "min_p": 0.1, "seed": 99},
])
def test_engine_matches_live_mlx_lm(any_engine, oracle_model, sampling):
    """Beyond the goldens: a longer prompt (several prefill chunks) and fresh settings."""
    model, tok = oracle_model
    ids = tok.encode(open(__file__).read()[:1500])
    assert len(ids) > 200
    want = oracle.generate(model, tok, ids, 40, sampling)
    got, _ = run_engine(any_engine, GenerationRequest(ids, 40, SamplingParams(**sampling)))
    assert got == want


def test_chunked_prefill_matches_mlx_lm_chunking(oracle_model):
    """Prefill in 64-token chunks, as generate_step(prefill_step_size=64) does."""
    from appliance.engine.runner import generate

    model, tok = oracle_model
    ids = tok.encode(open(__file__).read()[:1500])
    want = oracle.generate(model, tok, ids, 20, {}, prefill_step_size=64)
    got = [t for t, _ in generate(model, ids, 20, SamplingParams(), prefill_chunk=64)]
    assert got[:len(want)] == want and len(want) > 0


def test_max_tokens_and_cancel(any_engine):
    engine = any_engine
    case = golden_cases()["def-greedy"]
    toks, fin = run_engine(engine, _request(case, max_tokens=3))
    assert toks == case["tokens"][:3] and fin.reason == FinishReason.LENGTH

    import asyncio

    from appliance.engine import Finished

    async def cancel_after_two():
        handle = engine.submit(GenerationRequest(case["prompt_ids"], 200))
        got = []
        async for ev in handle:
            if isinstance(ev, Finished):
                return got, ev
            got.append(ev.id)
            if len(got) == 2:
                handle.cancel()

    got, fin = asyncio.run(cancel_after_two())
    assert fin.reason == FinishReason.CANCELLED
    assert 2 <= len(got) <= 3  # honoured at the next token


def test_eos_ends_generation(any_engine):
    """A logit bias that forces EOS: finish is 'stop' and EOS is never delivered."""
    engine = any_engine
    eos = min(engine.eos_ids)
    ids = oracle.prompt_ids(engine.tokenizer, DEFS["def-greedy"])
    toks, fin = run_engine(engine, GenerationRequest(
        ids, 10, SamplingParams(logit_bias={eos: 100.0})))
    assert toks == [] and fin.reason == FinishReason.STOP


def test_a_failing_request_does_not_stop_the_engine(any_engine):
    engine = any_engine
    bad, fin = run_engine(engine, GenerationRequest([], 5))  # nothing to run the model on
    assert bad == [] and fin.reason == FinishReason.ERROR and fin.error
    ids = oracle.prompt_ids(engine.tokenizer, DEFS["def-greedy"])
    toks, fin = run_engine(engine, GenerationRequest(ids, 5))
    assert fin.reason in (FinishReason.LENGTH, FinishReason.STOP) and fin.error is None
    assert toks and len(toks) <= 5


@pytest.mark.parametrize("end", ["cancel", "stop"])
def test_a_lone_long_prefill_ends_between_its_chunks(monkeypatch, end):
    """A lone row prefilled its whole prompt before the engine looked again: a client gone
    or a server stopping mid-prefill waited out every chunk (a 50k-token prompt: ~130 s on
    CPU, and uvicorn's drain timeout answered 500). Now each chunk is one engine step, and
    nothing of the unfinished prompt is stored as a turn."""
    from conftest import resolve_overrides

    from appliance.engine import Finished, build_engine

    engine = build_engine(resolve_overrides(["batch.prefill_chunk=64", "cache=ram"]))
    model_cls, passes = type(engine.model), []
    real = model_cls.__call__
    ids = engine.tokenizer.encode(open(__file__).read()[:6000])[:1600]  # 25 chunks

    async def go():
        handle = engine.submit(GenerationRequest(ids, 8, SamplingParams()))

        def counted(self, *a, **kw):
            passes.append(1)
            if len(passes) == 3:
                handle.cancel() if end == "cancel" else threading.Thread(
                    target=engine.stop).start()
            return real(self, *a, **kw)

        monkeypatch.setattr(model_cls, "__call__", counted)
        got = []
        async for ev in handle:
            if isinstance(ev, Finished):
                return got, ev
            got.append(ev.id)

    try:
        got, fin = asyncio.run(go())
    finally:
        monkeypatch.setattr(model_cls, "__call__", real)
        engine.stop()
    assert got == [] and fin.reason == FinishReason.CANCELLED
    assert len(passes) <= 4  # the chunk in flight (and one more at most): not all 25
    assert engine.scheduler.prefix.stats()["ram"]["entries"] == 0
