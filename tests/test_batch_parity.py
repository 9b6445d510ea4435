"""The gate: batched rows are token-exact with mlx-lm's BatchGenerator at the same B.

Static B=2/4 and a dynamic schedule (rows joining mid-decode and leaving early)
on the embedded model, a sliding-window model and a hybrid recurrent model:
against goldens/<backend>/batch-*.json and against a live BatchGenerator run.
"""

from __future__ import annotations

import pytest
from conftest import golden
from harness import Collector, cuda_shape_policy, drive

from appliance import oracle
from appliance.engine import FinishReason, GenerationRequest
from appliance.engine.budget import Budget, KVShape
from appliance.engine.continuous import ContinuousScheduler


def _scheduler(model, tok, max_rows, prefill_rows=1, compile_step=False):
    budget = Budget(1 << 40, KVShape(1, 0, 0, 0))
    return ContinuousScheduler(model, set(tok.eos_token_ids), max_rows,
                               oracle.BATCH_PREFILL_CHUNK, budget, prefill_rows=prefill_rows,
                               compile_step=compile_step)


def _rows(tok, sch) -> dict:
    """A collector for each row the schedule inserts (the oracle's prompts and lengths)."""
    prompts = oracle.batch_prompts(tok)
    return {r: Collector(GenerationRequest(prompts[r], oracle.BATCH_ROWS[r][1]))
            for _, _, r in sch["events"]}


@pytest.mark.parametrize("schedule", list(oracle.BATCH_SCHEDULES))
def test_rows_match_batch_generator(loaded, schedule):
    """Live against BatchGenerator first (every backend), then against the goldens (skipped
    where this backend has none)."""
    name, model, tok = loaded
    sch = oracle.BATCH_SCHEDULES[schedule]
    prompts = oracle.batch_prompts(tok)
    rows = _rows(tok, sch)
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
    rows = _rows(tok, sch)
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
    from appliance.engine.kv.native import FullLayout

    cuda_shape_policy(monkeypatch)
    masks = []
    make_mask = FullLayout.make_mask
    monkeypatch.setattr(FullLayout, "make_mask", lambda self, N, **kw: masks.append(
        m := make_mask(self, N, **kw)) or m)
    name, model, tok = loaded
    sch = oracle.BATCH_SCHEDULES[schedule]
    rows = _rows(tok, sch)
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
    from appliance.engine import step as step_mod
    from appliance.engine.kv import native
    from appliance.engine.kv.native import FullLayout

    cuda_shape_policy(monkeypatch)
    monkeypatch.setattr(step_mod, "HOLD", False)  # (rows leave at once: the filter is tested)
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
    rows = _rows(tok, sch)
    drive(_scheduler(model, tok, sch["max_rows"]), sch["events"], rows)
    assert {r: c.tokens for r, c in rows.items()} == oracle.run_batch_schedule(model, tok, sch)
    assert seen and all(grid for *_, grid in seen)
    assert any(trimmed for trimmed, *_ in seen) and all(t % 8 == 0 for t, *_ in seen)


@pytest.mark.parametrize("schedule", list(oracle.BATCH_SCHEDULES))
def test_finished_rows_held_until_rows_join_keep_tokens_exact(loaded, schedule, monkeypatch):
    """step.HOLD (CUDA's policy, forced here): a finished row stays in the batch, decoding
    tokens nobody reads, until rows join (one re-forming for both) or the last live row
    finishes; cancelled rows leave at once. Tokens still equal BatchGenerator's, nothing is
    delivered for a held row, and every reservation is back at the end."""
    from appliance.engine import step as step_mod
    from appliance.engine.rows import _Decoding

    monkeypatch.setattr(step_mod, "HOLD", True)
    retired, dropped = [], []
    retire, drop = _Decoding.retire, _Decoding.drop_retired
    monkeypatch.setattr(_Decoding, "retire", lambda d, i: retired.append(d.uids[i])
                        or retire(d, i))
    monkeypatch.setattr(_Decoding, "drop_retired", lambda d, also=(): dropped.append(
        (len(d.retired), len(also))) or drop(d, also))
    name, model, tok = loaded
    sch = oracle.BATCH_SCHEDULES[schedule]
    rows = _rows(tok, sch)
    s = _scheduler(model, tok, sch["max_rows"])
    drive(s, sch["events"], rows)
    assert {r: c.tokens for r, c in rows.items()} == oracle.run_batch_schedule(model, tok, sch)
    assert retired and any(held for held, _ in dropped)  # rows were held, then dropped
    assert s.budget.reserved == 0 and not s._held and s._batch._decode.retired == []


