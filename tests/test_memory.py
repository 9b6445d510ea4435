"""Honest memory: the plan's one account against what MLX reports under a fleet workload,
and failed allocations that never reach a client (real engine, real model, on CPU)."""

from __future__ import annotations

import asyncio
import logging
import time

import mlx.core as mx
import pytest
from conftest import resolve_overrides, run_engine

from appliance.engine import Finished, FinishReason, GenerationRequest, SamplingParams
from appliance.engine.budget import Budget, KVShape
from appliance.plan.derive import GROWTH_TOKENS

AGENTS, TURNS, MAX_TOKENS = 8, 2, 48
# Stated margins: the activation estimate bounds the measured transient from above and is
# at most this many times it; weights and the RAM tier match MLX within 1 MiB + 2%.
ACTIVATION_MARGIN = 3.0


def _system(tok) -> list[int]:
    from pathlib import Path

    src = (Path(__file__).resolve().parent.parent / "appliance/engine/step.py").read_text()
    return tok.encode(src[:6000])[:1500]  # a long shared system prompt


async def _collect(engine, request) -> tuple[list[int], Finished]:
    toks = []
    async for ev in engine.submit(request):
        if isinstance(ev, Finished):
            return toks, ev
        toks.append(ev.id)


@pytest.fixture(scope="module")
def fleet():
    """8 agents sharing a 1500-token system prompt, two turns each, concurrently, with a RAM
    tier small enough to fill and evict; MLX's memory sampled after every step."""
    import gc

    from appliance.engine import build_engine

    plan = resolve_overrides(["cache.ram.bytes=64MiB"])
    gc.collect()
    base = mx.get_active_memory()  # what other tests of this process still hold
    eng = build_engine(plan)
    out = {"plan": plan, "limit": mx.get_memory_limit(),
           "loaded": mx.get_active_memory() - base}
    s = eng.scheduler
    samples, real = [], s.step

    def step():
        real()
        samples.append({"cache": mx.get_cache_memory(),
                        "kv": s.counters.kv_bytes, "reserved": s.budget.reserved,
                        "rows": s.active_rows(), "ram": s.prefix.nbytes,
                        "in_batch": s.active_rows() + len(s._held)})  # (step.HOLD: CUDA)

    s.step = step
    system = _system(eng.tokenizer)

    async def agent(i):
        history = system + eng.tokenizer.encode(f"\n# agent {i}: task {7 * i}\n")
        for t in range(TURNS):
            toks, fin = await _collect(eng, GenerationRequest(history, MAX_TOKENS))
            assert fin.error is None, fin.error
            history = history + toks + eng.tokenizer.encode(f"\n# tool output {t}\n")

    async def all_agents():
        await asyncio.gather(*(agent(i) for i in range(AGENTS)))

    mx.reset_peak_memory()
    asyncio.run(all_agents())
    out["peak"] = mx.get_peak_memory()
    time.sleep(0.2)  # the engine thread is idle now
    out.update(samples=samples, idle=mx.get_active_memory() - base, ram=s.prefix.nbytes,
               stats=eng.stats(), peak=out["peak"] - base)
    # a lone prompt near max_context: the transient of its prefill chunks
    ids = (system * 3)[:plan.server.max_context - 64]
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    run_engine(eng, GenerationRequest(ids, 4))
    out["transient"] = mx.get_peak_memory() - before - len(ids) * plan.kv.bytes_per_token
    eng.stop()
    return out


def test_mlx_limits_come_from_the_plan(fleet):
    mem = fleet["plan"].memory
    assert fleet["limit"] == mem.ceiling_bytes
    assert fleet["stats"]["memory"]["cache_limit_bytes"] == mem.buffer_cache_bytes


def test_peak_stays_under_the_ceiling(fleet):
    assert 0 < fleet["peak"] <= fleet["plan"].memory.ceiling_bytes
    assert fleet["stats"]["memory"]["allocation_failures"] == 0


def test_weights_and_the_ram_tier_are_what_mlx_holds(fleet):
    """An entry cut from a batch used to stay a lazy slice that kept the whole batch buffer
    alive: MLX held twice what the tier reported. Now the tier's bytes are MLX's bytes."""
    weights = fleet["plan"].memory.weights_bytes
    assert abs(fleet["loaded"] - weights) <= (1 << 20) + 0.02 * weights
    held = fleet["idle"] - weights  # idle: only the weights and the RAM tier are alive
    assert abs(held - fleet["ram"]) <= (1 << 20) + 0.02 * fleet["ram"]
    ram = fleet["stats"]["cache"]["ram"]
    assert ram["hits"] > 0 and ram["evictions"] > 0  # the workload used and filled the tier
    assert max(x["ram"] for x in fleet["samples"]) <= fleet["plan"].cache.ram_bytes


def test_live_kv_stays_within_what_admission_reserved(fleet):
    plan = fleet["plan"]
    growth = GROWTH_TOKENS * plan.kv.bytes_per_token
    assert max(x["rows"] for x in fleet["samples"]) >= 4  # rows really shared the engine
    for x in fleet["samples"]:
        assert x["kv"] <= x["reserved"] + x["in_batch"] * growth
        assert x["reserved"] <= plan.batch.kv_budget_bytes


def test_the_buffer_cache_stays_within_its_limit(fleet):
    assert max(x["cache"] for x in fleet["samples"]) <= fleet["plan"].memory.buffer_cache_bytes


