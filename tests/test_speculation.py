"""Speculative decoding is lossless: draft=lookup against draft=none on the same engine.

Temperature 0: token-exact at B=1 and batched (static and join/leave schedules) on the
full, sliding-window and hybrid recurrent tiny models, with the prefix cache on and with
quantized KV. Sampling: the distribution of the first tokens equals the target's own
(total-variation distance within sampling error), and a seeded row is reproducible.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from harness import Collector, cuda_shape_policy, drive
from mlx.utils import tree_map

from appliance import oracle
from appliance.engine import FinishReason, GenerationRequest, SamplingParams
from appliance.engine.budget import Budget, KVShape
from appliance.engine.continuous import ContinuousScheduler
from appliance.engine.kv import Scheme
from appliance.engine.kv.affine import AffineCodec
from appliance.engine.kv.native import FullLayout
from appliance.engine.kv.turboquant import TurboCodec
from appliance.engine.prefix_cache import PrefixCache, RamTier
from appliance.engine.speculate import Control, LookupDrafter, ModelDrafter, MTPDrafter, Tapped
from appliance.models.mtp import MTPHead

# (prompt tokens, max tokens): long enough outputs that lookups find their n-grams, and
# that the sliding model's 16-token window wraps many times
ROWS = {"a": (40, 48), "b": (90, 20), "c": (25, 40), "d": (60, 32)}
SCHEDULES = {
    "b1": {"max_rows": 1, "events": [(0, "insert", "a")]},
    "static-2": {"max_rows": 2, "events": [(0, "insert", "a"), (0, "insert", "b")]},
    "static-4": {"max_rows": 4, "events": [(0, "insert", r) for r in "abcd"]},
    # c joins mid-decode, b leaves early (length), d joins late and waits for a row
    "dynamic": {"max_rows": 3, "events": [(0, "insert", "a"), (0, "insert", "b"),
                                          (4, "insert", "c"), (9, "insert", "d")]},
}


def prompts(tok) -> dict[str, list[int]]:
    ids = list(tok.encode(oracle.BATCH_TEXT))
    return {r: ids[7 * i: 7 * i + n] for i, (r, (n, _)) in enumerate(ROWS.items())}


def scheduler(model, tok, max_rows, draft=None, **kw):
    budget = Budget(1 << 40, KVShape(1, 0, 0, 0))
    drafter, control = (None, None) if draft is None else draft
    return ContinuousScheduler(model, set(tok.eos_token_ids), max_rows,
                               oracle.BATCH_PREFILL_CHUNK, budget, drafter=drafter,
                               control=control, **kw)


def lookup(k=4, adaptive=False):
    return LookupDrafter(1, 3), Control(k, adaptive)


def run(model, tok, schedule, draft=None, sampling=None, **kw):
    sch = SCHEDULES[schedule]
    p = prompts(tok)
    rows = {r: Collector(GenerationRequest(p[r], ROWS[r][1], sampling or SamplingParams()))
            for _, _, r in sch["events"]}
    s = scheduler(model, tok, sch["max_rows"], draft, **kw)
    drive(s, sch["events"], rows)
    return rows, s


class Scripted:
    """A proposer that knows each row's plain output and proposes it with every fifth
    token wrong: acceptance and rollback both happen on every model, whatever its text."""

    method, fed = "scripted", False

    def __init__(self, prompts: dict, outputs: dict):
        self.rows = [(prompts[r], outputs[r]) for r in outputs]

    def propose(self, batch, pend, ks):
        out = []
        for toks, p, k in zip(batch.tokens, pend, ks, strict=True):
            ctx = [*toks, p]
            prompt, full = next((p, o) for p, o in self.rows if ctx[:len(p)] == p)
            at = len(ctx) - len(prompt)  # next output position to propose
            out.append([t if (at + j) % 5 != 3 else (t + 1) % 4096
                        for j, t in enumerate(full[at:at + k])])
        return out, None

    def propose_ahead(self, batch, ks):
        """The same, before the pending token is read: its guess comes first."""
        out = []
        for toks, k in zip(batch.tokens, ks, strict=True):
            prompt, full = next((p, o) for p, o in self.rows if toks[:len(p)] == p)
            at = len(toks) - len(prompt)  # the pending token's output position
            out.append([t if (at + j) % 5 != 3 else (t + 1) % 4096
                        for j, t in enumerate(full[at:at + k + 1])] if k else [])
        return out

    def make_cache(self):
        return []

    def settle(self, batch):
        pass

    def forget(self, uid):
        pass


@pytest.fixture(scope="module")
def draft_model():
    """A random-weight draft with the tiny models' vocabulary (it proposes badly, which
    is what rollback needs; the sampling test below uses a draft that agrees more)."""
    return oracle.load(oracle.model_path("tiny-llama"), "float32")[0]


@pytest.mark.parametrize("drafter", ["lookup", "scripted", "model", "mtp"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_speculation_is_token_exact_with_no_draft_at_temperature_0(loaded, schedule, drafter,
                                                                    request):
    name, model, tok = loaded
    plain, _ = run(model, tok, schedule)
    if drafter == "model":
        draft = (ModelDrafter(request.getfixturevalue("draft_model"), 16),
                 Control(3, adaptive=False))
    elif drafter == "mtp":
        if name == "tiny-gemma3":
            pytest.skip("no MTP head layout for gemma3 (appliance.models.mtp)")
        mx.random.seed(0)  # a random-weight head: its drafts are checked, rarely kept
        draft = (MTPDrafter(MTPHead.for_model(model), model, 16), Control(3, adaptive=False))
    elif drafter == "lookup":
        if name == "tiny-gemma3":
            pytest.skip("this random-weight model never repeats an n-gram: lookup proposes "
                        "only rejected drafts here (the scripted proposer covers it)")
        draft = lookup()
    else:
        draft = (Scripted(prompts(tok), {r: c.tokens for r, c in plain.items()}),
                 Control(4, adaptive=False))
    spec, s = run(model, tok, schedule, draft)
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, (name, schedule, r)
        assert spec[r].finished.reason == plain[r].finished.reason
        assert spec[r].finished.completion_tokens == len(spec[r].tokens)
    proposed = sum(c.finished.accepted_prediction_tokens + c.finished.rejected_prediction_tokens
                   for c in spec.values())
    accepted = sum(c.finished.accepted_prediction_tokens for c in spec.values())
    assert s.counters.draft_proposed == proposed and s.counters.draft_accepted == accepted
    assert s._batch.spec_ticks > 0 and proposed > accepted  # drafts were verified, some
    # rejected (rolled back); a random draft may never be right, lookup only where the
    # model's text repeats (a random model's differs between backends)
    p = prompts(tok)
    if drafter == "scripted" or drafter == "lookup" and any(
            lookup_must_accept(p[r], plain[r].tokens) for r in plain):
        assert accepted > 0


def lookup_must_accept(prompt: list[int], out: list[int]) -> bool:
    """Whether draft=lookup (k=4, never paused) must accept a draft on this row, whose plain
    output is `out`: at some pending token out[j] its proposal for out[j + 1] is right,
    asked as it is asked after the pending token is read and, where the step may ask
    before (`step.AHEAD`), then too. A row that accepts nothing is asked at every j."""
    from appliance.engine import step

    after, before = LookupDrafter(1, 3), LookupDrafter(1, 3)
    for j in range(len(out) - 1):  # (the last token has no room for drafts)
        d = after._one(0, prompt + out[:j + 1], 4)
        c = before._one(0, prompt + out[:j], 5)
        if d[:1] == [out[j + 1]] and (not step.AHEAD or c[:2] == out[j:j + 2]):
            return True
    return False


def _twice(model, tok, draft, scheme=None) -> list[dict]:
    """Rows a-d run twice through one scheduler with a RAM prefix cache (the second run
    hits it); per run, each row's tokens and cached prompt tokens."""
    s = scheduler(model, tok, 4, draft, scheme=scheme, prefix=PrefixCache(ram=RamTier(1 << 30)))
    got = []
    for _ in range(2):
        p = prompts(tok)
        rows = {r: Collector(GenerationRequest(p[r], ROWS[r][1])) for r in "abcd"}
        drive(s, [(0, "insert", r) for r in "abcd"], rows)
        got.append({r: (c.tokens, c.finished.cached_tokens) for r, c in rows.items()})
    assert all(cached > 0 for _, cached in got[1].values())  # the second run hit
    return got


def test_lookup_with_masked_rollbacks_feeds_the_prefix_cache_exact_rows(monkeypatch):
    """Native layers mask a verify's dropped slots (FullLayout holes); a finished row's KV
    goes to the prefix cache without them: every row runs twice, the second a hit, and the
    tokens equal draft=none's both times."""
    from appliance.engine.kv.native import FullLayout

    model, tok = oracle.load(oracle.model_path("tiny"), "float32")
    holes, share = [], FullLayout.holes_share
    monkeypatch.setattr(FullLayout, "holes_share",
                        lambda self: holes.append(self._holes is not None) or share(self))
    outs = []
    for draft in (None, lookup()):
        outs.append(_twice(model, tok, draft))
    assert outs[0] == outs[1]
    assert any(holes)  # verify passes left masked slots


def _plain_won_at_one_row(control: Control, spec_secs: float) -> Control:
    """`control` once it has measured plain steps faster than speculative ones at one row
    (1 ms a plain step, `spec_secs` a speculative one emitting 2 tokens)."""
    from appliance.engine.speculate.control import WARM

    for _ in range(WARM):
        control.timed(1, True, spec_secs, 2, 1)
        control.timed(1, False, 0.001, 1, 1)
    assert control.speculate(1) is False
    return control


def test_solo_steps_bring_the_next_probe_at_one_row_due():
    c = _plain_won_at_one_row(Control(4), 0.0021)  # lost by a little: probed again soon
    solo = 0
    while c.alone() and solo < 64:  # (bounded: a probe that never comes fails, not hangs)
        c.alone_step()
        solo += 1
    assert 0 < solo < 64
    assert c.speculate(1) is True  # the next lone row runs batched, and probes


@pytest.mark.parametrize("drift", [True, False], ids=["cpu-policy", "cuda-policy"])
def test_the_control_rests_where_plain_steps_won_until_its_probe_is_near(drift):
    """`resting(rows, ahead)`: plain steps won at this batch size and the next probe is more
    than `ahead` steps away; never before a decision, nor for a control that is not
    adaptive. Under both devices' policies: CUDA's (`drift=False`) puts a hopeless loss's
    next probe ~19,000 steps away, the CPU's ~1,200 (a 10,000-step bound failed on CUDA)."""
    assert not Control(3, drift=drift).resting(1, 4)  # nothing measured yet
    assert not Control(3, adaptive=False, drift=drift).resting(1, 4)
    c = _plain_won_at_one_row(Control(3, drift=drift), 0.010)
    rested = 0  # (asked after each step's decision, as the engine asks)
    while rested < 100_000:
        assert c.speculate(1) is False
        if not c.resting(1, 4):
            break
        rested += 1
    assert 0 < rested < 100_000
    # that step and the next three are plain and tapped (`ahead` in all), then the probe
    assert [c.speculate(1) for _ in range(3)] == [False] * 3
    assert c.speculate(1) is True