def test_a_joining_row_takes_a_held_rows_slot_in_place(loaded, monkeypatch):
    """With finished rows held (step.HOLD, forced here), a row joining takes a held row's
    slot (`_Decoding.reuse`): its KV written right-aligned at the batch's cursor, no other
    row's KV copied (no merge), the batch's buffers the same size. Tokens still equal
    BatchGenerator's (b finishes, then c joins into its slot; a finishes, then d), every
    reservation comes back, and the sliding and hybrid models (whose layers cannot take a
    row in place) join as before."""
    from appliance.engine import step as step_mod
    from appliance.engine.kv.native import FullLayout
    from appliance.engine.rows import _Decoding

    monkeypatch.setattr(step_mod, "HOLD", True)
    placed, merges = [], []
    reuse, merge = _Decoding.reuse, FullLayout._merge

    def spy(d, other):
        shapes = [getattr(c, "keys", None) is not None and c.keys.shape for c in d.layers]
        gone, put = reuse(d, other)
        if put:
            placed.append((gone, [getattr(c, "keys", None) is not None and c.keys.shape
                                  for c in d.layers] == shapes))
        return gone, put
    monkeypatch.setattr(_Decoding, "reuse", spy)
    monkeypatch.setattr(FullLayout, "_merge", lambda c, o: merges.append(1) or merge(c, o))
    name, model, tok = loaded
    sch = {"max_rows": 4, "events": [(0, "insert", "a"), (0, "insert", "b"),
                                     (16, "insert", "c"), (24, "insert", "d")]}
    rows = _rows(tok, sch)
    s = _scheduler(model, tok, sch["max_rows"])
    drive(s, sch["events"], rows)
    assert {r: c.tokens for r, c in rows.items()} == oracle.run_batch_schedule(model, tok, sch)
    assert s.budget.reserved == 0 and not s._held and s._batch._decode.retired == []
    if name == "tiny":
        assert len(placed) == 2 and all(gone and same for gone, same in placed)
        assert len(merges) == len(model.layers)  # (b joining a; c and d took held slots)
    else:
        assert not placed


def _spy_attention(cores, monkeypatch) -> list:
    """Record each attention call's (kind, query heads): 'mlx' for MLX's own call, 'compiled'
    for cores.attend (whose fallbacks to MLX's are recorded as both)."""
    calls = []
    for name, kind in (("_fused", "mlx"), ("attend", "compiled")):
        fn = getattr(cores, name)
        monkeypatch.setattr(cores, name, lambda q, *a, _fn=fn, _kind=kind, **kw:
                            calls.append((_kind, q.shape[1])) or _fn(q, *a, **kw))
    return calls


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("compile_step", [False, True])
@pytest.mark.parametrize("schedule", list(oracle.BATCH_SCHEDULES))
def test_attention_split_over_threads_matches_batch_generator(loaded, schedule, compile_step,
                                                              compiled, monkeypatch):
    """batch.attention_threads=2 (engine/kv/cores.py): attention split by kv head over two
    CPU streams, here at every size (MIN_SCORES=1, MIN_PREFILL=2: prefill passes too), with
    MLX's softmax or the compiled one (`compiled`: forced, so it is checked on any machine;
    without MLX's JIT on FMA it is only as fast as MLX's), gives BatchGenerator's tokens and
    the goldens'; the oracle itself runs on MLX's own call, unsplit (the setting is per
    thread)."""
    import mlx.core as mx

    from appliance.engine.kv import cores

    if mx.default_device() != mx.cpu:  # (the plan refuses attention_threads > 1 elsewhere)
        pytest.skip("attention over CPU streams, and its compiled softmax, are the CPU's")
    name, model, tok = loaded
    calls = _spy_attention(cores, monkeypatch)
    monkeypatch.setattr(cores, "compiled_softmax", lambda: compiled)
    monkeypatch.setattr(cores, "MIN_SCORES", 1)
    monkeypatch.setattr(cores, "MIN_PREFILL", 2)  # prefill passes split too
    sch = oracle.BATCH_SCHEDULES[schedule]
    rows = _rows(tok, sch)
    cores.use(2)
    try:
        drive(_scheduler(model, tok, sch["max_rows"], compile_step=compile_step),
              sch["events"], rows)
    finally:
        cores.reset()
    ours = list(calls)
    split = [h for _, h in ours if h < model.args.num_attention_heads]
    assert split if model.args.num_key_value_heads > 1 else not split
    assert ours and {k for k, _ in ours} == {"compiled" if compiled else "mlx"}
    got = {r: c.tokens for r, c in rows.items()}
    assert got == oracle.run_batch_schedule(model, tok, sch)
    # the oracle's attention (through the same patched call) was MLX's own, unsplit
    assert calls[len(ours):] and {c for c in calls[len(ours):]} <= {
        ("mlx", model.args.num_attention_heads)}
    assert got == golden(f"batch-{name}")["schedules"][schedule]["tokens"]