def test_the_activation_estimate_bounds_a_prefill(fleet):
    predicted, measured = fleet["plan"].memory.activations_bytes, fleet["transient"]
    assert 0 < measured <= predicted <= ACTIVATION_MARGIN * measured, (measured, predicted)


def test_admission_counts_rows_padded_to_the_longest():
    b = Budget(2500, KVShape(full_per_token=10, sliding_per_token=0, window=0, recurrent=0))
    assert b.try_admit(1, 90, 10)  # 1000 bytes
    assert b.reserved_with(5, 5) == 2000  # the short row is padded to the long one
    assert b.try_admit(2, 5, 5) and b.reserved == 2000
    assert not b.try_admit(3, 5, 5)  # 3 x 1000 > 2500, though the tokens sum to 1200
    b.release(1)
    assert b.reserved == 100 and b.try_admit(3, 5, 5)
    b.check_integrity()


# -- failed allocations -------------------------------------------------------------------

OOM = "[malloc] Unable to allocate 1073741824 bytes: out of memory (injected)"


@pytest.fixture(scope="module")
def ram_engine():
    from appliance.engine import build_engine

    eng = build_engine(resolve_overrides(["cache=ram"]))
    yield eng
    eng.stop()


def _fail(monkeypatch, engine, when):
    """Make the real model's forward raise an allocation error whenever when(x) says so."""
    cls = type(engine.model)
    real = cls.__call__
    seen = {"n": 0}

    def call(self, x, *a, **kw):
        if when(x, seen["n"]):
            seen["n"] += 1
            raise RuntimeError(OOM)
        return real(self, x, *a, **kw)

    monkeypatch.setattr(cls, "__call__", call)
    return seen


def _fleet_requests(engine, n=4, max_tokens=16):
    no_eos = SamplingParams(logit_bias={t: -100.0 for t in engine.eos_ids})
    system = _system(engine.tokenizer)[:300]
    return [GenerationRequest(system + engine.tokenizer.encode(f"\n# agent {i}\n"), max_tokens,
                              no_eos) for i in range(n)]


def _run_all(engine, requests):
    async def go():
        return await asyncio.gather(*(_collect(engine, r) for r in requests))

    return asyncio.run(go())


def test_a_failed_allocation_fails_no_row(ram_engine, monkeypatch, caplog):
    """One allocation fails while 4 rows decode together: every row still finishes with all
    its tokens, the same ones as without the failure; the failure is logged with its
    traceback; the RAM tier was dropped."""
    reqs = _fleet_requests(ram_engine)
    want = _run_all(ram_engine, reqs)
    before = ram_engine.scheduler.allocation_failures
    seen = _fail(monkeypatch, ram_engine, lambda x, n: n == 0 and x.shape[0] >= 3)
    with caplog.at_level(logging.ERROR, logger="appliance.engine.continuous"):
        got = _run_all(ram_engine, reqs)
    assert seen["n"] == 1 and ram_engine.scheduler.allocation_failures == before + 1
    for req, (w, _), (g, fin) in zip(reqs, want, got, strict=True):
        assert fin.reason is FinishReason.LENGTH and fin.error is None
        assert fin.completion_tokens == len(g) == 16  # counted as for the original request
        assert fin.prompt_tokens == len(req.prompt)
        assert g == w
    logged = [r for r in caplog.records if "allocation failed" in r.getMessage()]
    assert logged and logged[0].exc_info is not None
    ram_engine.scheduler.check_integrity()


def test_a_lone_row_survives_a_failed_allocation(ram_engine, monkeypatch):
    req = _fleet_requests(ram_engine, n=1)[0]
    want, _ = run_engine(ram_engine, req)
    ram_engine.scheduler.prefix.trim(0)  # a cold prefill: the failure hits the lone path
    seen = _fail(monkeypatch, ram_engine, lambda x, n: n == 0)
    got, fin = run_engine(ram_engine, req)
    assert seen["n"] == 1 and fin.error is None and got == want


def test_a_request_that_keeps_failing_fails_alone(ram_engine, monkeypatch):
    """Memory that never comes back: after a few tries the request ends with the error (a
    503 with Retry-After: retry shortly), not a hang; the engine serves the next request."""
    from appliance.api.errors import generation_failed

    req = _fleet_requests(ram_engine, n=1)[0]
    _fail(monkeypatch, ram_engine, lambda x, n: True)
    toks, fin = run_engine(ram_engine, req)
    assert fin.reason is FinishReason.ERROR and "out of memory" in fin.error
    err = generation_failed(fin.error)
    assert err.status == 503 and err.code == "out_of_memory" and err.headers["Retry-After"]
    monkeypatch.undo()
    toks, fin = run_engine(ram_engine, req)
    assert fin.error is None and len(toks) == 16


def test_other_errors_still_fail_their_rows_with_a_traceback(ram_engine, monkeypatch, caplog):
    """Not an allocation failure: the row fails (HTTP 500), and the log has the traceback
    (the issue's 500s left none)."""
    req = _fleet_requests(ram_engine, n=1)[0]
    ram_engine.scheduler.prefix.trim(0)
    cls = type(ram_engine.model)
    real = cls.__call__

    def broken(self, x, *a, **kw):
        raise RuntimeError("device lost")

    monkeypatch.setattr(cls, "__call__", broken)
    with caplog.at_level(logging.ERROR, logger="appliance.engine.continuous"):
        toks, fin = run_engine(ram_engine, req)
    monkeypatch.setattr(cls, "__call__", real)
    assert fin.reason is FinishReason.ERROR and "device lost" in fin.error
    assert any(r.exc_info is not None for r in caplog.records)
