"""The continuous scheduler: admission, failure containment and per-row sampling."""

from __future__ import annotations

import pytest
from harness import Collector, drive

from appliance import oracle
from appliance.engine import FinishReason, GenerationRequest, SamplingParams
from appliance.engine.budget import Budget, KVShape
from appliance.engine.continuous import ContinuousScheduler


@pytest.fixture(scope="module")
def tiny():
    return oracle.load(oracle.model_path("tiny"), "float32")


def _sched(tiny, max_rows=4, budget_bytes=1 << 40):
    """Rows cost one byte per token, so budgets below are in tokens."""
    model, tok = tiny
    return ContinuousScheduler(model, set(tok.eos_token_ids), max_rows, 32,
                               Budget(budget_bytes, KVShape(1, 0, 0, 0)))


def _prompt(tok, i, n=30):
    return oracle.batch_prompts(tok)["abcd"[i % 4]][:n]


def test_budget_shapes():
    s = KVShape(full_per_token=10, sliding_per_token=4, window=16, recurrent=100)
    assert s.row_bytes(8) == 80 + 32 + 100
    assert s.row_bytes(100) == 1000 + 64 + 100  # sliding layers capped at the window
    b = Budget(2000, s)
    assert b.try_admit(1, 50, 50) and not b.try_admit(2, 50, 50)
    b.release(1)
    assert b.try_admit(2, 50, 50) and b.reserved == 1164
    b.check_integrity()


@pytest.mark.parametrize("prefilling", [1, 2])
def test_every_row_is_charged_its_native_start_and_a_prefilling_row_its_chunk_past_it(
        prefilling):
    """A row holds native KV until kv.start tokens (plus a verify's drafts), in a batch
    too; then encoded. A row being prefilled, lone or batched, runs generate_step's
    arithmetic, whose chunk may carry it past start natively: the budget sets that surplus
    aside once for each row prefilled at a time (batch.prefill_rows)."""
    s = KVShape(full_per_token=3, sliding_per_token=0, window=0, recurrent=0,
                native_per_token=10, start=64, spec=2, chunk=8, prefilling=prefilling)
    assert s.row_bytes(50) == 500  # short: native
    assert s.row_bytes(100) == max(300, 66 * 10) == 660  # its native phase was bigger
    assert s.row_bytes(400) == 1200  # long: encoded
    assert s.prefill_extra == prefilling * 10 * 5
    b = Budget(prefilling * 50 + 3 * 660, s)
    assert b.room == 3 * 660
    assert all(b.try_admit(i, 50, 50) for i in range(3)) and not b.try_admit(9, 1, 1)
    assert not b.fits_alone(600, 61) and b.fits_alone(600, 60)
    b.check_integrity()


@pytest.mark.parametrize("hold", [False, True])
def test_admission_waits_for_bytes_head_of_line(tiny, hold, monkeypatch):
    """Rows cost 40 bytes each; a 100-byte budget runs two at a time, in arrival order.
    `hold` (step.HOLD, CUDA's policy): a finished row stays in the batch with its
    reservation until rows join, or until admission needs its bytes, as here."""
    from appliance.engine import step as step_mod
    from appliance.engine.rows import _Decoding

    monkeypatch.setattr(step_mod, "HOLD", hold)
    retired = []
    retire = _Decoding.retire
    monkeypatch.setattr(_Decoding, "retire", lambda d, i: retired.append(d.uids[i])
                        or retire(d, i))
    _, tok = tiny
    s = _sched(tiny, max_rows=8, budget_bytes=100)
    rows = [Collector(GenerationRequest(_prompt(tok, i, 30), 10)) for i in range(4)]
    for r in rows:
        s.add(r)
    seen_active, first_token, finished = [], {}, {}
    step, handed_back = 0, False  # held bytes given to a waiting row while others decode
    while s.has_work():
        was_held = bool(s._held)
        s.step()
        s.check_integrity()
        step += 1
        seen_active.append(s.active_rows())
        handed_back |= was_held and not s._held and s.active_rows() == 2 and not all(
            r.finished for r in rows[:2])
        assert s.budget.reserved <= 100
        for i, r in enumerate(rows):
            if r.tokens:
                first_token.setdefault(i, step)
            if r.finished is not None:
                finished.setdefault(i, step)
    assert max(seen_active) == 2
    assert all(r.finished.reason in (FinishReason.LENGTH, FinishReason.STOP) for r in rows)
    # FIFO, head of line: rows start in arrival order, and the last two get no token before
    # one of the first two has finished and freed its 40 bytes
    assert first_token[0] <= first_token[1] <= first_token[2] <= first_token[3]
    assert first_token[2] > min(finished[0], finished[1])
    assert s.budget.reserved == 0 and s.active_rows() == 0
    assert bool(retired) == hold == handed_back and not s._held


