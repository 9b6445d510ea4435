"""KV schemes against their oracles.

- B=1, affine with equal K/V bits: token-exact with mlx-lm's own QuantizedKVCache path
  (`generate_step` with `kv_bits`, `kv_group_size`, `quantized_kv_start`);
- batched quantized rows (a composition mlx-lm lacks): token-exact with the same rows run
  through our reference path (dequantize, then SDPA) at the same B, on every schedule;
- the fast path's logits agree with the reference path's within 1e-3 (float32);
- a prefix-cache hit under a quantized scheme equals a cold run under that scheme.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from harness import Collector, cuda_shape_policy, drive
from mlx_lm.generate import generate_step

from appliance import oracle
from appliance.engine import GenerationRequest, SamplingParams
from appliance.engine.budget import Budget, KVShape
from appliance.engine.continuous import ContinuousScheduler
from appliance.engine.kv import Scheme
from appliance.engine.kv.affine import AffineCodec
from appliance.engine.kv.native import on_cuda
from appliance.engine.kv.turboquant import TurboCodec
from appliance.engine.prefix_cache import PrefixCache, RamTier
from appliance.engine.runner import Decoder, generate

ALL_LAYERS = tuple(range(6))  # the embedded model's six layers, all quantized
CODECS = {"affine8": lambda: AffineCodec(64, 8, 8), "k8v4": lambda: AffineCodec(64, 8, 4),
          "affine4": lambda: AffineCodec(64, 4, 4), "turboquant": lambda: TurboCodec(64, 4, 4),
          "turboquant3": lambda: TurboCodec(64, 3, 3, "orthogonal", 1),
          "turboquant3.5": lambda: TurboCodec(64, 3.5, 3.5)}


@pytest.fixture(scope="module")
def tiny():
    model, tok = oracle.load(oracle.model_path("tiny"), "float32")
    return model, tok, oracle.batch_prompts(tok)


@pytest.mark.skipif(on_cuda(), reason="the oracle cannot run: MLX's CUDA backend has no "
                    "quantized_matmul for attention's shapes, so mlx-lm's kv_bits path fails")
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("start", [0, 30])
def test_b1_affine_equals_mlx_lm_quantized_kv_cache(tiny, bits, start):
    model, tok, prompts = tiny
    scheme = Scheme(AffineCodec(64, bits, bits), ALL_LAYERS, start)
    for p in prompts.values():
        ours = [t for t, _ in generate(model, p, 24, SamplingParams(), 512, scheme)]
        theirs = [int(t) for t, _ in generate_step(
            mx.array(p), model, max_tokens=24, kv_bits=bits, kv_group_size=64,
            quantized_kv_start=start)]
        assert ours == theirs


def _run(model, tok, prompts, schedule: str, scheme: Scheme | None):
    sch = oracle.BATCH_SCHEDULES[schedule]
    rows = {r: Collector(GenerationRequest(prompts[r], oracle.BATCH_ROWS[r][1]))
            for _, _, r in sch["events"]}
    s = ContinuousScheduler(model, set(tok.eos_token_ids), sch["max_rows"],
                            oracle.BATCH_PREFILL_CHUNK, Budget(1 << 40, KVShape(1, 0, 0, 0)),
                            scheme=scheme)
    drive(s, sch["events"], rows)
    return {r: c.tokens for r, c in rows.items()}


@pytest.mark.parametrize("name", list(CODECS))
@pytest.mark.parametrize("schedule", list(oracle.BATCH_SCHEDULES))
def test_batched_rows_equal_the_reference_path_at_the_same_b(tiny, name, schedule):
    model, tok, prompts = tiny
    fast = _run(model, tok, prompts, schedule, Scheme(CODECS[name](), (2, 3)))
    ref = _run(model, tok, prompts, schedule, Scheme(CODECS[name](), (2, 3), reference=True))
    assert fast == ref
    assert all(fast.values())  # every row produced tokens


@pytest.mark.parametrize("name", ["k8v4", "turboquant"])
@pytest.mark.parametrize("schedule", list(oracle.BATCH_SCHEDULES))
def test_rows_crossing_kv_start_in_a_batch_equal_the_reference_path(tiny, name, schedule,
                                                                   monkeypatch):
    """kv.start 36 on the 25-90-token prompts: rows reach it while they prefill (the chunk
    that reaches it may carry them past it) and while they decode, and move to the encoded
    part; rows below it stay native beside encoded ones."""
    from appliance.engine.kv.split import SplitLayout

    model, tok, prompts = tiny
    seen = []  # (native rows, encoded rows) of every write to a split layer
    write = SplitLayout.update_and_fetch

    def spy(self, keys, values):
        out = write(self, keys, values)
        seen.append((len(self.rows_n), len(self.rows_c)))
        for part, book in ((self.native, self.n_rows), (self.coded, self.c_rows)):
            if part is not None:  # the host-side copy of each part's bookkeeping is exact
                assert (book.idx, book.pads) == (part._idx, part.left_padding.tolist())
                assert book.lengths == part.offset.tolist()
        return out

    monkeypatch.setattr(SplitLayout, "update_and_fetch", spy)
    fast = _run(model, tok, prompts, schedule, Scheme(CODECS[name](), (2, 3), 36))
    ref = _run(model, tok, prompts, schedule, Scheme(CODECS[name](), (2, 3), 36,
                                                     reference=True))
    assert fast == ref
    if schedule != "static-2":  # (its two rows reach 36 in the same prefill chunk)
        assert any(n and c for n, c in seen)  # both kinds of row in one pass
    assert seen[0][1] == 0 and any(c for _, c in seen)  # rows start native, then move


@pytest.mark.parametrize("name", ["k8v4", "turboquant"])
def test_a_row_is_encoded_after_the_same_chunk_alone_and_in_a_batch(tiny, name, monkeypatch):
    """A row's KV is encoded after the prefill chunk that carries it to kv.start, alone
    (mlx-lm's generate_step arithmetic) and in a batch alike, so a request's tokens do not
    change with the load. A batched row's chunk used to stop at kv.start: the 40-token
    prompt was encoded holding 36 tokens in a batch and 39 alone, and on a sliding-window
    model with near-tied logits a greedy request's tokens moved with the rows beside it."""
    from appliance.engine.kv.quantized import QuantRowCache

    model, tok, prompts = tiny
    held, encode = [], QuantRowCache.from_native.__func__
    monkeypatch.setattr(QuantRowCache, "from_native", classmethod(
        lambda cls, c, *a, **k: held.append(c.offset) or encode(cls, c, *a, **k)))
    rows = {r: oracle.BATCH_ROWS[r][1] for r in "abcd"}
    alone = {}
    for r, n in rows.items():
        alone[r] = [t for t, _ in generate(model, prompts[r], n, SamplingParams(),
                                           oracle.BATCH_PREFILL_CHUNK,
                                           Scheme(CODECS[name](), (2, 3), 36))]
    lone_held, held[:] = sorted(held), []
    batched = _run(model, tok, prompts, "static-4", Scheme(CODECS[name](), (2, 3), 36))
    assert sorted(held) == lone_held  # (two encoded layers a row)
    assert batched == alone


@pytest.mark.parametrize("name", ["k8v4", "turboquant"])
def test_a_one_token_prefill_chunk_attends_float_kv_alone_and_in_a_batch(tiny, name):
    """A prefill chunk attends over float KV whatever its length. A two-token prompt at
    kv.start 0 prefills one token: alone, before the row encodes (generate_step's
    arithmetic), over float KV; in a batch its layout was already encoded and a one-token
    pass was taken for a decode step, over codes, so the first token's log-probability
    moved by up to 0.075 with the load (TurboQuant), and on near-tied logits the token."""
    model, tok, _ = tiny
    ids = list(tok.encode(oracle.BATCH_TEXT))
    prompts = {f"r{i}": ids[5 * i:5 * i + 2] for i in range(4)}
    alone = {}
    for r, p in prompts.items():
        out = list(generate(model, p, 3, SamplingParams(), oracle.BATCH_PREFILL_CHUNK,
                            Scheme(CODECS[name](), ALL_LAYERS, 0)))
        alone[r] = [t for t, _ in out], out[0][1][out[0][0]].item()
    rows = {r: Collector(GenerationRequest(p, 3, logprobs=0)) for r, p in prompts.items()}
    s = ContinuousScheduler(model, set(tok.eos_token_ids), 4, oracle.BATCH_PREFILL_CHUNK,
                            Budget(1 << 40, KVShape(1, 0, 0, 0)),
                            scheme=Scheme(CODECS[name](), ALL_LAYERS, 0))
    drive(s, [(0, "insert", r) for r in rows], rows)
    for r, c in rows.items():
        assert c.tokens == alone[r][0]
        assert c.events[0].logprob == pytest.approx(alone[r][1], abs=1e-4)


# (model, its full-attention layer to encode, head size, kv.start, rows as (prompt tokens,
# arrival tick), max_rows, prefill_rows, CUDA's whole-buffer policy on, a draft): the
# fuzzer's cases (a draft keeps a lone first row batched)
TRIM_CASES = [("tiny", (0,), 64, 16, [(30, 0), (2, 0)], 2, 1, True, False),
              ("tiny-gemma3", (1,), 16, 0, [(2, 0), (1, 0)], 1, 1, True, False),
              ("tiny-qwen3-next", (3,), 16, 64, [(66, 0), (34, 1)], 2, 2, False, True)]


@pytest.mark.parametrize("case", TRIM_CASES, ids=[c[0] for c in TRIM_CASES])
def test_cudas_trim_on_the_grid_keeps_every_full_attention_layer_aligned(case, monkeypatch):
    """On CUDA a filter trims left padding in whole steps (native.GRID_TRIM), but beside
    encoded layers every full-attention layer trims all of it, as the encoded layers' own
    bookkeeping does (the model builds one mask for all of them). The prefill batch's
    native layers (a row taken out to decode, after a pass CUDA right-pads) and a split
    layer's native part (rows moving across kv.start) trimmed on the grid, and every row of
    the next pass failed ("Shapes (1,1,1,2) and (1,4,1,17) cannot be broadcast"; found by
    a differential fuzzer). With CUDA's policy run here, every row is served."""
    from appliance.engine import step as step_mod
    from appliance.engine.kv import native
    from appliance.engine.speculate import Control, LookupDrafter

    name, layers, dim, start, rows, max_rows, prefill_rows, whole, draft = case
    model, tok = oracle.load(oracle.model_path(name), "float32")
    ids = list(tok.encode(oracle.BATCH_TEXT))
    if whole:
        cuda_shape_policy(monkeypatch)
        monkeypatch.setattr(step_mod, "HOLD", True)
    monkeypatch.setattr(native, "GRID_TRIM", True)
    got = {f"r{i}": Collector(GenerationRequest(ids[7 * i:7 * i + n], 4))
           for i, (n, _) in enumerate(rows)}
    s = ContinuousScheduler(model, set(tok.eos_token_ids), max_rows, oracle.BATCH_PREFILL_CHUNK,
                            Budget(1 << 40, KVShape(1, 0, 0, 0)), prefill_rows=prefill_rows,
                            scheme=Scheme(TurboCodec(dim, 4, 4), layers, start),
                            **(dict(drafter=LookupDrafter(1, 3), control=Control(1, False))
                               if draft else {}))
    drive(s, [(t, "insert", f"r{i}") for i, (_, t) in enumerate(rows)], got)
    for c in got.values():
        assert c.finished.error is None and c.tokens, c.finished


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-qwen3-next"])
def test_kv_start_in_a_batch_on_sliding_and_hybrid_models(name):
    """Their full-attention layers split at kv.start 36 (gemma3 builds its global mask from
    one of them), beside sliding-window or recurrent layers: equal to the reference path."""
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    model, tok = oracle.load(oracle.model_path(name), "float32")
    prompts = oracle.batch_prompts(tok)
    full = tuple(i for i, c in enumerate(make_prompt_cache(model)) if type(c) is KVCache)
    fast = _run(model, tok, prompts, "dynamic", Scheme(TurboCodec(16, 4, 4), full, 36))
    ref = _run(model, tok, prompts, "dynamic", Scheme(TurboCodec(16, 4, 4), full, 36,
                                                      reference=True))
    assert fast == ref and all(fast.values())


@pytest.mark.parametrize("schedule", list(oracle.BATCH_SCHEDULES))
def test_rows_below_kv_start_in_a_batch_equal_native(tiny, schedule, monkeypatch):
    """Every row stays below kv.start: a quantized scheme's batch is native's, token for
    token, at the same B (short rows keep native speed and quality in a batch too), and no
    row was ever encoded (on static-2 encoded rows happen to give native's tokens too)."""
    from appliance.engine.kv.split import SplitLayout

    model, tok, prompts = tiny
    encoded = []
    write = SplitLayout.update_and_fetch

    def spy(self, keys, values):
        encoded.append(len(self.rows_c))
        return write(self, keys, values)

    monkeypatch.setattr(SplitLayout, "update_and_fetch", spy)
    native = _run(model, tok, prompts, schedule, None)
    assert _run(model, tok, prompts, schedule, Scheme(CODECS["turboquant"](), ALL_LAYERS,
                                                      200)) == native
    assert encoded and not any(encoded)


@pytest.mark.parametrize("layers", ["some", "all"])
@pytest.mark.parametrize("name", list(CODECS))
def test_cuda_shape_policy_gives_the_same_tokens(tiny, name, layers, monkeypatch):
    """On CUDA, prefill chunks of rows prefilled together are right-padded to a few widths
    and native layers attend over whole buffers (engine/prefill.py `prefill_width`), and a
    lone row's prefill takes the fused ("causal") kernel, encoded layers' too (their
    prefill attends over float keys); quantized rows keep their tokens."""
    from appliance.engine.kv.native import FullLayout
    from appliance.engine.kv.quantized import QuantLayout

    model, tok, prompts = tiny
    which = (2, 3) if layers == "some" else ALL_LAYERS
    plain = _run(model, tok, prompts, "dynamic", Scheme(CODECS[name](), which))
    cuda_shape_policy(monkeypatch)
    masks = []  # the model builds one mask, from its first layer's layout
    first = FullLayout if layers == "some" else QuantLayout
    make_mask = first.make_mask
    monkeypatch.setattr(first, "make_mask", lambda self, N, **kw: masks.append(
        m := make_mask(self, N, **kw)) or m)
    assert _run(model, tok, prompts, "dynamic", Scheme(CODECS[name](), which)) == plain
    assert "causal" in [m for m in masks if isinstance(m, str)]


@pytest.mark.parametrize("name", list(CODECS))
def test_fast_path_logits_agree_with_the_reference_path(tiny, name):
    model, _, prompts = tiny
    out = []
    for reference in (False, True):
        scheme = Scheme(CODECS[name](), ALL_LAYERS, reference=reference)
        d = Decoder(model, prompts["b"], SamplingParams(), 512, scheme=scheme)
        steps = [d.pending_logprobs]
        for _ in range(8):
            d.next()
            steps.append(d.pending_logprobs)
        out.append(mx.stack(steps))
    assert mx.abs(out[0] - out[1]).max().item() < 1e-3


@pytest.mark.parametrize("name", list(CODECS))
def test_a_prefix_hit_under_a_quantized_scheme_equals_a_cold_run(tiny, name):
    model, tok, prompts = tiny
    scheme = Scheme(CODECS[name](), (2, 3))
    system = prompts["b"][:60]

    def run(prefix, tail, rows):
        s = ContinuousScheduler(model, set(tok.eos_token_ids), rows, 32,
                                Budget(1 << 40, KVShape(1, 0, 0, 0)), prefix=prefix,
                                scheme=scheme)
        cs = {i: Collector(GenerationRequest(system + t, 12, checkpoints=(len(system),)))
              for i, t in enumerate(tail)}
        drive(s, [(0, "insert", i) for i in cs], cs)
        return [c.tokens for c in cs.values()], cs

    tails = [prompts["a"][:9], prompts["c"][:7]]
    cold, _ = run(PrefixCache(ram=RamTier(1 << 30)), tails, 2)  # empty: both rows miss
    prefix = PrefixCache(ram=RamTier(1 << 30))
    run(prefix, [prompts["d"][:5]], 1)  # stores the shared head, quantized
    assert prefix.ram.stats.inserts
    warm, cs = run(prefix, tails, 2)
    assert prefix.ram.stats.hits >= 2
    assert warm == cold
    from appliance.engine.kv.quantized import QuantRowCache

    entry = next(iter(prefix.ram._lru.values())).cache
    assert all(isinstance(entry[i], QuantRowCache) for i in (2, 3))  # stored encoded
    assert not any(isinstance(entry[i], QuantRowCache) for i in (0, 1, 4, 5))


@pytest.mark.slow
@pytest.mark.parametrize("start", [None, 48])
def test_the_headline_kv_scheme_serves_through_the_openai_api(tmp_path, start):
    """`appliance +profile=agent-fleet kv=turboquant`: a real server, the real client, four
    concurrent chats (batched) sharing a system prompt, then one whose prefix is cached.
    The embedded model's short chats stay below the default kv.start; at kv.start 48 they
    cross it while they are served, and the prefix cache then holds their codes."""
    import asyncio

    import openai
    from conftest import app_for

    from appliance.engine.kv.native import FullLayout
    from appliance.engine.kv.quantized import QuantRowCache
    from appliance.engine.kv.split import SplitLayout

    overrides = ["+profile=agent-fleet", "kv=turboquant", f"cache.ssd.path={tmp_path}",
                 "model.dtype=float32", *([f"kv.start={start}"] if start else [])]
    with app_for(overrides) as (plan, engine, url):
        assert plan.kv.scheme == "turboquant" and plan.kv.quantized_layers == (2, 3)
        assert plan.cache.kind == "tiered"
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        system = {"role": "system", "content": "You write small, correct Python functions. " * 8}

        async def chat(q):
            return await client.chat.completions.create(
                model=plan.model.id, max_tokens=16,
                messages=[system, {"role": "user", "content": q}])

        async def fleet():
            rs = await asyncio.gather(*(chat(f"Write a function number {i}.")
                                        for i in range(4)))
            return rs, await chat("Write a function number 0.")

        rs, again = asyncio.run(fleet())
        assert all(r.choices[0].finish_reason in ("stop", "length") for r in rs)
        assert all(r.system_fingerprint == plan.fingerprint for r in rs)
        assert again.usage.prompt_tokens_details.cached_tokens > 0
        layouts = engine.scheduler._batch.scheme.merge([engine.scheduler._batch.scheme
                                                        .make_cache(engine.model)])
        # a new row in a batch: its quantized layers stay native until kv.start tokens
        assert isinstance(layouts[2], SplitLayout) and layouts[2].rows_n == [0]
        assert type(layouts[0]) is FullLayout
        entries = [e.cache for e in engine.scheduler.prefix.ram._lru.values()]
        encoded = [isinstance(c[2], QuantRowCache) for c in entries]
        assert entries and all(encoded) == bool(start) and any(encoded) == bool(start)


@pytest.mark.parametrize("name", list(CODECS))
def test_fast_and_reference_paths_give_the_same_tokens_on_the_golden_prompts(name):
    """The serial goldens' prompts and sampling settings, in float32 (where the logits agree
    within 1e-3), every layer quantized from the first token: the fast path's tokens equal
    the reference path's."""
    from conftest import golden

    from appliance.engine.types import SamplingParams as SP

    model, _ = oracle.load(oracle.model_path("tiny"), "float32")
    for case in golden("tiny")["cases"]:
        got = []
        for reference in (False, True):
            scheme = Scheme(CODECS[name](), ALL_LAYERS, reference=reference)
            got.append([t for t, _ in generate(model, case["prompt_ids"], case["max_tokens"],
                                               SP(**case.get("sampling", {})), 512, scheme)])
        assert got[0] == got[1], case["name"]


def test_the_3_5_bit_split_puts_each_layers_outlier_channels_at_4_bits(tiny):
    """TurboQuant at 3.5 bits (the paper's outlier-channel split): per layer and kv head,
    the half of the channels with the largest mean |x| on a fixed calibration pass goes to
    4 bits, the rest to 3, each half with its own norm and rotation. On the embedded
    model's own keys, the calibrated split reconstructs better than the same split with
    the halves swapped, and between plain 3-bit and 4-bit; calibration is deterministic
    and a scheme does it once, from the model."""
    from mlx_lm.models.cache import make_prompt_cache

    from appliance.engine.kv.turboquant import calibrate

    model, tok, prompts = tiny
    scheme = Scheme(TurboCodec(64, 3.5, 3.5), ALL_LAYERS)
    with pytest.raises(RuntimeError, match="calibrate"):
        scheme.layer_codec(2)
    scheme.make_cache(model)
    assert calibrate(model, ALL_LAYERS, 0) == {i: scheme.codecs[i].channels for i in ALL_LAYERS}
    cache = make_prompt_cache(model)
    model(mx.array([sum(prompts.values(), [])]), cache=cache)
    better = 0
    for i in ALL_LAYERS:
        x = cache[i].keys[..., :cache[i].offset, :]
        codec = scheme.layer_codec(i)
        swapped = codec.with_channels({w: [o[32:] + o[:32] for o in codec.channels[w]]
                                       for w in "kv"})

        def err(c, x=x):
            return (((c.decode(c.encode(x, "k"), "k", mx.float32) - x) ** 2).sum()
                    / (x ** 2).sum()).item()

        split, wrong = err(codec), err(swapped)
        assert err(TurboCodec(64, 4, 4)) < split < err(TurboCodec(64, 3, 3))
        better += split < wrong
    assert better == len(ALL_LAYERS)