@pytest.mark.parametrize("drift", [True, False], ids=["cpu-policy", "cuda-policy"])
def test_a_decision_carried_from_another_batch_size_rests_as_long_as_that_ones(drift):
    """Speculation lost at one row (measured); at three rows, never measured, it loses too
    (it lost at fewer rows), and rests until a probe as far off as one row's next, not
    `explore_every` (32) steps, which is never more than `ahead` (LAG_MAX + 1) away: an
    MTP engine under a CPU agents load stayed tapped at every row count it had not
    measured itself (2-7 rows: 155 tapped plain steps, 91 of 102 prefill passes)."""
    c = _plain_won_at_one_row(Control(3, drift=drift), 0.010)
    gap = c._modes[1].gap
    assert gap > 1000  # (lost by ~5x: its next probe is far)
    rested = 0
    while rested < 2 * gap:
        assert c.speculate(3) is False
        if not c.resting(3, 32):
            break
        rested += 1
    assert gap - 64 <= rested < gap


@pytest.mark.parametrize("drafter", ["lookup", "model", "mtp"])
def test_a_lone_row_runs_solo_where_plain_steps_won_at_one_row(loaded, drafter, request):
    """With a draft, a lone row decodes unbatched once the control has measured plain steps
    faster at one row, and so does the batch's last row. A solo row's cache holds the
    model's layers only: a row joining takes it over into the batch, and prefix entries
    cross both ways (a solo row's hit by batched drafter rows, a drafter row's by a solo
    row). Every token equals draft=none's, on the full, sliding and hybrid models."""
    name, model, tok = loaded
    if drafter == "mtp" and name == "tiny-gemma3":
        pytest.skip("no MTP head layout for gemma3 (appliance.models.mtp)")
    if drafter == "model":
        draft = ModelDrafter(request.getfixturevalue("draft_model"), 16)
    elif drafter == "mtp":
        mx.random.seed(0)
        draft = MTPDrafter(MTPHead.for_model(model), model, 16)
    else:
        draft = LookupDrafter(1, 3)
    p = prompts(tok)

    def serve(s, want=None) -> tuple[dict, list]:
        """a alone; a's next turn beside b (a hit on a's entry); b's next turn alone (a hit
        on b's); c alone, then d joins it. `want`: the reference's tokens (the next turns'
        prompts extend them)."""
        got, solos, real, live, backs, back = {}, [], s._start_solo, {}, [], s._take_back
        s._start_solo = lambda: solos.append(live[id(s._waiting[0])]) or real()
        s._take_back = lambda: back() or backs.extend(
            [live[id(s._solo[0].handle)]] if s._solo else [])
        turns = [[(0, "a", p["a"])], None, None, [(0, "c", p["c"]), (3, "d", p["d"])]]
        for i, turn in enumerate(turns):
            if i == 1:
                turn = [(0, "a2", p["a"] + (want or got)["a"] + [5, 6, 7]), (0, "b", p["b"])]
            if i == 2:
                turn = [(0, "b2", p["b"] + (want or got)["b"] + [8, 9])]
            rows = {r: Collector(GenerationRequest(ids, 24)) for _, r, ids in turn}
            live.update({id(c): r for r, c in rows.items()})
            drive(s, [(t, "insert", r) for t, r, _ in turn], rows)
            for r, c in rows.items():
                assert c.finished.error is None, c.finished.error
                got[r] = c.tokens
                got[r + ".cached"] = c.finished.cached_tokens
        return got, solos, backs

    def prefix():
        return PrefixCache(ram=RamTier(1 << 30))

    want, _, _ = serve(scheduler(model, tok, 4, prefix=prefix()))
    control = _plain_won_at_one_row(Control(3), 0.010)
    got, solos, backs = serve(scheduler(model, tok, 4, (draft, control), prefix=prefix()), want)
    assert solos == ["a", "b2", "c"]
    assert "d" in backs  # c finished first: d went on solo
    # (the same tokens; a turn a row ended solo is stored one token shorter: its last
    # token is never fed, as generate_step's)
    assert {r: t for r, t in got.items() if "." not in r} == \
        {r: t for r, t in want.items() if "." not in r}
    assert got["a2.cached"] > len(p["a"]) and got["b2.cached"] > len(p["b"])  # the hits
    assert control.alone()  # (a large loss: no probe due yet)


def test_a_finished_rows_kv_is_copied_out_only_for_a_prefix_cache(monkeypatch):
    """A finished row's KV is copied for the prefix cache (a row with masked slots reads
    them on the host, which waits for the device mid-pipeline): without a prefix cache no
    row is copied, and the tokens are the same."""
    from appliance.engine.rows import _Decoding

    model, tok = oracle.load(oracle.model_path("tiny"), "float32")
    copied, real = [], _Decoding.extract
    monkeypatch.setattr(_Decoding, "extract",
                        lambda self, i, *a: copied.append(i) or real(self, i, *a))
    plain, _ = run(model, tok, "static-4", lookup())
    assert not copied
    kept, _ = run(model, tok, "static-4", lookup(), prefix=PrefixCache(ram=RamTier(1 << 30)))
    assert len(copied) == 4  # each row once, as it finished
    assert {r: c.tokens for r, c in plain.items()} == {r: c.tokens for r, c in kept.items()}


@pytest.mark.parametrize("grid", [False, True])
@pytest.mark.parametrize("kv", ["k8v4", "turboquant"])
@pytest.mark.parametrize("start", [0, 50])
def test_lookup_is_exact_with_quantized_kv_and_the_prefix_cache(kv, start, grid, monkeypatch):
    """Each row runs twice (the second a prefix-cache hit) under a quantized scheme; at
    kv.start 50 rows cross it while they verify drafts (kv/split.py), whose host-side
    bookkeeping must stay that of its parts through every rollback. `grid`: CUDA's filter
    (native.GRID_TRIM), which trimmed native layers' padding by whole steps only, so their
    key lengths differed from the encoded layers' beside them once a row left: every row
    failed on the H200 with a mask that did not broadcast (28th session)."""
    from appliance.engine.kv import native
    from appliance.engine.kv.split import SplitLayout

    drop, drops = SplitLayout.drop_tails, []

    def checked(self, counts):
        drop(self, counts)
        drops.append(counts)
        for part, book in ((self.native, self.n_rows), (self.coded, self.c_rows)):
            if part is not None:
                assert (book.idx, book.pads) == (part._idx, part.left_padding.tolist())

    monkeypatch.setattr(SplitLayout, "drop_tails", checked)
    monkeypatch.setattr(native, "GRID_TRIM", grid)
    model, tok = oracle.load(oracle.model_path("tiny"), "float32")
    codec = {"k8v4": lambda: AffineCodec(64, 8, 4), "turboquant": lambda: TurboCodec(64, 4, 4)}
    outs = []
    for draft in (None, lookup()):
        outs.append(_twice(model, tok, draft, Scheme(codec[kv](), tuple(range(6)), start)))
    assert outs[0] == outs[1]
    assert bool(drops) == bool(start)  # at kv.start 50 the verify rollbacks hit split layers


@pytest.mark.parametrize("start", [0, 40])
def test_cuda_verify_attention_beside_encoded_layers_is_token_exact(start, monkeypatch):
    """Under CUDA's shape policy with TurboQuant on layers 2-3, verify passes attend with
    plain matmuls over float KV too: the native layers beside the encoded ones (whose key
    length then changes every step, so MLX would build a cuDNN graph every step) and, at
    kv.start 40, a split layer's native rows. The same arithmetic, run here, is token-exact
    with draft=none, with CUDA's filter too (native.GRID_TRIM: once it left native layers
    longer than the encoded ones beside them, and every row failed on the H200)."""
    from appliance.engine.kv import native, quantized

    model, tok = oracle.load(oracle.model_path("tiny"), "float32")
    monkeypatch.setattr(native, "GRID_TRIM", True)
    plain, _ = run(model, tok, "dynamic", scheme=Scheme(TurboCodec(64, 4, 4), (2, 3), start))
    cuda_shape_policy(monkeypatch)
    calls, attend = [], quantized.DENSE.attend
    monkeypatch.setattr(quantized.DENSE, "attend",
                        lambda q, k, v, sc, m: calls.append(k[0].shape) or attend(q, k, v, sc, m))
    draft = (Scripted(prompts(tok), {r: c.tokens for r, c in plain.items()}), Control(4))
    spec, s = run(model, tok, "dynamic", draft,
                  scheme=Scheme(TurboCodec(64, 4, 4), (2, 3), start))
    assert s._batch.spec_ticks > 0 and calls
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, r


@pytest.mark.parametrize("drafter", ["scripted", "mtp", "model"])
def test_cuda_shape_policy_is_token_exact_too(loaded, drafter, monkeypatch, request):
    """On CUDA, verify passes attend over whole KV buffers and feed every row k + 1 tokens
    (one shape per batch size: MLX compiles per shape there), and a drafter catching up
    feeds a `pass_width` of tokens, and finished rows stay in the batch until rows join
    (step.HOLD), proposing nothing. The same arithmetic, run here on CPU, is token-exact
    with draft=none."""
    from appliance.engine import rows, step
    from appliance.engine.speculate import drafters, mtp_drafter
    from appliance.engine.speculate.shapes import pass_width

    name, model, tok = loaded
    if drafter == "mtp" and name == "tiny-gemma3":
        pytest.skip("no MTP head layout for gemma3 (appliance.models.mtp)")
    plain, _ = run(model, tok, "dynamic")
    cuda_shape_policy(monkeypatch)
    monkeypatch.setattr(step, "HOLD", True)
    held, retire = [], rows._Decoding.retire
    monkeypatch.setattr(rows._Decoding, "retire", lambda d, i: held.append(i) or retire(d, i))
    widths, whole = [], drafters.whole_buffers
    for mod in (drafters, mtp_drafter):  # a drafter's passes (each module's own name)
        monkeypatch.setattr(mod, "whole_buffers", lambda layers, n, on, **kw:
                            widths.append(n) or whole(layers, n, on, **kw))
    mx.random.seed(0)
    draft = {"scripted": lambda: (Scripted(prompts(tok), {r: c.tokens for r, c in plain.items()}),
                                  Control(4)),
             "mtp": lambda: (MTPDrafter(MTPHead.for_model(model), model, 16),
                             Control(3, adaptive=False)),
             "model": lambda: (ModelDrafter(request.getfixturevalue("draft_model"), 16),
                               Control(3, adaptive=False))}[drafter]()
    spec, s = run(model, tok, "dynamic", draft)
    assert s._batch.spec_ticks > 0
    assert held  # (b finishes first while a and c decode on)
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, (name, r)
    if drafter != "scripted":
        assert any(n > 1 for n in widths)
        assert all(n == pass_width(n) for n in widths), widths