def test_a_failing_delivery_evicts_only_that_row(tiny):
    model, tok = tiny
    sch = oracle.BATCH_SCHEDULES["static-4"]
    prompts = oracle.batch_prompts(tok)
    want = oracle.run_batch_schedule(model, tok, sch)
    rows = {r: Collector(GenerationRequest(prompts[r], oracle.BATCH_ROWS[r][1])) for r in "abcd"}
    rows["c"].fail_delivery = True
    drive(_sched(tiny), sch["events"], rows)
    assert rows["c"].tokens == [] and rows["c"].finished is None  # gone, never delivered
    for r in "abd":
        assert rows[r].tokens == want[r]  # siblings unaffected, still exact


def test_a_forward_error_fails_rows_in_flight_and_serving_goes_on(tiny, monkeypatch):
    model, tok = tiny
    s = _sched(tiny)
    a, b = (Collector(GenerationRequest(_prompt(tok, i), 20)) for i in range(2))
    s.add(a)
    s.add(b)
    s.step()
    calls = {"n": 0}
    real = type(model).__call__

    def broken(self, *args, **kw):
        calls["n"] += 1
        raise RuntimeError("device lost")

    monkeypatch.setattr(type(model), "__call__", broken)
    s.step()
    monkeypatch.setattr(type(model), "__call__", real)
    assert calls["n"] >= 1
    assert a.finished.reason == FinishReason.ERROR and "device lost" in a.finished.error
    assert b.finished.reason == FinishReason.ERROR
    c = Collector(GenerationRequest(_prompt(tok, 2), 8))
    drive(s, [(0, "insert", "c")], {"c": c})
    assert c.tokens == oracle.generate(model, tok, _prompt(tok, 2), 8, {})
    s.check_integrity()


def test_seeded_rows_are_independent_of_their_siblings(tiny):
    """A seeded row gives the same tokens alone, among other seeded rows, and as
    mlx-lm's serial `mx.random.seed` run."""
    model, tok = tiny
    p = _prompt(tok, 0)
    seeded = {"temperature": 1.0, "top_k": 50, "seed": 42}
    serial = oracle.generate(model, tok, p, 16, seeded)

    def run(siblings):
        rows = {"x": Collector(GenerationRequest(p, 16, SamplingParams(**seeded)))}
        for i, sp in enumerate(siblings):
            rows[f"s{i}"] = Collector(GenerationRequest(_prompt(tok, i + 1), 16,
                                                        SamplingParams(**sp)))
        drive(_sched(tiny), [(0, "insert", r) for r in rows], rows)
        return rows["x"].tokens

    assert run([]) == serial
    assert run([{"temperature": 0.7, "seed": 1}, {"temperature": 1.3}, {}]) == serial


def test_penalties_and_bias_stay_in_their_row(tiny):
    model, tok = tiny
    p0, p1 = _prompt(tok, 0), _prompt(tok, 1)
    forced = 100
    rows = {"biased": Collector(GenerationRequest(p0, 6, SamplingParams(
                logit_bias={forced: 100.0}))),
            "penalised": Collector(GenerationRequest(p1, 12, SamplingParams(
                repetition_penalty=1.5))),
            "plain": Collector(GenerationRequest(p1, 12))}
    drive(_sched(tiny), [(0, "insert", r) for r in rows], rows)
    assert rows["biased"].tokens == [forced] * 6
    assert rows["plain"].tokens == oracle.generate(model, tok, p1, 12, {})
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_logits_processors

    want = [t for t, _ in generate_step(mx.array(p1), model, max_tokens=12,
                                        logits_processors=make_logits_processors(
                                            repetition_penalty=1.5))]
    got = rows["penalised"].tokens
    assert got and got == want[:len(got)]
    assert len(got) == 12 or want[len(got)] in tok.eos_token_ids  # cut short only by EOS


