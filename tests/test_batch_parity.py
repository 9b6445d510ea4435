"""The gate: batched rows are token-exact with mlx-lm's BatchGenerator at the same B.

Static B=2/4 and a dynamic schedule (rows joining mid-decode and leaving early)
on the embedded model, a sliding-window model and a hybrid recurrent model:
against goldens/<backend>/batch-*.json and against a live BatchGenerator run.
"""

from __future__ import annotations

import pytest
from conftest import golden
from harness import Collector, drive

from appliance import oracle
from appliance.engine import FinishReason, GenerationRequest
from appliance.engine.budget import Budget, KVShape
from appliance.engine.continuous import ContinuousScheduler


def _scheduler(model, tok, max_rows, prefill_rows=1, compile_step=False):
    budget = Budget(1 << 40, KVShape(1, 0, 0, 0))
    return ContinuousScheduler(model, set(tok.eos_token_ids), max_rows,
                               oracle.BATCH_PREFILL_CHUNK, budget, prefill_rows=prefill_rows,
                               compile_step=compile_step)


@pytest.mark.parametrize("schedule", list(oracle.BATCH_SCHEDULES))
def test_rows_match_batch_generator(loaded, schedule):
    """Live against BatchGenerator first (every backend), then against the goldens (skipped
    where this backend has none)."""
    name, model, tok = loaded
    sch = oracle.BATCH_SCHEDULES[schedule]
    prompts = oracle.batch_prompts(tok)
    rows = {r: Collector(GenerationRequest(prompts[r], oracle.BATCH_ROWS[r][1]))
            for _, _, r in sch["events"]}
    drive(_scheduler(model, tok, sch["max_rows"]), sch["events"], rows)

    got = {r: c.tokens for r, c in rows.items()}
    assert got == oracle.run_batch_schedule(model, tok, sch)
    for r, c in rows.items():
        removed = any(e[1] == "remove" and e[2] == r for e in sch["events"])
        want = FinishReason.CANCELLED if removed else FinishReason.LENGTH
        if not removed and len(c.tokens) < oracle.BATCH_ROWS[r][1]:
            want = FinishReason.STOP
        assert c.finished.reason == want and c.finished.completion_tokens == len(c.tokens)
    gold = golden(f"batch-{name}")
    assert prompts == gold["prompts"]
    assert got == gold["schedules"][schedule]["tokens"]


@pytest.mark.parametrize("schedule", list(oracle.BATCH_SCHEDULES))
def test_compiled_step_matches_batch_generator(loaded, schedule):
    """batch.compile_step: the decode step as one compiled graph over whole KV buffers
    (models whose layers are all full attention; the others run uncompiled, and must
    still match) gives BatchGenerator's tokens, and the goldens'."""
    name, model, tok = loaded
    sch = oracle.BATCH_SCHEDULES[schedule]
    prompts = oracle.batch_prompts(tok)
    rows = {r: Collector(GenerationRequest(prompts[r], oracle.BATCH_ROWS[r][1]))
            for _, _, r in sch["events"]}
    scheduler = _scheduler(model, tok, sch["max_rows"], compile_step=True)
    drive(scheduler, sch["events"], rows)
    got = {r: c.tokens for r, c in rows.items()}
    assert got == oracle.run_batch_schedule(model, tok, sch)
    assert got == golden(f"batch-{name}")["schedules"][schedule]["tokens"]