@pytest.mark.parametrize("drafter", ["scripted", "mtp"])
def test_under_the_cuda_shape_policy_buffers_stay_whole_steps_wide(drafter, monkeypatch):
    """Every pass over whole buffers (verify, a drafter's, a plain step) sees a buffer a
    whole number of steps wide, so a batch size meets few widths. `reserve` used to grow a
    buffer by whole steps from the cursor: at a cursor of 767, to 1023 slots, then 1279,
    a new width (new CUDA graphs) at each growth (lookup at B=4 met new ones every run).
    An 8-slot step here, so the short test rows grow often."""
    from appliance.engine.kv import native
    from appliance.engine.kv.native import FullLayout

    model, tok = oracle.load(oracle.model_path("tiny"), "float32")
    plain, _ = run(model, tok, "dynamic")
    cuda_shape_policy(monkeypatch)
    monkeypatch.setattr(native, "GRID_TRIM", True)
    monkeypatch.setattr(FullLayout, "step", 8)
    widths, make_mask = [], FullLayout.make_mask
    monkeypatch.setattr(FullLayout, "make_mask", lambda self, N, **kw: widths.append(
        self.keys.shape[2] if self.whole_buffer else None) or make_mask(self, N, **kw))
    draft = (Scripted(prompts(tok), {r: c.tokens for r, c in plain.items()}), Control(4)) \
        if drafter == "scripted" else (MTPDrafter(MTPHead.for_model(model), model, 16),
                                       Control(3, adaptive=False))
    spec, s = run(model, tok, "dynamic", draft)
    assert s._batch.spec_ticks > 0
    whole = [w for w in widths if w is not None]
    assert len(set(whole)) > 2 and all(w % 8 == 0 for w in whole), sorted(set(whole))
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, r


def test_an_mtp_head_keeps_a_plain_steps_hidden_states_as_references():
    """While rows decode plainly, the MTP drafter keeps each row's last LAG_MAX pairs
    waiting. It used to slice and trim them every step (`concatenate(...)[-LAG_MAX:]`), a
    lazy op a step per row that chained: a probe's first step evaluated the whole chain
    (such steps took 0.2-0.6 s on an H200 at B=16, compiles included) and plain steps ran
    at 0.83-0.88x of draft=none's. The waiting pairs are references now, bounded, and exact
    when the head takes them (plain steps then ran at 0.95-1.0x)."""
    from appliance.engine.speculate.mtp_drafter import LAG_MAX, MTPDrafter

    d, states = MTPDrafter(None, None, chunk=512), []
    for step in range(200):
        hidden = mx.random.normal((2, 1, 8))
        states.append(hidden)
        d.observe([7, 9], [[step], [1000 + step]], hidden, decoding=True, step=True)
    for row, uid in enumerate((7, 9)):
        r = d._row(uid)
        assert all(isinstance(x, tuple) for x in r.spans) and len(r.spans) <= LAG_MAX + 1
        # pair j: the hidden at position j, the token at j + 1
        want = mx.concatenate([h[row] for h in states[-LAG_MAX - 1:-1]])
        assert r.tokens == [1000 * row + t for t in range(200 - LAG_MAX, 200)]
        assert mx.array_equal(r.hidden(), want) and r.restart
        assert mx.array_equal(r.carried(), states[-1][row, 0])


def test_an_mtp_drafters_plain_steps_are_logged_and_applied_as_each_row_is_read():
    """A plain step costs the MTP drafter one append to a log (a loop over the rows cost
    ~90 us of a 3-5 ms step at B=16 on an H200); a row's pairs take the logged steps when
    the row is read. Against pairs updated at every step (`add`, `trim`), over rows that
    join, leave, are read, add pairs of their own (as `settle` does), miss steps that
    fell off the log, or ran untapped (`skip`, `drop`): the same tokens, hidden states,
    carried state and restarts."""
    import random

    from appliance.engine.speculate.mtp_drafter import LAG_MAX, MTPDrafter, _Pairs

    rng, d, ref = random.Random(0), MTPDrafter(None, None, chunk=512), {}
    running, next_uid = [], 0
    for step in range(600):
        if rng.random() < 0.15 or not running:  # a row joins (its prompt observed first)
            uid, next_uid = next_uid, next_uid + 1
            prompt, h = [rng.randrange(100) for _ in range(3)], mx.random.normal((1, 3, 4))
            d.observe([uid], [prompt], h)
            last = mx.random.normal((1, 1, 4))  # its last prompt token, fed as it joins
            d.observe([uid], [[prompt[-1]]], last, decoding=True)
            ref[uid] = _Pairs()
            ref[uid].add(prompt, h, 0, skip_first=False)
            ref[uid].add([prompt[-1]], last, 0, skip_first=False)
            running.append(uid)
        if rng.random() < 0.1 and len(running) > 1:  # a row leaves
            uid = running.pop(rng.randrange(len(running)))
            d.forget(uid)
            del ref[uid]
        uids = rng.sample(running, len(running))  # rows change places as others leave
        hidden = mx.random.normal((len(uids), 1, 4))
        toks = [[rng.randrange(100)] for _ in uids]
        # long plain stretches (rows miss steps that fall off the log), then busy reads
        if step % 200 < 120 and rng.random() < 0.05:  # an untapped step (the control
            d.skip(uids)  # rests): the rows' pairs go, and their heads restart
            for u in uids:
                ref[u] = _Pairs(restart=True)
        elif rng.random() < 0.02:  # a row's untapped prefill pass (`drop`): the same
            u = rng.choice(uids)  # for that row alone
            d.drop([u])
            ref[u] = _Pairs(restart=True)
        elif step % 200 < 120 and rng.random() < 0.97:
            d.observe(uids, toks, hidden, decoding=True, step=True)
            for i, u in enumerate(uids):
                ref[u].add(toks[i], hidden, i, skip_first=False)
                ref[u].trim(LAG_MAX)
        else:  # a speculative step: what it keeps is added to each row read
            for i, u in enumerate(uids):
                d._row(u).add(toks[i], hidden, i, skip_first=False)
                ref[u].add(toks[i], hidden, i, skip_first=False)
        for u in rng.sample(running, rng.randrange(len(running) + 1)):
            r, want = d._row(u), ref[u]
            assert r.tokens == want.tokens and r.restart == want.restart, (step, u)
            got, exp = r.hidden(), want.hidden()
            assert (got is None) == (exp is None)
            assert exp is None or mx.array_equal(got, exp)
            assert (r.carry is None) == (want.carry is None)
            assert want.carry is None or mx.array_equal(r.carried(), want.carried())
            r.restart = want.restart = False  # (as a proposal takes it)
    assert len(d._log) <= LAG_MAX + 1 and d._lost <= set(running)


def test_a_verify_pass_after_plain_steps_keeps_a_short_rows_whole_window():
    """A verify pass after plain steps on a sliding-window layer meets a rotated ring; a row
    whose window is not yet full (a 3-token prompt beside a 30-token one) must still see its
    oldest token. mlx-lm's mask for that pass masked it (it counted the ring's trim from
    the write cursor), and the short row's tokens parted from draft=none's. Speculating
    one step in four, proposals scripted (every fifth wrong): draft=none's tokens."""
    model, tok = oracle.load(oracle.model_path("tiny-gemma3"), "float32")
    ids = list(tok.encode(oracle.BATCH_TEXT))
    p = {"short": ids[50:53], "long": ids[10:40]}

    def go(draft):
        rows = {r: Collector(GenerationRequest(p[r], 40)) for r in p}
        s = scheduler(model, tok, 2, draft)
        drive(s, [(0, "insert", "long"), (0, "insert", "short")], rows)
        return {r: c.tokens for r, c in rows.items()}, s

    class EveryFourth(Control):
        n = 0

        def speculate(self, rows, settled=True, left=None):
            self.n += 1
            return self.n % 4 == 0

    plain, _ = go(None)
    spec, s = go((Scripted(p, plain), EveryFourth(4, adaptive=False)))
    assert s._batch.spec_ticks >= 5
    assert spec == plain


def test_a_row_below_kv_start_drafts_short_of_it():
    """Past kv.start a plain step attends over the codes of the row's KV; a verify pass
    that carried a row across it attended its fresh float KV there instead, and its tokens
    parted from draft=none's (tiny-gemma3 with TurboQuant on its full-attention layers, a
    near-tied random model: within a few tokens of kv.start, for every k). A row below it
    now drafts at most up to it. The prompts are a window whose plain runs have no top-2
    gap below 0.005 (CPU and CUDA): the first 30 tokens had a 1e-4 tie at kv.start 40, where
    CUDA's kernels, not batch-invariant, parted (H100, 39th session); without the fix these
    still part, at kv.start 31 for every k."""
    from appliance.engine.kv.turboquant import TurboCodec

    model, tok = oracle.load(oracle.model_path("tiny-gemma3"), "float32")
    ids = list(tok.encode(oracle.BATCH_TEXT))
    p = {"a": ids[473:503], "b": ids[513:522]}

    def go(draft, start):
        rows = {r: Collector(GenerationRequest(p[r], 30)) for r in p}
        s = scheduler(model, tok, 2, draft, scheme=Scheme(TurboCodec(16, 4, 4), (1, 3), start))
        drive(s, [(0, "insert", "a"), (0, "insert", "b")], rows)
        return {r: c.tokens for r, c in rows.items()}, s

    for start in (31, 40, 54):
        plain, _ = go(None, start)
        for k in (1, 2, 4):
            spec, s = go((Scripted(p, plain), Control(k, adaptive=False)), start)
            assert s._batch.spec_ticks > 0
            parted = {r: next((i for i, (x, y) in enumerate(zip(spec[r], plain[r], strict=False))
                               if x != y), None) for r in p}
            assert spec == plain, (start, k, parted)  # (where each row parted, for CUDA's runs)