def test_logprobs_per_row(tiny):
    _, tok = tiny
    rows = {"lp": Collector(GenerationRequest(_prompt(tok, 0), 5, logprobs=3)),
            "none": Collector(GenerationRequest(_prompt(tok, 1), 5))}
    drive(_sched(tiny), [(0, "insert", r) for r in rows], rows)
    for ev in rows["lp"].events[:-1]:
        assert len(ev.top) == 3 and ev.logprob <= 0
        assert ev.top[0][0] == ev.id and ev.top[0][1] == pytest.approx(ev.logprob)  # greedy
        assert [v for _, v in ev.top] == sorted((v for _, v in ev.top), reverse=True)
    assert all(ev.logprob is None for ev in rows["none"].events[:-1])


def test_a_lone_row_runs_solo_then_hands_over_to_the_batch(tiny):
    """Alone, a row decodes unbatched (generate_step arithmetic); when a second row
    arrives its cache, history and sampler move into the batch and both continue.
    On this backend the batched arithmetic equals the serial one at these sizes, so
    both rows must equal mlx-lm's serial generation token for token."""
    model, tok = tiny
    s = _sched(tiny)
    pa, pb = _prompt(tok, 0), _prompt(tok, 1)
    rows = {"a": Collector(GenerationRequest(pa, 20, SamplingParams(
                temperature=0.8, seed=5, repetition_penalty=1.2))),
            "b": Collector(GenerationRequest(pb, 10))}
    s.add(rows["a"])
    s.step()
    assert s._solo is not None and s.active_rows() == 1
    for _ in range(4):
        s.step()
    drive(s, [(0, "insert", "b")], rows)
    assert s._solo is None
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    mx.random.seed(5)
    want_a = [t for t, _ in generate_step(
        mx.array(pa), model, max_tokens=20, sampler=make_sampler(temp=0.8),
        logits_processors=make_logits_processors(repetition_penalty=1.2))]
    got = rows["a"].tokens
    assert len(got) > 5 and got == want_a[:len(got)]
    assert len(got) == 20 or want_a[len(got)] in tok.eos_token_ids  # cut short only by EOS
    assert rows["b"].tokens == oracle.generate(model, tok, pb, 10, {})


@pytest.mark.parametrize("shape", ["tiny-gemma3", "tiny-qwen3-next"])
def test_solo_hand_over_with_sliding_and_recurrent_layers(shape):
    """The solo row's RotatingKVCache / ArraysCache state merges into the batch; prompts
    longer than the 16-token window make the sliding layers wrap first."""
    model, tok = oracle.load(oracle.model_path(shape), "float32")
    s = ContinuousScheduler(model, set(tok.eos_token_ids), 4, 32,
                            Budget(1 << 40, KVShape(1, 0, 0, 0)))
    prompts = oracle.batch_prompts(tok)
    rows = {"a": Collector(GenerationRequest(prompts["b"], 24)),
            "b": Collector(GenerationRequest(prompts["a"], 8))}
    s.add(rows["a"])
    for _ in range(6):
        s.step()
    assert s._solo is not None
    drive(s, [(0, "insert", "b")], rows)
    for c in rows.values():
        assert c.finished.reason in (FinishReason.LENGTH, FinishReason.STOP), c.finished
        want = oracle.generate(model, tok, c.request.prompt, c.request.max_tokens, {})
        assert c.tokens == want  # batched == serial on this backend at these sizes