@pytest.mark.parametrize("prefill_rows", [1, 3])
@pytest.mark.parametrize("schedule", list(oracle.BATCH_SCHEDULES))
def test_cuda_shape_policy_matches_batch_generator(loaded, schedule, prefill_rows,
                                                   monkeypatch):
    """On CUDA, decode steps and prefill passes of several rows attend over whole KV
    buffers (unwritten slots masked) and prefill chunks are right-padded to a few widths
    (`engine/prefill.py` `prefill_width`), so MLX's attention sees few shapes; a lone
    row's prefill attends with the fused kernel over its exact keys. The same arithmetic,
    run here, gives BatchGenerator's tokens (and the goldens' where they apply)."""
    from appliance.engine import prefill as prefill_mod
    from appliance.engine import rows as rows_mod
    from appliance.engine import step as step_mod
    from appliance.engine.kv.native import FullLayout

    for mod in (rows_mod, step_mod, prefill_mod):
        monkeypatch.setattr(mod, "WHOLE_BUFFER", True)
    masks = []
    make_mask = FullLayout.make_mask
    monkeypatch.setattr(FullLayout, "make_mask", lambda self, N, **kw: masks.append(
        m := make_mask(self, N, **kw)) or m)
    name, model, tok = loaded
    sch = oracle.BATCH_SCHEDULES[schedule]
    prompts = oracle.batch_prompts(tok)
    rows = {r: Collector(GenerationRequest(prompts[r], oracle.BATCH_ROWS[r][1]))
            for _, _, r in sch["events"]}
    drive(_scheduler(model, tok, sch["max_rows"], prefill_rows=prefill_rows), sch["events"],
          rows)
    got = {r: c.tokens for r, c in rows.items()}
    assert got == oracle.run_batch_schedule(model, tok, sch, prefill_rows=prefill_rows)
    # a lone prefilling row of full-attention layers takes the fused ("causal") kernel
    fused = "causal" in [m for m in masks if isinstance(m, str)]
    assert fused if name == "tiny" and prefill_rows == 1 else (fused <= (name == "tiny"))
    if prefill_rows == 1:
        assert got == golden(f"batch-{name}")["schedules"][schedule]["tokens"]


def test_rows_leaving_keep_the_buffer_on_the_step_grid(loaded, monkeypatch):
    """On CUDA (`native.GRID_TRIM`) a row leaving trims the others' common left padding
    only in whole steps, from a buffer of its own, so widths stay whole steps and a batch
    size's shapes recur. With the CUDA shape policy on and an 8-slot step (so the short
    test prompts trim), tokens still equal BatchGenerator's over rows joining and leaving."""
    from appliance.engine import prefill as prefill_mod
    from appliance.engine import rows as rows_mod
    from appliance.engine import step as step_mod
    from appliance.engine.kv import native
    from appliance.engine.kv.native import FullLayout

    for mod in (rows_mod, step_mod, prefill_mod):
        monkeypatch.setattr(mod, "WHOLE_BUFFER", True)
    monkeypatch.setattr(native, "GRID_TRIM", True)
    monkeypatch.setattr(FullLayout, "step", 8)
    seen = []  # (trimmed slots, width after, a whole number of steps)
    filter_ = FullLayout.filter

    def spy(self, keep):
        before = self._idx
        filter_(self, keep)
        if self.keys is not None:
            seen.append((before - self._idx, self.keys.shape[2], self.keys.shape[2] % 8 == 0))
    monkeypatch.setattr(FullLayout, "filter", spy)
    name, model, tok = loaded
    sch = oracle.BATCH_SCHEDULES["dynamic"]
    prompts = oracle.batch_prompts(tok)
    rows = {r: Collector(GenerationRequest(prompts[r], oracle.BATCH_ROWS[r][1]))
            for _, _, r in sch["events"]}
    drive(_scheduler(model, tok, sch["max_rows"]), sch["events"], rows)
    assert {r: c.tokens for r, c in rows.items()} == oracle.run_batch_schedule(model, tok, sch)
    assert seen and all(grid for *_, grid in seen)
    assert any(trimmed for trimmed, *_ in seen) and all(t % 8 == 0 for t, *_ in seen)