def test_compiled_softmax_attention_is_bit_equal_to_mlx():
    """cores.attend (MLX's CPU attention op for op, its softmax's exp compiled) equals
    mx.fast.scaled_dot_product_attention bit for bit: grouped and plain heads, a boolean, an
    additive and a causal mask, none, one query and many, fully masked rows included."""
    import mlx.core as mx

    from appliance.engine.kv import cores

    if mx.default_device() != mx.cpu:
        pytest.skip("the compiled softmax is the CPU backend's (MLX's CPU attention, op for op)")
    mx.random.seed(3)
    cases = [(1, 4, 2, 64, 300, "causal"), (5, 4, 2, 1, 230, "bool"), (3, 4, 2, 7, 40, "bool"),
             (2, 4, 4, 16, 50, None), (4, 4, 2, 1, 50, "add"), (1, 8, 2, 24, 70, "causal"),
             (2, 2, 1, 3, 9, "bool-rows")]
    for B, n_q, n_kv, L, T, kind in cases:
        q, k, v = (mx.random.normal((B, h, n, 32)) for h, n in ((n_q, L), (n_kv, T), (n_kv, T)))
        mask = {"causal": "causal", None: None,
                "bool": mx.random.uniform(shape=(B, 1, L, T)) > 0.3,
                "add": mx.where(mx.random.uniform(shape=(B, 1, L, T)) > 0.3, 0.0, -mx.inf),
                "bool-rows": mx.arange(T)[None, None, None] >= mx.array([0, T])[:, None, None,
                                                                                 None]}[kind]
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.17, mask=mask)
        got = cores.attend(q, k, v, scale=0.17, mask=mask)
        assert got.shape == want.shape and mx.array_equal(got, want).item(), (B, n_q, L, T, kind)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_engine_thread_splits_attention_as_planned(threads, monkeypatch):
    """build_engine turns the plan's batch.attention_threads on in the engine's thread, and
    the compiled softmax where MLX's JIT has FMA here."""
    import mlx.core as mx
    from conftest import resolve_overrides, run_engine

    from appliance import _mlx_env
    from appliance.engine import build_engine
    from appliance.engine.kv import cores

    if mx.default_device() != mx.cpu:  # (the plan refuses threads=2 on a GPU)
        pytest.skip("the split is the CPU backend's")
    plan = resolve_overrides([f"batch.attention_threads={threads}", "cache=none"])
    calls = _spy_attention(cores, monkeypatch)
    monkeypatch.setattr(cores, "MIN_SCORES", 1)
    eng = build_engine(plan)
    try:
        toks, fin = run_engine(eng, GenerationRequest([1, 2, 3, 4], 4))
    finally:
        eng.stop()
    assert len(toks) == 4
    # split calls carry part of the heads; the prompt's pass (4 tokens) is never split
    assert (len({h for _, h in calls}) > 1) == (threads == 2)
    assert {k for k, _ in calls} == {"compiled" if _mlx_env.JIT else "mlx"}


@pytest.mark.parametrize("B,L,T,split", [
    (1, 512, 2048, True),    # a lone row's prefill chunk over a 2k cache (4 query heads)
    (1, 16, 2048, False),    # a short pass: two BLAS GEMMs at once oversubscribe the cores
    (8, 1, 2200, True),      # a decode step of 8 rows over 2.2k tokens
    (2, 1, 512, False),      # a small decode step: the streams' sync costs more than it saves
])
def test_attention_splits_by_its_scores(B, L, T, split, monkeypatch):
    """What splits over two streams (engine/kv/cores.py): decode steps and passes of at least
    MIN_PREFILL tokens a row, each with at least MIN_SCORES scores, a pass's query tokens
    counted (a prefill chunk of a 4-head model over a 2k cache was never split when they
    were not); the output is bit-exact either way."""
    import mlx.core as mx

    from appliance.engine.kv import cores

    if mx.default_device() != mx.cpu:  # (the plan keeps attention_threads at 1 on a GPU)
        pytest.skip("the split is the CPU backend's")
    calls = _spy_attention(cores, monkeypatch)
    q, k, v = (mx.random.normal((B, h, n, 64)) for h, n in ((4, L), (2, T), (2, T)))
    try:
        cores.use(2)
        got = cores._split(q, k, v, scale=0.125, mask="causal" if L > 1 else None)
    finally:
        cores.reset()
    assert (len(calls) > 1) == split and {h for _, h in calls} == ({2} if split else {4})
    want = cores._fused(q, k, v, scale=0.125, mask="causal" if L > 1 else None)
    assert mx.array_equal(got, want).item()


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
        cores.reset()


@pytest.mark.parametrize("schedule", ["static-4", "dynamic"])
def test_prompts_prefilled_together_match_batch_generator(loaded, schedule):
    """batch.prefill_rows=3: waiting prompts share right-padded prefill passes, as mlx-lm's
    BatchGenerator does with prefill_batch_size=3 (live: no golden for this setting)."""
    name, model, tok = loaded
    sch = oracle.BATCH_SCHEDULES[schedule]
    rows = _rows(tok, sch)
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