@pytest.mark.parametrize("drafter", ["mtp", "model"])
def test_a_drafter_that_lagged_restarts_and_stays_token_exact(loaded, drafter, monkeypatch,
                                                               request):
    """A row that decoded plainly for more than LAG_MAX tokens restarts its drafter's KV
    from its last LAG_MAX tokens instead of catching up on all of them (LAG_MAX 2 here,
    speculating one step in four): draft=none's tokens, and the restarts happened."""
    from appliance.engine.kv import native
    from appliance.engine.speculate import drafters, mtp_drafter

    name, model, tok = loaded
    if drafter == "mtp" and name == "tiny-gemma3":
        pytest.skip("no MTP head layout for gemma3 (appliance.models.mtp)")
    plain, _ = run(model, tok, "dynamic")
    mod = mtp_drafter if drafter == "mtp" else drafters  # (the names its drafter reads)
    monkeypatch.setattr(mod, "LAG_MAX", 2)
    restarts, restart = [], drafters.restart_rows
    monkeypatch.setattr(mod, "restart_rows",
                        lambda layers, rows: restarts.extend(rows) or restart(layers, rows))

    class EveryFourth(Control):
        n = 0

        def speculate(self, rows, settled=True, left=None):
            self.n += 1
            return self.n % 4 == 0

    d = (MTPDrafter(MTPHead.for_model(model), model, 16) if drafter == "mtp" else
         ModelDrafter(request.getfixturevalue("draft_model"), 16))
    rows_rolled, real = [], native.roll_row_back  # (restarts too roll once a layer)
    monkeypatch.setattr(native, "roll_row_back",
                        lambda layout, i, n: rows_rolled.append(n) or real(layout, i, n))
    emptied, empty = [], drafters.empty  # every row at once: fresh full-attention buffers
    monkeypatch.setattr(drafters, "empty", lambda c: emptied.append(e := empty(c)) or e)
    spec, s = run(model, tok, "dynamic", (d, EveryFourth(3, adaptive=False)))
    assert s._batch.spec_ticks > 0 and restarts and not rows_rolled
    assert any(emptied)
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, (name, r)


def test_an_mtp_engine_runs_its_plain_steps_untapped_while_its_control_rests(loaded,
                                                                            monkeypatch):
    """Where the control rests (`Control.resting`), an MTP engine's plain steps and prefill
    passes run the model without keeping its hidden states, and the head's rows restart
    from the tapped steps after them (an H200 read mtp's plain steps at B=16 0.94-0.97x
    draft=none's; a 2-core CPU a tapped prefill pass at 1.12-1.27x). Resting half the
    steps, speculating two in twelve: draft=none's tokens, untapped steps and prefill
    passes ran, and the head proposed after them."""
    name, model, tok = loaded
    if name == "tiny-gemma3":
        pytest.skip("no MTP head layout for gemma3 (appliance.models.mtp)")
    plain, _ = run(model, tok, "dynamic")

    class Stretches(Control):
        n = 0

        def speculate(self, rows, settled=True, left=None):
            self.n += 1
            return self.n % 12 in (10, 11)

        def resting(self, rows, ahead):
            return self.n % 12 < 6

    skipped, proposed, dropped = [], [], []
    real_skip, real_propose = MTPDrafter.skip, MTPDrafter.propose
    real_drop = MTPDrafter.drop

    def propose(self, batch, pend, ks):
        out = real_propose(self, batch, pend, ks)
        if skipped and any(out[0]):
            proposed.append(len(skipped))  # (after an untapped step)
        return out

    monkeypatch.setattr(MTPDrafter, "skip",
                        lambda self, uids: skipped.append(1) or real_skip(self, uids))
    monkeypatch.setattr(MTPDrafter, "propose", propose)
    monkeypatch.setattr(MTPDrafter, "drop",
                        lambda self, uids: dropped.append(uids) or real_drop(self, uids))
    bare, real_call = [], type(model).__call__  # (a Tapped pass calls the inner model only)
    monkeypatch.setattr(type(model), "__call__",
                        lambda self, *a, **k: bare.append(a[0].shape) or real_call(self, *a, **k))
    from appliance.engine import rows as rows_mod

    stepped, real_step = [], rows_mod._Decoding.step  # which model each decode step ran
    monkeypatch.setattr(rows_mod._Decoding, "step", lambda self, m, *a: stepped.append(
        isinstance(m, Tapped)) or real_step(self, m, *a))
    d = MTPDrafter(MTPHead.for_model(model), model, 16)
    spec, s = run(model, tok, "dynamic", (d, Stretches(3, adaptive=False)))
    step = s._batch
    assert step._bare is model and isinstance(step.model, Tapped)
    assert skipped and proposed and dropped and step.spec_ticks > 0
    # the untapped steps and prefill passes ran the model itself, the others tapped
    assert not all(stepped) and any(stepped) and any(sh[1] > 1 for sh in bare)
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, (name, r)


def test_a_draft_model_does_not_prefill_where_its_control_rests(loaded, monkeypatch, request):
    """Where the control rests at the row count rows join, a draft model does not prefill
    beside the model: its KV lags, and restarts from the row's last LAG_MAX tokens at its
    next proposal (under a CPU agents load its prefill beside the model's took prefill
    1.3x). Resting at every other pass, speculating two steps in twelve: draft=none's
    tokens, passes with and without the draft's prefill, and the draft proposed."""
    from appliance.engine.prefill import Prefill

    name, model, tok = loaded
    plain, _ = run(model, tok, "dynamic")

    class Alternate(Control):
        n = asked = 0

        def speculate(self, rows, settled=True, left=None):
            self.n += 1
            return self.n % 12 in (10, 11)

        def resting(self, rows, ahead):  # (asked by prefill passes only, without a Tapped)
            self.asked += 1
            return self.asked % 2 == 1

    passes, followed, real_run = [], [], Prefill.run
    monkeypatch.setattr(Prefill, "run", lambda self, chunks, **kw: (
        passes.append(kw.get("rest")) if any(chunks) else None, real_run(self, chunks, **kw))[1])
    real_prefill = ModelDrafter.prefill
    monkeypatch.setattr(ModelDrafter, "prefill", lambda self, batch, chunks: (
        followed.append(1), real_prefill(self, batch, chunks))[1])
    d = ModelDrafter(request.getfixturevalue("draft_model"), 16)
    spec, s = run(model, tok, "dynamic", (d, Alternate(3, adaptive=False)))
    assert any(passes) and not all(passes) and s._batch.spec_ticks > 0
    assert len(followed) == passes.count(False)  # (the passes that did not rest only)
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, (name, r)


@pytest.mark.parametrize("drafter", ["mtp", "model"])
def test_a_drafter_takes_back_its_rejected_drafts_in_one_pass_a_layer(loaded, drafter,
                                                                      monkeypatch, request):
    """After a verify, a draft model or MTP head drops what the model did not keep from
    every row at once (`drop_tails`: one roll a layer), and rows that lagged restart
    together. Row by row (`rollback`), each row read its length back from the device and
    copied its layer's whole buffers: on a 2-core CPU an MTP step at B=16 spent 75-85 ms of
    its 132-166 ms there (59-63 ms after). Speculating every step: draft=none's tokens,
    and no row-by-row rollback (nor in `test_a_drafter_that_lagged_restarts...`)."""
    from appliance.engine.kv import native

    name, model, tok = loaded
    if drafter == "mtp" and name == "tiny-gemma3":
        pytest.skip("no MTP head layout for gemma3 (appliance.models.mtp)")
    plain, _ = run(model, tok, "dynamic")
    rows_rolled, real = [], native.roll_row_back
    monkeypatch.setattr(native, "roll_row_back",
                        lambda layout, i, n: rows_rolled.append(n) or real(layout, i, n))
    d = (MTPDrafter(MTPHead.for_model(model), model, 16) if drafter == "mtp" else
         ModelDrafter(request.getfixturevalue("draft_model"), 16))
    spec, s = run(model, tok, "dynamic", (d, Control(3, adaptive=False)))
    assert s._batch.spec_ticks > 0 and not rows_rolled
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, (name, r)