@pytest.mark.parametrize("compile_step", [False, True])
@pytest.mark.parametrize("schedule", list(oracle.BATCH_SCHEDULES))
def test_attention_split_over_threads_matches_batch_generator(loaded, schedule, compile_step,
                                                              monkeypatch):
    """batch.attention_threads=2 (engine/kv/cores.py): attention split by kv head over two
    CPU streams, here at every size (MIN_SCORES=1, MIN_PREFILL=2: prefill passes too), gives
    BatchGenerator's tokens and the goldens'; the oracle itself runs unsplit (the setting is
    per thread)."""
    from appliance.engine.kv import cores

    name, model, tok = loaded
    heads = []
    fused = cores._fused
    monkeypatch.setattr(cores, "_fused", lambda q, *a, **kw: heads.append(q.shape[1])
                        or fused(q, *a, **kw))
    monkeypatch.setattr(cores, "MIN_SCORES", 1)
    monkeypatch.setattr(cores, "MIN_PREFILL", 2)  # prefill passes split too
    sch = oracle.BATCH_SCHEDULES[schedule]
    prompts = oracle.batch_prompts(tok)
    rows = {r: Collector(GenerationRequest(prompts[r], oracle.BATCH_ROWS[r][1]))
            for _, _, r in sch["events"]}
    cores.use(2)
    try:
        drive(_scheduler(model, tok, sch["max_rows"], compile_step=compile_step),
              sch["events"], rows)
    finally:
        cores.use(1)
    split = [h for h in heads if h < model.args.num_attention_heads]
    assert split if model.args.num_key_value_heads > 1 else not split
    got = {r: c.tokens for r, c in rows.items()}
    assert got == oracle.run_batch_schedule(model, tok, sch)
    # the oracle's attention (through the same patched call) was not split
    assert [h for h in heads if h < model.args.num_attention_heads] == split
    assert got == golden(f"batch-{name}")["schedules"][schedule]["tokens"]


@pytest.mark.parametrize("threads", [1, 2])
def test_the_engine_thread_splits_attention_as_planned(threads, monkeypatch):
    """build_engine turns the plan's batch.attention_threads on in the engine's thread."""
    from conftest import resolve_overrides, run_engine

    from appliance.engine import build_engine
    from appliance.engine.kv import cores

    plan = resolve_overrides([f"batch.attention_threads={threads}", "cache=none"])
    if plan.machine.backend != "cpu":
        pytest.skip("the split is the CPU backend's")
    heads = []
    fused = cores._fused
    monkeypatch.setattr(cores, "_fused", lambda q, *a, **kw: heads.append(q.shape[1])
                        or fused(q, *a, **kw))
    monkeypatch.setattr(cores, "MIN_SCORES", 1)
    eng = build_engine(plan)
    try:
        toks, fin = run_engine(eng, GenerationRequest([1, 2, 3, 4], 4))
    finally:
        eng.stop()
    assert len(toks) == 4
    # split calls carry part of the heads; the prompt's pass (4 tokens) is never split
    assert (len(set(heads)) > 1) == (threads == 2)


def test_attention_streams_are_kept_per_thread():
    """A thread that builds engine after engine (a bench) reuses its extra streams: each is
    a thread of MLX's."""
    from appliance.engine.kv import cores

    try:
        cores.use(2)
        first = list(cores._local.streams)
        cores.use(1)
        assert cores._local.streams is None
        cores.use(2)
        assert cores._local.streams == first and len(cores._local.pool) == 1
    finally:
        cores.use(1)


@pytest.mark.parametrize("schedule", ["static-4", "dynamic"])
def test_prompts_prefilled_together_match_batch_generator(loaded, schedule):
    """batch.prefill_rows=3: waiting prompts share right-padded prefill passes, as mlx-lm's
    BatchGenerator does with prefill_batch_size=3 (live: no golden for this setting)."""
    name, model, tok = loaded
    sch = oracle.BATCH_SCHEDULES[schedule]
    prompts = oracle.batch_prompts(tok)
    rows = {r: Collector(GenerationRequest(prompts[r], oracle.BATCH_ROWS[r][1]))
            for _, _, r in sch["events"]}
    drive(_scheduler(model, tok, sch["max_rows"], prefill_rows=3), sch["events"], rows)
    assert {r: c.tokens for r, c in rows.items()} == oracle.run_batch_schedule(
        model, tok, sch, prefill_rows=3)


def test_goldens_match_the_models(loaded):
    from importlib.metadata import version

    name, _, _ = loaded
    gold = golden(f"batch-{name}")
    path = oracle.model_path(name)
    import hashlib
    from pathlib import Path

    assert gold["config_sha256"] == hashlib.sha256(
        (Path(path) / "config.json").read_bytes()).hexdigest()
    assert gold["versions"] == {"mlx": version("mlx"), "mlx-lm": version("mlx-lm")}