def test_a_batchs_logit_biases_are_one_scatter_with_the_adds_of_row_by_row():
    """BiasTable adds each row's LogitBias (its first processor) for the whole batch at
    once: the same values as the processors applied row by row, at one position a row
    (a decode step) and at several (a verify pass); rebuilt when the rows change."""
    import mlx.core as mx

    from appliance.engine.sampling import BiasTable, LogitBias, after_bias, make_processors

    mx.random.seed(0)
    penalized = make_processors(SamplingParams(logit_bias={7: 5.0}, repetition_penalty=1.3))
    procs = [(LogitBias({1: 2.0, 7: -100.0}),), (), (LogitBias({3: 1.5}),), tuple(penalized)]
    assert after_bias(procs[3]) == tuple(penalized[1:]) and after_bias(procs[1]) == ()
    table = BiasTable()
    for shape in ((4, 50), (4, 3, 50)):
        logits = mx.random.normal(shape).astype(mx.bfloat16)
        rows = []
        for e, p in enumerate(procs):
            row = logits[e]
            if p:
                row = p[0](None, row if row.ndim == 2 else row[None])
            rows.append(row.reshape(logits.shape[1:]))
        got = table.add(logits, procs)
        assert got.dtype == logits.dtype and mx.array_equal(got, mx.stack(rows)).item()
    # rows changed (one left, one with another bias joined): the table follows them
    later = [procs[2], (LogitBias({0: -3.0}),)]
    logits = mx.random.normal((2, 50))
    want = mx.concatenate([p[0](None, logits[e:e + 1]) for e, p in enumerate(later)])
    assert mx.array_equal(table.add(logits, later), want).item()
    assert table.add(logits, [(), ()]) is logits


def test_unseeded_rows_with_the_same_settings_share_one_sampler():
    """So a batch of them samples in one call; a seeded row keeps its own stream."""
    from appliance.engine.sampling import SeededSampler, make_sampler

    a = SamplingParams(temperature=0.7, top_p=0.9)
    assert make_sampler(a) is make_sampler(SamplingParams(temperature=0.7, top_p=0.9))
    assert make_sampler(a) is not make_sampler(SamplingParams(temperature=0.8, top_p=0.9))
    seeded = SamplingParams(temperature=0.7, top_p=0.9, seed=3)
    assert isinstance(make_sampler(seeded), SeededSampler)
    assert make_sampler(seeded) is not make_sampler(seeded)


def test_rows_joining_and_leaving_wait_for_no_queued_pass(tiny, monkeypatch):
    """A filter evaluates the rows' left padding, never their lengths (every pass adds to
    those lazily: evaluating them waits for the pass queued last), and the re-formed pending
    tokens are queued as an evaluation of their own, not left to the next pass's (reading
    them would wait for that whole pass). Tokens stay those of a plain run."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from appliance.engine import rows as rows_mod

    model, tok = tiny
    plan = [(0, "insert", 0), (0, "insert", 1), (2, "insert", 2), (5, "insert", 3)]

    def requests():
        return {i: Collector(GenerationRequest(_prompt(tok, i), 4 + 3 * i)) for i in range(4)}

    want = requests()
    drive(_sched(tiny), plan, want)

    evaluated, queued, seen = [], [], {"filter": 0, "extend": 0}

    class Spy:
        def __getattr__(self, name):
            return getattr(mx, name)

        def eval(self, *a):
            evaluated.extend(id(x) for _, x in tree_flatten(a))
            return mx.eval(*a)

        def async_eval(self, *a):
            queued.extend(id(x) for _, x in tree_flatten(a))
            return mx.async_eval(*a)

    monkeypatch.setattr(rows_mod, "mx", Spy())
    filter_, extend = rows_mod._Decoding.filter, rows_mod._Decoding.extend

    def checked_filter(self, keep):
        lengths = [id(c.offset) for c in self.layers]
        evaluated.clear()
        filter_(self, keep)
        assert not set(lengths) & set(evaluated)
        assert not keep or id(self.next_tokens) in queued
        seen["filter"] += 1

    def checked_extend(self, other):
        had = self.next_tokens is not None
        extend(self, other)
        assert not had or id(self.next_tokens) in queued
        seen["extend"] += had

    monkeypatch.setattr(rows_mod._Decoding, "filter", checked_filter)
    monkeypatch.setattr(rows_mod._Decoding, "extend", checked_extend)
    got = requests()
    drive(_sched(tiny), plan, got)
    assert seen["filter"] and seen["extend"]
    assert {i: c.tokens for i, c in got.items()} == {i: c.tokens for i, c in want.items()}