@pytest.mark.parametrize("shape_policy", [False, True])
@pytest.mark.parametrize("drafter", ["scripted", "mtp"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_compiled_verify_passes_are_token_exact(loaded, schedule, drafter, shape_policy,
                                                monkeypatch):
    """Verify passes as one compiled graph (fixed shapes over whole buffers: models whose
    layers are all full attention; the others, and batches with masked slots, run
    uncompiled) give draft=none's tokens, alone and with CUDA's shape policy."""
    from appliance.engine.compiled import CompiledDecode

    name, model, tok = loaded
    if drafter == "mtp" and name == "tiny-gemma3":
        pytest.skip("no MTP head layout for gemma3 (appliance.models.mtp)")
    plain, _ = run(model, tok, schedule)
    if shape_policy:
        cuda_shape_policy(monkeypatch)
    passes = []
    forward = CompiledDecode.forward
    monkeypatch.setattr(CompiledDecode, "forward",
                        lambda self, *a: passes.append(a[0].shape) or forward(self, *a))
    mx.random.seed(0)
    draft = ((Scripted(prompts(tok), {r: c.tokens for r, c in plain.items()}), Control(4))
             if drafter == "scripted" else
             (MTPDrafter(MTPHead.for_model(model), model, 16), Control(3, adaptive=False)))
    spec, s = run(model, tok, schedule, draft, compile_verify=True)
    assert s._batch.spec_ticks > 0
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, (name, schedule, r)
    all_full = all(type(c).__name__ == "KVCache" for c in Scheme().make_cache(model))
    assert bool(passes) == all_full  # compiled where the layers allow it, and only there
    assert all(len(shape) == 2 and shape[1] > 1 for shape in passes)


@pytest.mark.parametrize("cuda", [False, True])
@pytest.mark.parametrize("drafter", ["lookup", "scripted"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_proposing_before_the_pending_token_is_read_is_token_exact(loaded, schedule, drafter,
                                                                   cuda, monkeypatch):
    """Right after a plain step (on CUDA: `step.AHEAD`) a drafter that can proposes from
    the tokens before the pending one, whose value the verify pass takes from the device;
    a row whose pending token differs from the proposal's guess keeps no drafts (the
    scripted proposer guesses wrong one time in five). draft=none's tokens, also with
    CUDA's shape policy and compiled verify passes (`cuda`)."""
    from appliance.engine import step

    name, model, tok = loaded
    if drafter == "lookup" and name == "tiny-gemma3":
        pytest.skip("this random-weight model never repeats an n-gram (see above)")
    plain, _ = run(model, tok, schedule)
    monkeypatch.setattr(step, "AHEAD", True)
    if cuda:
        cuda_shape_policy(monkeypatch)
    cls = LookupDrafter if drafter == "lookup" else Scripted
    calls = []
    ahead = cls.propose_ahead
    monkeypatch.setattr(cls, "propose_ahead",
                        lambda self, *a: calls.append(r := ahead(self, *a)) or r)
    draft = lookup() if drafter == "lookup" else (
        Scripted(prompts(tok), {r: c.tokens for r, c in plain.items()}), Control(4, False))
    spec, s = run(model, tok, schedule, draft, compile_verify=cuda)
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, (name, schedule, r)
        assert spec[r].finished.reason == plain[r].finished.reason
    assert any(len(c) > 1 for cs in calls for c in cs)  # it proposed ahead
    if drafter == "scripted":  # right four times in five: kept and rejected drafts both
        done = spec.values()
        assert sum(c.finished.accepted_prediction_tokens for c in done) > 0
        assert sum(c.finished.rejected_prediction_tokens for c in done) > 0


def test_cancelled_and_stopped_rows_emit_nothing_past_their_end(loaded):
    """A row cancelled mid-way got a prefix of its full output; max_tokens holds exactly."""
    name, model, tok = loaded
    full, _ = run(model, tok, "static-2")
    p = prompts(tok)
    rows = {r: Collector(GenerationRequest(p[r], ROWS[r][1])) for r in "ab"}
    drive(scheduler(model, tok, 2, lookup()), [(0, "insert", "a"), (0, "insert", "b"),
                                               (6, "remove", "a")], rows)
    assert rows["a"].finished.reason is FinishReason.CANCELLED
    assert rows["a"].tokens == full["a"].tokens[:len(rows["a"].tokens)]
    assert rows["b"].tokens == full["b"].tokens
    assert len(rows["b"].tokens) <= ROWS["b"][1]


@pytest.mark.parametrize("kind", ["lookup", "mtp"])
def test_a_seeded_sampled_row_is_reproducible_with_the_same_draft_settings(kind):
    """A seeded sampled row proposes nothing, so its tokens do not depend on which steps
    the (timed) control let speculate, nor on the rows beside it: the same as with no
    draft, alone or batched. Alone it runs solo, as with no draft, whatever the control
    (on a backend whose kernels are not batch-invariant, CUDA, only that path gives the
    same bits). Unseeded and greedy rows beside it still speculate."""
    model, tok = oracle.load(oracle.model_path("tiny"), "float32")
    seeded = SamplingParams(temperature=0.8, top_p=0.95, seed=7, repetition_penalty=1.1)

    def draft(adaptive: bool):
        if kind == "lookup":
            return lookup(adaptive=adaptive)
        mx.random.seed(0)
        return MTPDrafter(MTPHead.for_model(model), model, 16), Control(3, adaptive)

    p = prompts(tok)
    outs = []
    for d, beside in ((None, ""), (draft(False), ""), (draft(True), ""), (draft(False), "bcd"),
                      (draft(True), "bcd")):
        rows = {"a": Collector(GenerationRequest(p["a"], ROWS["a"][1], seeded))}
        rows |= {r: Collector(GenerationRequest(p[r], ROWS[r][1], SamplingParams()))
                 for r in beside}  # greedy rows, which speculate
        s = scheduler(model, tok, 4, d)
        solo, real = [], s._start_solo
        s._start_solo = lambda solo=solo, real=real: solo.append(1) or real()
        drive(s, [(0, "insert", r) for r in rows], rows)
        assert bool(solo) == (not beside)  # alone, it runs solo, as with no draft
        outs.append(rows["a"].tokens)
        assert rows["a"].finished.accepted_prediction_tokens == 0
        assert rows["a"].finished.rejected_prediction_tokens == 0
        if beside and kind == "lookup":
            assert s.counters.draft_proposed > 0  # the greedy rows did speculate
    assert len(outs[0]) == ROWS["a"][1] and all(o == outs[0] for o in outs), outs


# -- sampling is exact: the first tokens' distribution -------------------------------------

VOCAB = 8
PROMPT = [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]  # every token occurs: lookup always proposes


def _small_model(seed: int = 3):
    from mlx_lm.models import llama

    mx.random.seed(seed)
    args = llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=1,
                           intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                           rms_norm_eps=1e-5, vocab_size=VOCAB, tie_word_embeddings=True)
    model = llama.Model(args)
    model.update(tree_map(lambda w: w * 2, model.parameters()))  # some peaks, not flat
    mx.eval(model.parameters())
    return model


def _processed(logits, s: SamplingParams, history):
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    from appliance.engine.sampling import make_processors

    for p in make_processors(s):
        logits = p(mx.array(history), logits)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if 0 < s.top_p < 1:
        lp = apply_top_p(lp, s.top_p)
    if s.min_p:
        lp = apply_min_p(lp, s.min_p, 1)
    if s.top_k:
        lp = apply_top_k(lp, s.top_k)
    return np.array(mx.softmax(lp / s.temperature, axis=-1)[0].astype(mx.float32))


def _exact_pairs(model, s) -> np.ndarray:
    """P(t1, t2) of the target with its processors and sampler filters applied."""
    out = np.zeros((VOCAB, VOCAB))
    p1 = _processed(model(mx.array([PROMPT]))[:, -1, :], s, PROMPT)
    for t1 in range(VOCAB):
        seq = [*PROMPT, t1]
        out[t1] = p1[t1] * _processed(model(mx.array([seq]))[:, -1, :], s, seq)
    return out / out.sum()  # float32 rounding


def _sample_pairs(model, s, draft, n) -> np.ndarray:
    class Tok:
        eos_token_ids = {99}

    counts = np.zeros((VOCAB, VOCAB))
    sch = scheduler(model, Tok, 64, draft, prefill_rows=64)  # (prompts 64 at a time: fast)
    rows = [Collector(GenerationRequest(PROMPT, 2, s)) for _ in range(n)]
    drive(sch, [(0, "insert", i) for i in range(n)], dict(enumerate(rows)))
    for c in rows:
        counts[c.tokens[0], c.tokens[1]] += 1
    return counts / n


PROCESSED = SamplingParams(temperature=0.7, top_k=5, repetition_penalty=1.3, logit_bias={3: 1.5})


@pytest.mark.parametrize("kind,s", [("lookup", PROCESSED), ("model", SamplingParams(1.0)),
                                    ("model", PROCESSED), ("mtp", PROCESSED)],
                         ids=["lookup", "model-plain", "model-processed", "mtp-processed"])
def test_speculative_sampling_matches_the_target_distribution(s, kind):
    """Lookup: a draft is kept when the target's own sample equals it. Model and MTP: a
    sampled draft is kept with probability min(1, p/q), else the next token comes from
    max(0, p - q); the drafts here come from another random model / a random head, so q
    differs from p."""
    model = _small_model()
    exact = _exact_pairs(model, s)
    n = 3000
    mx.random.seed(11)
    if kind == "lookup":
        drafter = LookupDrafter(1, 2)
    elif kind == "model":
        drafter = ModelDrafter(_small_model(5), 16)
    else:
        drafter = MTPDrafter(MTPHead.for_model(model), model, 16)
    spec = _sample_pairs(model, s, (drafter, Control(3, adaptive=False)), n)
    rng = np.random.default_rng(0)  # TV of n exact samples, 200 times: the sampling error
    noise = [0.5 * np.abs(rng.multinomial(n, exact.ravel()) / n - exact.ravel()).sum()
             for _ in range(200)]
    tv = 0.5 * np.abs(spec - exact).sum()
    assert tv <= np.quantile(noise, 0.995), (tv, np.quantile(noise, [0.5, 0.995]))
    assert exact.max() < 0.6 and (exact > 0.01).sum() >= 8  # room to be wrong in


# -- through the server ----------------------------------------------------------------------

EDIT_PROMPT = ("def parse(text):\n    items = []\n    for line in text.splitlines():\n"
               "        items.append(line.strip())\n    return items\n\n"
               "# the same function, renamed\ndef parse_lines(text):\n")


def test_a_speculating_server_is_exact_and_reports_its_drafts(client):
    """Over HTTP with the official client: the same text as draft=none, usage carries
    accepted/rejected prediction tokens, /stats the method's counts."""
    import httpx
    from conftest import app_for
    from openai import OpenAI

    want = client.completions.create(model="appliance-tiny", prompt=EDIT_PROMPT, max_tokens=40,
                                     temperature=0)
    with app_for(["draft=lookup"]) as (plan, engine, url):
        c = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        got = c.completions.create(model="appliance-tiny", prompt=EDIT_PROMPT, max_tokens=40,
                                   temperature=0)
        stats = httpx.get(f"{url}/stats").json()
    assert got.choices[0].text == want.choices[0].text
    details = got.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert want.usage.completion_tokens_details.accepted_prediction_tokens == 0
    lookup = stats["speculation"]["lookup"]
    assert lookup["accepted"] == details.accepted_prediction_tokens
    assert lookup["proposed"] == lookup["accepted"] + details.rejected_prediction_tokens


# -- the plan ---------------------------------------------------------------------------

def _problems(overrides: list[str]) -> list[str]:
    from conftest import resolve_overrides

    from appliance.plan import PlanError

    with pytest.raises(PlanError) as e:
        resolve_overrides(overrides)
    return e.value.problems


def test_the_plan_refuses_what_it_cannot_serve_naming_the_choices(tmp_path):
    # an MTP head where the checkpoint has none
    (p,) = _problems(["model=synthetic", "model.shape=tiny-llama", "draft=mtp"])
    assert "no MTP head" in p and "draft=lookup" in p and "draft.head=" in p
    # a draft model with another tokenizer
    import shutil

    other = tmp_path / "draft"
    shutil.copytree(oracle.model_path("tiny-llama"), other)
    problems = _problems(["draft=model", "draft.source=local", f"draft.path={other}"])
    assert any("does not have the target's tokenizer" in q for q in problems)
    # speculation outside the continuous batch; k out of range; a field lookup does not read
    problems = _problems(["draft=lookup", "batch=serial", "batch.max_rows=1", "draft.k=0",
                          "draft.head=checkpoint"])
    assert any("valid choices: batch=continuous" in q for q in problems)
    assert any("draft.k=0 must be in 1..16" in q for q in problems)
    assert ("draft.head='checkpoint' is not read by draft=lookup; it applies to draft=mtp"
            in problems)
    # draft=model's source fields: a path without draft.source=local served the embedded draft
    problems = _problems(["draft=model", "draft.path=/no/such/draft"])
    assert problems == ["draft.path='/no/such/draft' is not read by draft.source=embedded; it "
                        "applies to draft.source=local"]
    problems = _problems(["draft=model", "draft.source=local", f"draft.path={other}",
                          "draft.revision=v1"])
    assert any("draft.revision='v1' is not read by draft.source=local" in q for q in problems)


def test_the_plan_counts_the_draft_in_memory_and_fingerprints_its_content():
    from conftest import resolve_overrides

    none = resolve_overrides([])
    for kind in ("model", "mtp"):
        plan = resolve_overrides([f"draft={kind}"])
        assert plan.draft.weight_bytes > 0 and plan.draft.kv_bytes_per_token > 0
        assert plan.memory.weights_bytes == none.memory.weights_bytes + plan.draft.weight_bytes
        assert plan.memory.kv_bytes_at_max_context == (
            none.memory.kv_bytes_at_max_context
            + plan.draft.kv_bytes_per_token * plan.server.max_context)
        assert plan.fingerprint != none.fingerprint and plan.draft.path not in str(
            plan.draft.content)


def test_two_mtp_heads_of_one_shape_have_two_fingerprints(tmp_path, monkeypatch):
    """The head's part of the fingerprint hashed its tensors' names, dtypes and shapes, so
    another head of the same shape (retrained) shared the plan's SSD entries (a probe)."""
    import shutil
    from pathlib import Path

    from conftest import resolve_overrides

    from appliance.plan import model_info

    monkeypatch.setattr(model_info, "DIGESTS", tmp_path / "digests.json")
    src = Path(model_info.__file__).parents[1] / "embedded" / "tiny" / "mtp.safetensors"
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    shutil.copy(src, a)
    data = bytearray(src.read_bytes())
    data[-100] ^= 0x80  # one sign bit of the last tensor
    b.write_bytes(bytes(data))
    pa, pb = (resolve_overrides(["draft=mtp", f"draft.head={h}"]) for h in (a, b))
    assert pa.draft.weight_bytes == pb.draft.weight_bytes
    assert pa.fingerprint != pb.fingerprint
    c = shutil.copy(a, tmp_path / "c.safetensors")  # the same bytes elsewhere: the same plan
    assert resolve_overrides(["draft=mtp", f"draft.head={c}"]).fingerprint == pa.fingerprint


def test_the_headline_serves_through_the_openai_api(tmp_path):
    """`appliance +profile=agent-fleet kv=turboquant draft=mtp`: the plan resolves, a real
    server speculates with the embedded MTP head over TurboQuant KV, batched, and its text
    equals draft=none's under the same profile and scheme."""
    import concurrent.futures as cf

    import httpx
    from conftest import app_for
    from openai import OpenAI

    prompts = [EDIT_PROMPT, "import os\nimport sys\n\n\ndef main(", "class Stack:\n    def "]

    def texts(overrides):
        with app_for(["+profile=agent-fleet", "kv=turboquant", f"cache.ssd.path={tmp_path}",
                      *overrides]) as (plan, _, url):
            c = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

            def one(p):
                return c.completions.create(model=plan.model.id, prompt=p, max_tokens=24,
                                            temperature=0)

            with cf.ThreadPoolExecutor(3) as pool:
                out = list(pool.map(one, prompts))
            return plan, out, httpx.get(f"{url}/stats").json()

    plan, spec, stats = texts(["draft=mtp", "draft.adaptive=false"])
    _, plain, _ = texts([])
    assert plan.draft.kind == "mtp" and plan.kv.scheme == "turboquant"
    assert [r.choices[0].text for r in spec] == [r.choices[0].text for r in plain]
    assert stats["speculation"]["mtp"]["proposed"] > 0
    assert sum(r.usage.completion_tokens_details.accepted_prediction_tokens for r in spec) > 0


def test_stops_and_logprobs_through_the_server_match_no_draft(client):
    """A stop string ends the text at the same place (nothing past it is streamed), and the
    chosen tokens' log-probabilities agree with draft=none's (a verify pass computes them
    over several positions at once: equal up to float rounding)."""
    from conftest import ORACLE_PIN, app_for
    from openai import OpenAI

    kw = dict(model="appliance-tiny", prompt=EDIT_PROMPT, max_tokens=40, temperature=0)
    want = client.completions.create(**kw, stop=[" list"], logprobs=2)
    want_stream = "".join(c.choices[0].text for c in client.completions.create(
        **kw, stop=[" list"], stream=True))
    # the session `client`'s settings (ORACLE_PIN), with the draft the only difference
    with app_for(["draft=lookup", "draft.adaptive=false", *ORACLE_PIN]) as (plan, engine, url):
        c = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        got = c.completions.create(**kw, stop=[" list"], logprobs=2)
        got_stream = "".join(ch.choices[0].text for ch in c.completions.create(
            **kw, stop=[" list"], stream=True))
    assert got.choices[0].text == want.choices[0].text == want_stream == got_stream
    assert got.choices[0].finish_reason == want.choices[0].finish_reason == "stop"
    a, b = got.choices[0].logprobs, want.choices[0].logprobs
    assert a.tokens == b.tokens
    assert np.allclose(a.token_logprobs, b.token_logprobs, atol=2e-2)


def _drive(control: Control, rows: int, steps: int, spec_rate, plain_rate) -> tuple[int, float]:
    """Run the control's decisions against a simulated batch: `*_rate(step)` is tokens per
    second of each mode. Returns (speculative steps, throughput over the plain-only one)."""
    spec_steps, tokens, seconds, plain_only = 0, 0.0, 0.0, 0.0
    for n in range(steps):
        spec = control.speculate(rows)
        rate = spec_rate(n) if spec else plain_rate(n)
        per_step = rows * (1.6 if spec else 1.0)  # tokens a step emits
        control.timed(rows, spec, per_step / rate, int(per_step))
        spec_steps += spec
        tokens, seconds = tokens + per_step, seconds + per_step / rate
        plain_only += rows / plain_rate(n)
    return spec_steps, (tokens / seconds) / (rows * steps / plain_only)


def test_the_control_keeps_a_losing_speculation_under_five_percent_of_the_cost():
    """Issue 12 item 9: at B=16 speculation must never be the slower choice; what the control
    spends probing the slower mode is bounded, and a winner is found and kept."""
    c = Control(4)
    spec_steps, ratio = _drive(c, 16, 1024, lambda n: 500.0, lambda n: 1000.0)
    assert spec_steps < 0.03 * 1024 and ratio >= 0.97
    spec_steps, ratio = _drive(Control(4), 4, 1024, lambda n: 1500.0, lambda n: 1000.0)
    assert spec_steps > 0.95 * 1024 and ratio > 1.4
    # a smaller batch where speculation won, a larger one starts from that decision...
    c = Control(4)
    _drive(c, 2, 64, lambda n: 1500.0, lambda n: 1000.0)
    assert c.speculate(3)  # 3 rows: bucket 4, not measured yet, speculates at once
    # ...and when the rates turn, the control follows within a few probes
    spec_steps, ratio = _drive(c, 16, 600, lambda n: 1500.0 if n < 300 else 400.0,
                               lambda n: 1000.0)
    late, _ = _drive(c, 16, 300, lambda n: 400.0, lambda n: 1000.0)
    assert late < 0.05 * 300


@pytest.mark.parametrize("cuda", [False, True])
def test_a_hopeless_speculation_is_not_explored_again_as_rows_leave(cuda):
    """The CPU trace of 2026-12-02 (mtp, edit, B=16): speculation lost at 16 rows at 7x a
    plain step's cost, more than its k + 1 = 3 tokens a row could repay, then as rows left
    one by one every new row count explored it once more, each time feeding the MTP head
    every token since its last step (150-440 ms against 15 ms plain), and never measured
    anything. Such a loss now stands for down to half the rows. A loss that acceptance
    could have turned leaves smaller batches to measure their own, but only those that last
    (`control.EXPLORE_AFTER` steps: on an H200, mtp, an exploration at 4 rows as rows left
    cost 59-234 ms against a 3-8 ms plain step, and the batch size was gone soon after)."""
    kw = dict(drift=False, full_width=True, idle_max=0) if cuda else {}

    def tail(ratio: float, lasting: int) -> int:
        c = Control(2, **kw)
        for _ in range(64):  # 16 rows: speculation costs `ratio` plain steps, yields 1.5x
            spec = c.speculate(16)
            c.timed(16, spec, 0.015 * (ratio if spec else 1), 24 if spec else 16)
        assert c._winner(16) is False  # it lost at 16 rows
        return sum(c.speculate(rows) for rows in range(15, 7, -1) for _ in range(lasting))

    assert tail(7.0, 3) == 0 and tail(7.0, 16) == 0
    assert tail(2.0, 3) == 0  # row counts that last 3 steps each are not explored
    assert tail(2.0, 16) > 0


def test_a_probe_is_charged_its_drafters_catch_up():
    """A draft model lags while its rows decode plainly and catches up at the next probe's
    first step, on every token since (at most `drafters.LAG_MAX`). That step is no
    measurement of the mode (`BatchStep` times only a step after one of its own kind);
    charged to the probe through `spent`, it stretches the gap to the next. Simulated at
    B=16 over bench=spec's 3 x 512 steps, with a catch-up of 0.4 plain steps a lagged token,
    where speculation's measured steps break even: ~0.8% lost, against ~2.5% uncharged."""
    from appliance.engine.speculate.drafters import LAG_MAX

    def cost(charge: bool) -> float:
        c, seconds, before, lag = Control(3), 0.0, None, 0
        for _ in range(1536):
            spec = c.speculate(16)
            secs = 0.030 + 0.006 * min(lag, LAG_MAX) if spec and before is False else \
                (0.030 if spec else 0.015)  # (the catch-up: 16 rows x lag tokens)
            lag = 0 if spec else lag + 1
            if spec == before:
                c.timed(16, spec, secs, 16 * (2 if spec else 1))
            if charge:
                c.spent(16, spec, secs)
            seconds += secs / (2 if spec else 1)  # per token a row, as a plain step's
            before = spec
        return seconds / (1536 * 0.015) - 1

    assert cost(True) < 0.02 and cost(True) < 0.5 * cost(False)


def test_a_costly_probe_is_repaid_before_the_next():
    """The H200 trace of the 16th session (mtp, free code, B=16, 512 tokens a row): a plain
    step ~7.5 ms; a speculative one ~28 ms for 2.7 tokens a row; a probe's first step
    0.2-0.6 s more (the MTP head's catch-up). The probe gap was 32 steps stretched by the
    probe's cost, set at the first decision and then only doubled from the last gap: so
    simulated, runs after the first lost up to 10%. Now a probe's loss is repaid by a gap
    of that loss over `control.SHARE`, and the first exploration pays one first step, not
    two: one control over 5 runs of 512 steps, as the bench reuses it."""
    c, before, ratios = Control(2, drift=False, full_width=True, idle_max=0), None, []
    for _ in range(5):
        seconds = tokens = 0.0
        for _ in range(512):
            spec = c.speculate(16)
            secs = (0.028 + (0.4 if before is False else 0)) if spec else 0.0075
            if spec == before:
                c.timed(16, spec, secs, int(16 * (2.7 if spec else 1)))
            c.spent(16, spec, secs)
            seconds, tokens = seconds + secs, tokens + (2.7 if spec else 1)
            before = spec
        ratios.append(tokens / seconds * 0.0075)
    assert ratios[0] > 0.88 and min(ratios[1:]) > 0.97, ratios


def test_a_hopeless_speculation_on_cuda_is_probed_at_the_longest_gap():
    """The H200 at B=16 (26th session; mtp and model, free code): a speculative step took
    10-15 ms for ~2.5 tokens a row, a plain one 2.2-3.5 ms, and a probe's first step 35-115
    ms (a drafter's catch-up): more than any acceptance of k = 3 could repay. Doubling from
    its first gap, probes came every 1000-2000 steps, each costing a 256-token run 15-30%.
    On CUDA, where a step's cost is flat in the rows' contexts, such a loss starts at the
    back-off's end: simulated over bench=spec's 15 x 285 steps, one exploration and no
    further probe. A loss that acceptance could turn still backs off from its first gap."""

    def probes(spec_secs: float) -> int:
        c = Control(3, drift=False, full_width=True, idle_max=0)
        runs, before = 0, None
        for _ in range(15 * 285):
            spec = c.speculate(16)
            secs = (spec_secs + (0.06 if before is False else 0)) if spec else 0.0025
            if spec == before:
                c.timed(16, spec, secs, 40 if spec else 16)
            c.spent(16, spec, secs)
            runs += spec and before is False
            before = spec
        return runs

    assert probes(0.012) == 1  # the exploration's run of speculative steps, no probe
    assert probes(0.008) >= 3  # (not hopeless: 0.008 < 4 x 0.0025) probed as before


def test_on_cuda_a_slow_spell_of_the_host_does_not_switch_to_a_losing_speculation():
    """The H100 trace of the 41st session (model, free code, B=16, k=3): a plain step 2.3 ms,
    a speculative one 10.4 ms for ~2.4 tokens a row, a probe's first step more (the draft's
    catch-up). The host's speed moved in spells (plain steps 2.1-2.3 ms, then 3.8-4.8), and
    a slow spell's plain steps, against speculation's older time, made speculation look the
    faster: it switched, lost, and probed again (15 of 31 runs of bench=spec speculated;
    0.93x paired). Simulated over 31 x 285 steps, the host at half speed every other 150 steps:
    one exploration, as with a steady host, and no cost beyond it."""

    def run(spells: bool) -> tuple[int, float]:
        c = Control(3, drift=False, full_width=True, idle_max=0)
        switches, before, seconds, plain_only = 0, None, 0.0, 0.0
        for n in range(31 * 285):
            host = 2.0 if spells and (n // 150) % 2 else 1.0
            spec = c.speculate(16)
            secs = host * ((0.0104 + (0.06 if before is False else 0)) if spec else 0.0023)
            if spec == before:
                c.timed(16, spec, secs, int(16 * 2.4) if spec else 16)
            c.spent(16, spec, secs)
            switches += spec and before is False
            seconds += secs / (2.4 if spec else 1)  # per token a row, as a plain step's
            plain_only += host * 0.0023
            before = spec
        return switches, plain_only / seconds

    assert run(False)[0] == 1  # the exploration
    switches, ratio = run(True)
    assert switches == 1 and ratio > 0.99, (switches, ratio)


@pytest.mark.parametrize("cuda", [False, True])
def test_a_probe_waits_for_a_step_that_can_be_timed(cuda):
    """A probe of steps that cannot be timed (rows still joining, a prefill beside them)
    measures nothing and costs its speculative steps: it starts on the first settled step."""
    kw = dict(drift=False, full_width=True, idle_max=0) if cuda else {}
    c = Control(2, **kw)
    for _ in range(64):  # speculation loses at 16 rows (not hopelessly)
        spec = c.speculate(16)
        c.timed(16, spec, 0.015 * (2.0 if spec else 1), 24 if spec else 16)
    assert c._winner(16) is False
    unsettled = [c.speculate(16, settled=False) for _ in range(2000)]
    assert not any(unsettled)  # far past any probe's due step: none ran unsettled
    assert any(c.speculate(16) for _ in range(3))  # the due probe (3 steps) runs once settled


def test_a_losing_speculation_is_not_chosen_on_its_stale_measurements():
    """The CPU trace of 2026-12-01 (edit, B=16): steps slow down as the rows' contexts grow
    (attention), and the mode that is not running is measured only when probed. Against
    its older, cheaper times the running plain steps looked the slower, and speculation ran
    though it lost by 12-23% a row-token. A switch now waits for a fresh probe."""
    c, late = Control(6), 0
    for n in range(600):
        spec = c.speculate(16)
        grown = 1 + n / 300  # both modes slow down alike; speculation loses by 13%
        c.timed(16, spec, grown * (0.100 if spec else 0.0233), 16 * (38 if spec else 10) // 10)
        late += spec and n >= 100
    assert late < 0.05 * 500


def test_batch_sizes_are_measured_each_on_their_own():
    """Speculation that wins at 10 rows and loses at 16 (a fixed cost per pass plus one per
    row, as on an H200): pooled by power of two, 10 rows' steps took 16 rows' verdict."""
    c, spec16, spec10 = Control(4), 0, 0
    for _ in range(8):
        for rows in [10] * 20 + [16] * 60:
            spec = c.speculate(rows)
            c.timed(rows, spec, (8 + 1.2 * rows if spec else 5 + 0.2 * rows) / 1e3,
                    rows * (3 if spec else 1))
            spec16 += spec and rows == 16
            spec10 += spec and rows == 10
    assert spec16 < 0.05 * 480 and spec10 > 0.9 * 160


def test_the_control_is_not_thrown_off_by_a_few_bad_steps():
    """Acceptance varies from step to step (a lookup draft that misses, then a long run): a
    speculation that wins on average keeps running through its bad steps."""
    import random

    rng, c, spec_steps = random.Random(0), Control(4), 0
    for _ in range(512):
        spec = c.speculate(1)
        tokens, secs = (rng.choice([1, 1, 2, 3, 3]), 1.3) if spec else (1, 1.0)
        c.timed(1, spec, secs, tokens)
        spec_steps += spec
    assert spec_steps > 0.85 * 512


def test_a_step_that_compiles_a_new_shape_does_not_stop_a_winning_speculation():
    """On CUDA a verify pass over a grown KV buffer compiles once (tens of ms): such a
    one-off is not a measurement, while a lasting slowdown still is."""
    c, spec_steps = Control(4), 0
    for n in range(256):
        spec = c.speculate(1)
        secs = (1.3 if spec else 1.0) * (40 if n in (20, 21, 90, 150) else 1)
        c.timed(1, spec, secs, 3 if spec else 1)
        spec_steps += spec
    assert spec_steps > 0.9 * 256
    for _ in range(128):  # speculation's steps now really take 5x: it stops
        spec = c.speculate(1)
        c.timed(1, spec, 6.5 if spec else 1.0, 3 if spec else 1)
    assert sum(c.speculate(1) for _ in range(64)) < 8


def test_compiles_in_a_row_do_not_stop_a_winning_speculation():
    """The H200 trace of 2026-12-01: speculative steps at a new batch size or key length
    compile (50-90 ms against 5-8), several in a row as rows leave. A running average took
    three in a row as the speculative step's cost, ran plain steps and probed again only
    after 32 x their ratio steps. The median of the recent steps does not move for a
    minority of spikes."""
    c, spec_steps, measured = Control(4), 0, 0
    for _ in range(256):
        spec = c.speculate(16)
        measured += spec
        spike = spec and measured in (1, 12, 13, 14, 40, 41, 42)
        c.timed(16, spec, (1.3 if spec else 1.0) * (40 if spike else 1), 48 if spec else 16)
        spec_steps += spec
    assert spec_steps > 0.85 * 256


def test_a_step_is_timed_only_after_a_step_of_its_own_kind(loaded):
    """What the control compares: a plain step right after a speculative one restarts the
    pipeline, and a speculative one right after a plain one first waits for that one's
    queued pass; neither is a measurement of its mode (BatchStep, scripted decisions)."""
    name, model, tok = loaded
    if name != oracle.BATCH_MODELS[0]:
        pytest.skip("the step's bookkeeping, not the model, is under test")
    plan = [True, True, False, False, True, False, True, True, True, False, False, False] * 9

    class Scripted_(Control):
        def speculate(self, rows, settled=True, left=None):
            return plan.pop(0) if plan else False

    plain, _ = run(model, tok, "static-2")
    decided, timed = [], []
    ctl = Scripted_(4, adaptive=False)
    orig = ctl.speculate
    ctl.speculate = lambda rows, settled=True, left=None: decided.append(orig(rows)) or decided[-1]
    ctl.timed = lambda rows, spec, secs, tokens, live: timed.append((decided[-2:], spec))
    run(model, tok, "static-2",
        draft=(Scripted(prompts(tok), {r: c.tokens for r, c in plain.items()}), ctl))
    assert {spec for _, spec in timed} == {True, False}  # both kinds were measured
    assert all(last == [spec, spec] for last, spec in timed)
    switches = sum(a != b for a, b in zip(decided, decided[1:], strict=False))
    assert switches > 5  # ...and none of the steps after a switch


def test_a_step_is_timed_only_once_the_batch_size_has_settled(loaded):
    """A batch size new within SETTLE steps pays one-off costs (CUDA graphs built anew: on
    an H200 the two steps after a row left took 18-30 ms against 3-5): such steps are no
    measurement, and a batch size with no decision yet explores speculation only on steps
    that can be timed (join/leave schedule, every step's rows recorded)."""
    from appliance.engine.step import SETTLE

    name, model, tok = loaded
    if name != oracle.BATCH_MODELS[0]:
        pytest.skip("the step's bookkeeping, not the model, is under test")
    plain, _ = run(model, tok, "dynamic")
    seen, timed = [], []  # (rows, settled, speculated) per step; rows of each timed step
    ctl = Control(4)
    orig = ctl.speculate
    ctl.speculate = lambda rows, settled=True, left=None: seen.append(
        (rows, settled, orig(rows, settled))) or seen[-1][2]
    ctl.timed = lambda rows, spec, secs, tokens, live: timed.append(len(seen))
    charged = []  # every step after a quiet interval is charged (`Control.spent`), timed or not
    spent = ctl.spent
    ctl.spent = lambda rows, spec, secs: charged.append((len(seen), spec)) or spent(rows, spec,
                                                                                 secs)
    spec, _ = run(model, tok, "dynamic",
                  draft=(Scripted(prompts(tok), {r: c.tokens for r, c in plain.items()}), ctl))
    assert timed and len(timed) < len(seen)
    assert set(timed) < {n for n, _ in charged}  # the timed steps, and untimed ones too
    assert any(sp for n, sp in charged if n not in timed)  # e.g. a probe's first step
    for n in timed:  # this step and the SETTLE - 1 before it started at the same size...
        assert len({rows for rows, _, _ in seen[n - SETTLE:n]}) == 1, seen[n - SETTLE:n]
    # ...and while nothing was decided, no step that could not be timed speculated
    assert any(not settled for _, settled, _ in seen)
    assert next(settled for _, settled, sp in seen if sp)
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, r


def test_a_step_in_which_rows_finished_is_not_timed(loaded, monkeypatch):
    """A step in which rows finish copies their KV out (and the scheduler stores it in a
    prefix cache before the next step): work that either mode pays alike, which timed as a
    plain step made a speculation that lost by 1.7x look the faster (H200, B=16, rows held
    as they finished, 26th session). Neither that step nor the next is a measurement."""
    from appliance.engine import step

    name, model, tok = loaded
    if name != oracle.BATCH_MODELS[0]:
        pytest.skip("the step's bookkeeping, not the model, is under test")
    monkeypatch.setattr(step, "HOLD", True)  # (CUDA's policy: the batch keeps its size)
    plain, _ = run(model, tok, "static-4")
    seen, timed, ended = [0], [], set()  # steps so far; steps timed; steps where rows ended
    ctl = Control(4, adaptive=False)
    orig = ctl.speculate
    ctl.speculate = lambda rows, settled=True, left=None: (seen.__setitem__(0, seen[0] + 1)
                                                           or orig(rows))
    ctl.timed = lambda rows, spec, secs, tokens, live: timed.append(seen[0])
    ctl.forget = lambda uid: ended.add(seen[0])
    spec, _ = run(model, tok, "static-4",
                  draft=(Scripted(prompts(tok), {r: c.tokens for r, c in plain.items()}), ctl))
    assert len(ended) >= 2 and timed  # rows finished at several steps, others were timed
    assert not ended & set(timed) and not {n + 1 for n in ended} & set(timed), (ended, timed)
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, r


def test_a_speculative_steps_yield_is_per_live_row(loaded, monkeypatch):
    """Rows held in the batch after they finished (CUDA's policy) emit nothing: a step's
    tokens are the live rows', divided by the live rows. Before, a held row's discarded
    token counted too, over every row: 4 live rows at 2.5 among 16 read 1.4."""
    from appliance.engine import step

    name, model, tok = loaded
    if name != oracle.BATCH_MODELS[0]:
        pytest.skip("the step's bookkeeping, not the model, is under test")
    monkeypatch.setattr(step, "HOLD", True)
    plain, _ = run(model, tok, "static-4")
    calls = []
    ctl = Control(4, adaptive=False)
    orig = ctl.timed
    ctl.timed = lambda rows, spec, secs, tokens, live: (calls.append((rows, spec, tokens, live)),
                                                         orig(rows, spec, secs, tokens, live))
    spec, s = run(model, tok, "static-4",
                  draft=(Scripted(prompts(tok), {r: c.tokens for r, c in plain.items()}), ctl))
    held = [c for c in calls if c[3] < c[0]]
    assert any(sp for _, sp, _, _ in held), calls  # speculative steps timed while finished
    # rows were held
    assert all(live < tokens <= live * 5 for _, sp, tokens, live in held if sp), held
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, r
    c = Control(4)
    c.timed(16, True, 0.01, 10, live=4)
    assert c._gain[16] == 2.5  # 10 tokens over 4 live rows, not over the 16 in the batch


def test_on_cuda_the_rows_the_batch_waits_on_decide():
    """Where finished rows stay in the batch (CUDA), a step costs the whole batch's time
    either way, and the batch ends when its slowest rows do: the yield that decides is
    theirs (the rows with the most tokens left), not the batch size's mean. An H200 at
    B=16 (edit) read 0.91-0.96x with the mean: the rows that copied most finished first."""
    c = Control(6, drift=False, full_width=True, idle_max=0)
    assert c.by_rows and not Control(6, drift=True).by_rows
    for _ in range(5):  # the batch size's own yield: 4 tokens a row, at 3.6 ms against 2.1
        c.timed(16, True, 0.0036, 64, live=16)
        c.timed(16, False, 0.0021, 16, live=16)
    left = {u: 10 for u in range(13)} | {13: 40, 14: 120, 15: 116}
    for u in range(16):
        c.emitted(u, 6 if u < 14 else 1)
    assert c.ends(left) == [14, 15]  # the most left, within one step (k + 1) of the most
    assert not c.speculate(16, left=left)  # they copy nothing: plain, though the mean is 4
    for _ in range(4):
        c.emitted(14, 5)
        c.emitted(15, 5)
    assert c.speculate(16, left=left)  # at once, as they reach text they can copy
    assert c.speculate(16)  # (without rows, the batch size's own yield, as on CPU)


def test_a_shadow_claims_what_a_speculative_step_there_emits(loaded, monkeypatch):
    """While plain steps run, a lookup row's yield is settled from the tokens that follow
    each plain step (`Shadow`). Alternating plain and speculative steps (each of these
    proposing ahead, as on CUDA), every claim equals what the speculative step that
    started at the same place emitted."""
    from appliance.engine import step
    from appliance.engine.speculate.lookup import Shadow

    name, model, tok = loaded
    if name != oracle.BATCH_MODELS[0]:
        pytest.skip("the shadow's bookkeeping, not the model, is under test (and the "
                    "random-weight models' text repeats too little to propose)")
    monkeypatch.setattr(step, "AHEAD", True)

    class Alternate(Control):
        n = 0

        def speculate(self, rows, settled=True, left=None):
            super().speculate(rows, settled, left)
            self.n += 1
            return self.n % 2 == 0

        def ends(self, left):
            return list(left)  # (every row watched)

    claims, real = {}, {}
    shadow_step = Shadow.step

    def settle(self, *a):
        out = shadow_step(self, *a)
        claims.update({(u, at): n for u, at, n in out})
        return out

    monkeypatch.setattr(Shadow, "step", settle)
    spec_step = step.BatchStep._speculate

    def speculate(self):
        d = self._decode
        at = {u: (len(t), m - g - 1) for u, t, m, g in
              zip(d.uids, d.tokens, d.max_tokens, d.generated, strict=True)}
        out = spec_step(self)
        for u, (toks, _) in zip(d.uids, out, strict=True) if out is not None else ():
            if u is not None and at[u][1] >= 4:  # (room for every draft)
                real[(u, at[u][0])] = len(toks)
        return out

    monkeypatch.setattr(step.BatchStep, "_speculate", speculate)
    plain, _ = run(model, tok, "static-4")
    ctl = Alternate(4, drift=False, full_width=True, idle_max=0)
    spec, s = run(model, tok, "static-4", (LookupDrafter(1, 3), ctl))
    assert s._batch._shadow is not None
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, r
    both = claims.keys() & real.keys()
    assert len(both) >= 10 and any(real[k] > 1 for k in both), (claims, real)
    assert {k: claims[k] for k in both} == {k: real[k] for k in both}


@pytest.mark.parametrize("schedule", ["static-4", "dynamic"])
def test_compacting_the_masked_slots_after_every_verify_is_token_exact(schedule, monkeypatch):
    """Rows that kept fewer drafts than others leave masked slots (FullLayout holes); past
    a share of the buffer they are gathered right-aligned again. Compacting after every
    verify pass changes no token."""
    from appliance.engine import verify

    model, tok = oracle.load(oracle.model_path("tiny"), "float32")
    plain, _ = run(model, tok, schedule)
    monkeypatch.setattr(verify, "COMPACT_AT", -1.0)
    compacted = []
    orig = FullLayout.compact
    monkeypatch.setattr(FullLayout, "compact",
                        lambda self, plan: compacted.append(1) or orig(self, plan))
    draft = (Scripted(prompts(tok), {r: c.tokens for r, c in plain.items()}), Control(4))
    spec, s = run(model, tok, schedule, draft)
    assert s._batch.spec_ticks > 0 and compacted
    for r in plain:
        assert spec[r].tokens == plain[r].tokens, r


def test_every_row_may_propose_k_where_a_verify_pass_feeds_k_plus_one_anyway():
    """On CUDA every row of a verify pass is fed k + 1 tokens (one shape per batch size):
    a shorter proposal saves nothing there, so a row's budget stays k whatever its
    acceptance; where a pass feeds only the proposals (CPU), a row that misses proposes
    fewer tokens, then pauses."""
    full, own = Control(6, full_width=True), Control(6, full_width=False)
    for c in (full, own):
        for _ in range(3):
            c.record(0, 6, 1)
    assert full.budget(0) == 6
    assert own.budget(0) < 6


def test_dense_attention_equals_fused_attention():
    """Verify passes on CUDA attend with plain matmuls (`quantized.DENSE`, no graph built
    per shape): the same attention as MLX's fused kernel, grouped-query heads, a padded
    whole-buffer mask and all, to float32 rounding."""
    from appliance.engine.kv.quantized import DENSE

    mx.random.seed(0)
    B, Hq, Hkv, L, T, D = 3, 8, 2, 7, 300, 64
    q = mx.random.normal((B, Hq, L, D))
    k, v = mx.random.normal((B, Hkv, T, D)), mx.random.normal((B, Hkv, T, D))
    left = mx.array([0, 17, 120])[:, None, None, None]  # rows' left padding
    pos = mx.arange(T)[None, None, None]
    written = 250  # slots past it are the buffer's unwritten tail
    qpos = mx.arange(written - L, written)[None, None, :, None]
    mask = (pos >= left) & (pos <= qpos)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=D ** -0.5, mask=mask)
    got = DENSE.attend(q, (k,), (v,), D ** -0.5, mask)
    assert got.shape == want.shape
    assert mx.allclose(got, want, atol=1e-5).item()


def test_a_batch_that_finds_nothing_to_propose_stops_asking_for_a_while():
    """Asking the rows for drafts reads their pending tokens first, which costs the step
    its pipelining (a lookup that never matched ran at 0.76x on an H200): after a step
    that found nothing, plain steps run without asking, 1, 2, then 4 steps (on CUDA; on
    CPU it keeps asking); a step that finds drafts ends the wait."""
    c = Control(4, idle_max=4)
    asked = []
    for _ in range(200):
        ask = c.speculate(1)
        asked.append(ask)
        if ask:
            c.found(1, False)
    assert sum(asked) <= 50  # without the wait: 100 asks (half the steps, measuring)
    c = Control(4, idle_max=4)
    waits = []
    for _ in range(8):
        c.found(1, False)
        waits.append(c._idle[1])
    assert waits == [1, 2, 4, 4, 4, 4, 4, 4]
    assert not any(c.speculate(1) for _ in range(4))  # waiting: not asked
    c.found(1, True)  # drafts again: the next wait starts from one step
    c.found(1, False)
    assert c._idle[1] == 1
    cpu = Control(4, idle_max=0)  # CPU's default: asking costs next to nothing there
    cpu.found(1, False)
    assert not cpu._idle.get(1)
