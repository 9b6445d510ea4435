"""server.warmup: a burst of the batch's shapes before serving, on GPU backends by default.
It leaves nothing behind: no prefix-cache entries, no counters, the same tokens after."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
from conftest import golden_cases, resolve_overrides, run_engine

from appliance.engine import build_engine
from appliance.engine.types import GenerationRequest, SamplingParams
from appliance.engine.warmup import burst
from appliance.plan import PlanError


def test_auto_warms_gpu_backends_only(monkeypatch):
    resolve_mod = importlib.import_module("appliance.plan.resolve")
    plan = resolve_overrides([])
    if plan.machine.backend == "cpu":
        assert plan.server.warmup is False
        assert "warmup=false" in plan.derived["server.warmup"]
    here = resolve_mod.detect()
    monkeypatch.setattr(resolve_mod, "detect", lambda: dataclasses.replace(here, backend="cuda"))
    gpu = resolve_overrides([])
    assert gpu.server.warmup is True and "first time" in gpu.derived["server.warmup"]
    assert resolve_overrides(["server.warmup=false"]).server.warmup is False
    assert "server.warmup" not in resolve_overrides(["server.warmup=false"]).derived


def test_a_bad_value_names_the_choices():
    with pytest.raises(PlanError, match="server.warmup='soon'; valid choices: auto, true, false"):
        resolve_overrides(["server.warmup=soon"])


def test_the_burst_fills_the_batch_with_one_full_chunk():
    reqs = burst(8, 512, 4096, {0, 2}, 4096)
    # (the last is sent late: longer than any row can have grown to, 512 + 24)
    assert [len(r.prompt) for r in reqs] == [512] + [16] * 7 + [512 + 24 + 16]
    assert all(r.max_tokens == 8 + 2 * 8 for r in reqs)  # all 8 rows decode together
    assert not {0, 1, 2} & {t for r in reqs for t in r.prompt}
    assert reqs[0].sampling.logit_bias == {0: -100.0, 2: -100.0}
    # a context limit below a chunk: every row still fits it
    assert [len(r.prompt) + r.max_tokens for r in burst(8, 512, 4096, {0, 2}, 100)] == \
        [100] + [16 + 24] * 7 + [100]


@pytest.mark.parametrize("overrides", [
    ["cache=ram", "draft=lookup", "batch.max_rows=4"],
    ["batch=serial"],  # (bfloat16: the goldens' dtype)
])
def test_a_warmed_engine_starts_clean_and_gives_the_goldens(overrides):
    plan = resolve_overrides(["server.warmup=true", "model.dtype=bfloat16", *overrides])
    engine = build_engine(plan)
    try:
        stats = engine.stats()
        assert stats["warmup_seconds"] > 0
        assert stats["tokens_generated"] == 0 and stats["finished_rows"] == 0
        assert stats["kv_reserved_bytes"] in (0, None)
        assert stats["cache"].get("ram", {}).get("entries", 0) == 0
        for name in ("def-greedy", "docstring-temp"):
            case = golden_cases()[name]
            toks, _ = run_engine(engine, GenerationRequest(
                case["prompt_ids"], case["max_tokens"], SamplingParams(**case.get("sampling", {}))))
            assert toks == case["tokens"]
    finally:
        engine.stop()


def test_a_warm_up_with_a_draft_speculates_at_every_batch_size(monkeypatch):
    """The adaptive control decodes plainly until a batch size has settled, so the burst
    never speculated, and on an H200 the first speculative step of a fresh process took
    22.4 s of compiles inside a client's request. The burst's own control (`Alternating`)
    speculates at every batch size it meets twice; the engine still starts clean."""
    from appliance.engine import warmup

    seen, real = [], warmup.warm_up

    def spy(scheduler, requests):
        seen.append(scheduler)
        return real(scheduler, requests)

    monkeypatch.setattr(warmup, "warm_up", spy)
    plan = resolve_overrides(["server.warmup=true", "draft=mtp", "batch.max_rows=4",
                              "batch.prefill_chunk=64"])
    engine = build_engine(plan)
    try:
        (s,) = seen
        assert isinstance(s.control, warmup.Alternating) and s.control.sizes == {1, 2, 3, 4}
        assert s._batch.spec_ticks >= 4
        stats = engine.stats()
        assert stats["tokens_generated"] == 0 and stats["speculation"]["mtp"]["proposed"] == 0
    finally:
        engine.stop()


def test_the_warm_up_re_forms_a_batch_around_finished_rows(monkeypatch):
    """With finished rows held in the batch (step.HOLD, CUDA's policy; forced here), the
    burst still re-forms a batch around rows still decoding: after the first rows finished,
    a short row joins into a held row's slot (`_Decoding.reuse`) and a long one, too long
    for a slot, makes the held rows leave with live rows beside them (the kernels of both
    are built before serving, not in a client's request). Nothing is left behind."""
    from appliance.engine import step as step_mod
    from appliance.engine.rows import _Decoding

    monkeypatch.setattr(step_mod, "HOLD", True)
    drops, drop = [], _Decoding.drop_retired
    monkeypatch.setattr(_Decoding, "drop_retired", lambda d, also=(): drops.append(
        (len(d.retired), d.live - len(also))) or drop(d, also))
    placed, reuse = [], _Decoding.reuse

    def spy(d, other):
        gone, put = reuse(d, other)
        placed.append(put)
        return gone, put
    monkeypatch.setattr(_Decoding, "reuse", spy)
    engine = build_engine(resolve_overrides(["server.warmup=true", "batch.max_rows=4",
                                             "batch.prefill_chunk=64"]))
    try:
        assert any(held and survivors for held, survivors in drops), drops
        assert any(placed), placed
        stats = engine.stats()
        assert stats["tokens_generated"] == 0 and stats["finished_rows"] == 0
        assert stats["kv_reserved_bytes"] in (0, None)
    finally:
        engine.stop()
