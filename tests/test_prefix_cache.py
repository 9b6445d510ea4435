"""The RAM prefix cache: lookup and eviction exactly, and hits token-exact with cold runs."""

from __future__ import annotations

import pytest
from conftest import app_for
from harness import Collector, cuda_shape_policy, drive

from appliance import oracle
from appliance.engine import GenerationRequest, SamplingParams
from appliance.engine.budget import Budget, KVShape
from appliance.engine.continuous import ContinuousScheduler
from appliance.engine.prefix_cache import PrefixCache, RamTier
from appliance.engine.trie import TokenTrie


class Blob:
    """Stands in for one layer's cache in the bookkeeping tests: only nbytes matters."""

    state = ()

    def __init__(self, nbytes: int):
        self.nbytes = nbytes


def _shared(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_trie_matches_a_plain_set_of_sequences():
    """The radix tree against the obvious definition, through random adds and removes of
    sequences that share prefixes, split edges and merge them back; deep ones too."""
    import random

    rng = random.Random(0)
    stem = [rng.randrange(4) for _ in range(12)]
    trie, stored = TokenTrie(), set()
    for _ in range(3000):
        seq = tuple(stem[:rng.randrange(13)] + [rng.randrange(3) for _ in range(rng.randrange(4))])
        if seq and rng.random() < 0.6:
            trie.add(seq)
            stored.add(seq)
        else:
            trie.remove(seq)
            stored.discard(seq)
        q = stem[:rng.randrange(13)] + [rng.randrange(3) for _ in range(rng.randrange(5))]
        assert trie.longest(q) == max((len(s) for s in stored if tuple(q[:len(s)]) == s),
                                      default=0)
        n, key = trie.shared(q)  # the most tokens any stored sequence shares, and one such
        assert n == max((_shared(s, q) for s in stored), default=0)
        assert (key is None) == (n == 0) and (key is None or key in stored
                                              and _shared(key, q) == n)
        assert len(trie) == len(stored)
    for seq in list(stored):
        trie.remove(seq)
    assert trie.empty()
    deep = list(range(20_000))  # a node per token would recurse/allocate 20k deep
    trie.add(deep)
    trie.add(deep[:8000])
    assert trie.longest(deep + [1]) == 20_000 and trie.longest(deep[:9000]) == 8000
    assert trie.shared(deep[:9000] + [-1]) == (9000, tuple(deep))
    assert len(trie) == 2


def test_longest_prefix_refresh_and_lru_by_bytes():
    t = RamTier(cap_bytes=100)
    t.insert([1, 2, 3], [Blob(30)])
    t.insert([1, 2, 3, 4, 5], [Blob(30)])
    t.insert([7, 8], [Blob(30)])
    assert t.lookup([1, 2, 3, 4, 5, 6])[0] == 5
    assert t.lookup([1, 2, 3, 4, 5])[0] == 3  # one token must remain to run
    assert t.lookup([1, 2, 9, 9])[0] == 0 and t.lookup([7, 8, 9])[0] == 2
    assert t.stats.hits == 3 and t.stats.misses == 1 and t.stats.hit_tokens == 10
    # [1,2,3] was used after [1..5]: the least recently used is now [1..5]
    t.lookup([1, 2, 3, 0])
    t.insert([9], [Blob(30)])
    assert t.lookup([1, 2, 3, 4, 5, 6])[0] == 3 and t.stats.evictions == 1
    t.check_integrity()
    t.trim(0)
    assert len(t) == 0 and t.nbytes == 0 and t._trie.empty()
    t.insert([5], [Blob(500)])  # larger than the cap: not stored, nothing evicted for it
    assert len(t) == 0


def _sched(model, tok, ceiling=None):
    return ContinuousScheduler(model, set(tok.eos_token_ids), 4, 32,
                               Budget(1 << 40, KVShape(1, 0, 0, 0)),
                               prefix=PrefixCache(ram=RamTier(1 << 30)), ceiling=ceiling)


def _requests(tok):
    """Two agents sharing a 40-token system prefix (checkpoint at 40), distinct turns."""
    ids = oracle.batch_prompts(tok)
    system = ids["b"][:40]
    return {"x": GenerationRequest(system + ids["a"][:20], 12, checkpoints=(40,)),
            "y": GenerationRequest(system + ids["c"][:15], 12, checkpoints=(40,),
                                   sampling=SamplingParams(temperature=0.9, seed=3))}


def _cold(model, tok, req):
    """The request on a fresh scheduler: same checkpoint cuts, nothing cached."""
    c = Collector(req)
    drive(_sched(model, tok), [(0, "insert", "r")], {"r": c})
    assert c.finished.cached_tokens == 0
    return c.tokens


@pytest.mark.parametrize("together", [False, True])
def test_hits_are_token_exact_with_cold(loaded, together):
    """Solo (one after the other) and batched (second arrives while the first runs)."""
    _, model, tok = loaded
    reqs = _requests(tok)
    want = {r: _cold(model, tok, q) for r, q in reqs.items()}
    s = _sched(model, tok)
    rows = {r: Collector(q) for r, q in reqs.items()}
    s.add(rows["x"])
    for _ in range(3 if together else 10_000):
        if not s.has_work():
            break
        s.step()
        s.check_integrity()
    assert (rows["x"].finished is None) == together  # y arrives while x runs, or after it
    drive(s, [(0, "insert", "y")], rows)
    assert {r: c.tokens for r, c in rows.items()} == want
    assert rows["x"].finished.cached_tokens == 0
    assert rows["y"].finished.cached_tokens == 40  # the shared system prefix
    s.prefix.check_integrity()


def test_agents_arriving_together_prefill_their_shared_prefix_once(loaded):
    """Four agents with one system prompt arrive in the same tick: the first prefills it,
    the others start after its checkpoint is stored and hit it (each used to be looked
    up at arrival, miss, and prefill it again); tokens equal each one's cold run."""
    _, model, tok = loaded
    ids = oracle.batch_prompts(tok)
    system = ids["b"][:40]
    reqs = {r: GenerationRequest(system + ids[r][:12], 6, checkpoints=(40,)) for r in "acd"}
    reqs["b"] = GenerationRequest(system + ids["b"][50:62], 6, checkpoints=(40,))
    want = {r: _cold(model, tok, q) for r, q in reqs.items()}
    s = _sched(model, tok)
    rows = {r: Collector(q) for r, q in reqs.items()}
    drive(s, [(0, "insert", r) for r in rows], rows)
    assert {r: c.tokens for r, c in rows.items()} == want
    assert sorted(c.finished.cached_tokens for c in rows.values()) == [0, 40, 40, 40]
    s.prefix.check_integrity()


def test_next_turn_hits_the_whole_previous_turn(loaded):
    name, model, tok = loaded
    s = _sched(model, tok)
    first = Collector(_requests(tok)["x"])
    drive(s, [(0, "insert", "a")], {"a": first})
    turn = list(first.request.prompt) + first.tokens  # the conversation so far
    nxt = GenerationRequest(turn + oracle.batch_prompts(tok)["d"][:10], 8)
    ram = s.prefix.ram
    hit = ram._trie.longest(nxt.prompt[:-1])
    # with full attention the turn holds only its own slots over the prompt's checkpoints,
    # not a copy of them: the hit joins the chain (window and recurrent layers: whole)
    assert (ram._lru[tuple(nxt.prompt[:hit])].parent is not None) == (name == "tiny")
    second = Collector(nxt)
    drive(s, [(0, "insert", "b")], {"b": second})
    assert second.finished.cached_tokens == hit >= len(turn) - 1
    assert second.tokens == _cold(model, tok, nxt)
    assert (ram.stats.deltas >= 2) == (name == "tiny")
    ram.check_integrity()


def test_the_cache_yields_memory_to_live_rows(loaded):
    """One ceiling for both: while rows hold KV the tier trims to what is left."""
    _, model, tok = loaded
    s = _sched(model, tok, ceiling=0)
    c = Collector(_requests(tok)["x"])
    drive(s, [(0, "insert", "a")], {"a": c})
    assert len(s.prefix) == 0 and s.prefix.nbytes == 0


def test_cached_tokens_in_usage_and_stats():
    with app_for(["cache=ram"]) as (plan, engine, url):
        import httpx

        system = {"role": "system", "content": "You are a careful Python reviewer. " * 20}
        bodies = [{"model": plan.model.id, "max_tokens": 4,
                   "messages": [system, {"role": "user", "content": q}]}
                  for q in ("def f(x):", "import os")]
        usage = [httpx.post(f"{url}/v1/chat/completions", json=b, timeout=60).json()["usage"]
                 for b in bodies]
        assert usage[0]["prompt_tokens_details"]["cached_tokens"] == 0
        assert usage[1]["prompt_tokens_details"]["cached_tokens"] > 100
        ram = httpx.get(f"{url}/stats").json()["cache"]["ram"]
        assert ram["hits"] >= 1 and ram["hit_tokens"] > 100 and ram["bytes"] > 0
        assert plan.cache.ram_bytes == plan.memory.ram_bytes > 0  # auto: sized from the machine


def test_many_rows_sharing_and_evicting(loaded):
    """Six agents, four rows, one system prefix, a RAM cap that forces evictions: every
    row still equals its cold run, and the tier stays consistent."""
    _, model, tok = loaded
    ids = oracle.batch_prompts(tok)
    system = ids["b"][:40]
    tails = [ids[r][i: i + 12] for r in "acd" for i in (0, 9)]
    reqs = {f"r{i}": GenerationRequest(system + t, 8, checkpoints=(40,))
            for i, t in enumerate(tails)}
    want = {r: _cold(model, tok, q) for r, q in reqs.items()}
    probe = _sched(model, tok)
    drive(probe, [(0, "insert", "p")], {"p": Collector(reqs["r0"])})
    s = _sched(model, tok)
    s.prefix.ram.cap_bytes = probe.prefix.nbytes  # room for one request's entries only
    rows = {r: Collector(q) for r, q in reqs.items()}
    drive(s, [(2 * i, "insert", r) for i, r in enumerate(rows)], rows)
    assert {r: c.tokens for r, c in rows.items()} == want
    assert s.prefix.ram.stats.evictions > 0 and s.prefix.ram.stats.hits > 0
    assert sum(c.finished.cached_tokens > 0 for c in rows.values()) >= 3
    s.prefix.check_integrity()


def test_checkpoints_at_every_message_end(engine, plan):
    """A conversation's message ends become checkpoints: a branch that shares the first
    turns (not only the system prompt) reuses them."""
    from appliance.api.requests import prepare_chat
    from appliance.api.schemas import ChatCompletionRequest, ChatMessage

    msgs = [("system", "You write Python."), ("user", "def add(a, b):"),
            ("assistant", "return a + b"), ("user", "now subtract")]
    body = ChatCompletionRequest(model=plan.model.id,
                                 messages=[ChatMessage(role=r, content=c) for r, c in msgs])
    prep = prepare_chat(body, plan, engine.tokenizer)
    ids = prep.engine_request.prompt
    cps = prep.engine_request.checkpoints
    assert len(cps) == 3 and list(cps) == sorted(cps) and cps[-1] < len(ids)
    for k, cp in zip(range(1, 4), cps, strict=True):
        head = engine.tokenizer.apply_chat_template(
            [{"role": r, "content": c} for r, c in msgs[:k]], add_generation_prompt=False)
        assert ids[:cp] == list(head)


def _two_rows(model, tok, prefill_chunk=32, drafter=None, control=None):
    """A long row decoding, then a 60-token prompt with checkpoints at 40 and 50 that
    prefills beside it (the lone prefilling row of a batch, not the solo path)."""
    ids = oracle.batch_prompts(tok)
    busy = GenerationRequest(ids["a"][:20], 30)
    req = GenerationRequest(ids["b"][:40] + ids["c"][:20], 6, checkpoints=(40, 50))
    s = ContinuousScheduler(model, set(tok.eos_token_ids), 4, prefill_chunk,
                            Budget(1 << 40, KVShape(1, 0, 0, 0)),
                            prefix=PrefixCache(ram=RamTier(1 << 30)), drafter=drafter,
                            control=control)
    return s, busy, req


@pytest.mark.parametrize("draft", [None, "mtp"])
def test_a_lone_rows_pass_runs_past_its_checkpoints(loaded, monkeypatch, draft):
    """One pass runs on past a checkpoint (the prefix cache takes the row's first n tokens
    from it afterwards), where a pass per segment used to stop at each: fewer passes, and
    each stored checkpoint holds the KV of exactly its tokens. So too with an MTP head
    beside the model (speculating every step): the checkpoints inside the pass hold the
    model's layers only, and a hit on one starts the head empty, as a solo row's does."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from appliance.engine.prefill import Prefill
    from appliance.engine.speculate import Control, MTPDrafter
    from appliance.models.mtp import MTPHead

    name, model, tok = loaded
    if draft == "mtp" and name == "tiny-gemma3":
        pytest.skip("no MTP head layout for gemma3 (appliance.models.mtp)")
    drafter = control = None
    if draft == "mtp":
        mx.random.seed(0)
        drafter, control = MTPDrafter(MTPHead.for_model(model), model, 16), Control(2, False)
    s, busy, req = _two_rows(model, tok, drafter=drafter, control=control)
    layers = len(s._batch.scheme.make_cache(model))  # the model's own
    passes = []
    run = Prefill.run
    monkeypatch.setattr(Prefill, "run", lambda self, chunks, **kw: (
        passes.append([len(c) for c in chunks]) if any(chunks) else None,
        run(self, chunks, **kw))[1])
    rows = {"busy": Collector(busy), "r": Collector(req)}
    drive(s, [(0, "insert", "busy"), (3, "insert", "r")], rows)
    own = [p for p in passes if p not in ([20], [19])]  # (the busy row's: batched with a
    # drafter, whose control has not measured plain steps faster at one row)
    if name != "tiny":  # sliding-window or recurrent layers: a pass per segment, as before
        assert own == [[32], [8], [10], [9]]
        return
    assert own == [[32], [27]]  # checkpoints at 40 and 50, the prompt's end less one at 59
    stored = {len(k): s.prefix.ram.cache_at(k) for k in s.prefix.ram._lru
              if list(k) == req.prompt[:len(k)]}
    assert {40, 50, 59} <= set(stored)
    whole = stored[59]
    assert len(whole) == layers  # (an MTP head's layer stays out of every entry)
    for n in (40, 50):  # sliced from the pass that ran on to 59: exactly its first n slots
        assert len(stored[n]) == layers
        for got, full in zip(stored[n], whole, strict=True):
            assert got.offset == n and got.keys.shape[2] == n
            assert mx.array_equal(got.keys, full.keys[..., :n, :]).item()
            assert mx.array_equal(got.values, full.values[..., :n, :]).item()
    # and that pass's KV is the prompt's, against one pass over all 59 tokens, which sums
    # in another order; on CUDA MLX multiplies float32 in TF32 (MLX_ENABLE_TF32, on by
    # default: 10-bit mantissas), where passes of other lengths differed by ~2e-4 (H200)
    ref = make_prompt_cache(model)
    model(mx.array([req.prompt[:59]]), cache=ref)
    tol = 1e-4 if mx.default_device() == mx.cpu else 2e-3
    for got, want in zip(whole, ref, strict=True):
        assert mx.allclose(got.keys, want.keys[..., :59, :], atol=tol).item()
        assert mx.allclose(got.values, want.values[..., :59, :], atol=tol).item()
    assert rows["r"].tokens == _cold(model, tok, req)
    s.prefix.check_integrity()


@pytest.mark.parametrize("draft", ["mtp", "model"])
def test_a_drafter_rows_entries_hold_the_models_layers_and_extend_as_deltas(loaded, draft,
                                                                           monkeypatch):
    """A drafter's rows store the model's layers only: a draft model's KV lags while its row
    decodes plainly and an MTP head's holds a pair a token, so an entry with them was never a
    delta over its parent (a CPU agents run stored 1.1 GB whole with either, against
    draft=none's 0.17 GB as deltas). A row's next turn, a hit on its last, is stored as a
    delta with no bit-for-bit comparison (its model layers are built on the hit, whatever
    the drafter did), and reads draft=none's tokens, speculating every step (the drafter
    starts empty after the hit)."""
    import mlx.core as mx

    from appliance.engine.speculate import Control, ModelDrafter, MTPDrafter
    from appliance.models.mtp import MTPHead

    name, model, tok = loaded
    if draft == "mtp" and name == "tiny-gemma3":
        pytest.skip("no MTP head layout for gemma3 (appliance.models.mtp)")
    mx.random.seed(0)
    drafter = (MTPDrafter(MTPHead.for_model(model), model, 16) if draft == "mtp" else
               ModelDrafter(oracle.load(oracle.model_path("tiny-llama"), "float32")[0], 16))
    s = ContinuousScheduler(model, set(tok.eos_token_ids), 4, 32,
                            Budget(1 << 40, KVShape(1, 0, 0, 0)),
                            prefix=PrefixCache(ram=RamTier(1 << 30)), drafter=drafter,
                            control=Control(2, False))
    trusted, insert = [], s.prefix.insert
    monkeypatch.setattr(s.prefix, "insert", lambda tokens, cache, **kw: (
        trusted.append(bool(kw.get("trusted"))), insert(tokens, cache, **kw))[1])
    ids = oracle.batch_prompts(tok)
    first = GenerationRequest(ids["b"][:40] + ids["a"][:10], 8, checkpoints=(40,))
    one = Collector(first)
    drive(s, [(0, "insert", "r")], {"r": one})
    nxt = GenerationRequest(first.prompt + one.tokens + ids["c"][:12], 8,
                            checkpoints=(40, len(first.prompt) + len(one.tokens)))
    two, spec = Collector(nxt), s._batch.spec_ticks
    drive(s, [(0, "insert", "r")], {"r": two})
    assert s._batch.spec_ticks > spec  # the second turn speculated too
    assert two.finished.cached_tokens >= len(first.prompt)  # a hit on the first turn
    layers = len(s._batch.scheme.make_cache(model))
    assert all(len(e.cache) == layers for e in s.prefix.ram._lru.values())
    if name == "tiny":  # (a hybrid model's recurrent state is stored whole: no deltas)
        assert s.prefix.ram.stats.deltas >= 2 and trusted[-1]  # the second turn's too
    assert two.tokens == _cold(model, tok, nxt)
    s.prefix.check_integrity()


def test_a_lone_rows_pass_on_the_cuda_grid_is_token_exact(loaded, monkeypatch):
    """The CUDA shape policy, run on CPU: a lone native row's pass starts at a multiple
    of GRID (its cache steps back, the tokens in between are fed again), right-padded to
    `prefill_width` over a whole-step buffer, its padding trimmed after. Tokens equal the
    exact-shape path's, on a prefix hit that ends off the grid."""
    from appliance.engine import prefill as prefill_mod

    name, model, tok = loaded
    _, busy, req = _two_rows(model, tok)
    hit = GenerationRequest(req.prompt[:50] + oracle.batch_prompts(tok)["d"][:13], 6,
                            checkpoints=(40, 50))
    want = {}
    for row, r in (("busy", busy), ("r", req), ("hit", hit)):
        want[row] = _cold(model, tok, r)
    cuda_shape_policy(monkeypatch)
    monkeypatch.setattr(prefill_mod, "GRID", 16)
    fed = []
    grid_pass = prefill_mod.Prefill._grid_pass

    def record(self, chunk):
        start = len(self.batch.tokens[0]) - len(chunk)
        fed.append((start - start % 16, len(chunk) + start % 16))
        grid_pass(self, chunk)
        assert all(c.keys.shape[2] % c.step == 0 and c._idx == len(self.batch.tokens[0])
                   for c in self.batch.layers)

    monkeypatch.setattr(prefill_mod.Prefill, "_grid_pass", record)
    s, _, _ = _two_rows(model, tok)
    rows = {n: Collector(r) for n, r in (("busy", busy), ("r", req), ("hit", hit))}
    drive(s, [(0, "insert", "busy"), (3, "insert", "r"), (12, "insert", "hit")], rows)
    assert {n: c.tokens for n, c in rows.items()} == want
    assert rows["hit"].finished.cached_tokens == 50  # r's checkpoint at 50
    # the hit's tail from 48 on the grid: 2 fed again + 12 new (full attention only)
    assert ((48, 14) in fed) == (name == "tiny") and (bool(fed) == (name == "tiny"))


def test_a_hit_takes_the_first_slots_of_an_entry_that_parts_later():
    """A prompt that shares more of a stored entry than any whole entry holds (an agent's
    next turn re-tokenizes its last reply, which parts from the tokens it generated) hits
    that entry's first slots: exactly a cache of those tokens, in buffers of its own; its
    chain (for the row's later entries, `trusted`) is the entries wholly inside it. Only
    past a whole entry's hit."""
    import mlx.core as mx

    tier = RamTier(1 << 30)
    system, turn = list(range(1, 41)), list(range(1, 41)) + list(range(100, 120))
    got = tier.insert(system, _kv(system))
    tier.insert(turn, _kv(turn), trusted=got)  # a delta over the system prompt
    assert tier.stats.deltas == 1
    nxt = turn[:50] + [999] * 10  # parts from the turn at 50, inside its delta
    n, cache = tier.lookup(nxt)
    assert n == 50 and tier.hit_chain == tier.serials(tuple(system))
    for c, want in zip(cache, _kv(nxt[:50]), strict=True):
        assert c.offset == c.keys.shape[2] == 50
        assert mx.array_equal(c.keys, want.keys[..., :50, :]).item()
        assert mx.array_equal(c.values, want.values[..., :50, :]).item()
    assert all(c.offset == 20 for c in tier._lru[tuple(turn)].cache)  # the delta, untouched
    assert tier.lookup(system + [7, 8])[0] == 40  # a whole entry, as before
    # only past a whole entry's hit (a new conversation's template tokens hit nothing)
    assert tier.lookup(turn[:39] + [5, 6])[0] == 0
    tier.check_integrity()


def test_an_agents_next_turn_hits_its_last_reply_up_to_where_it_parts(loaded):
    """The next turn's prompt holds the last reply as far as its re-tokenization agrees
    with the tokens generated, then parts: the hit runs to there where the entry's layers
    can be cut (full attention), to the last whole entry otherwise (a window, recurrent
    state); the text is a cold run's either way."""
    name, model, tok = loaded
    ids = oracle.batch_prompts(tok)
    first = GenerationRequest(ids["b"][:40] + ids["a"][:10], 8, checkpoints=(40,))
    s, one = _sched(model, tok), Collector(first)
    drive(s, [(0, "insert", "r")], {"r": one})
    reply = one.tokens[:4] + [(one.tokens[4] + 1) % 200 + 3]  # parts at the reply's 5th
    nxt = GenerationRequest(first.prompt + reply + ids["c"][:12], 8,
                            checkpoints=(40, len(first.prompt)))
    two = Collector(nxt)
    drive(s, [(0, "insert", "r")], {"r": two})
    cut = name == "tiny"  # (gemma3's sliding layers and qwen3-next's recurrent ones: no)
    assert two.finished.cached_tokens == len(first.prompt) + (4 if cut else 0) - (not cut)
    assert two.tokens == _cold(model, tok, nxt)
    s.prefix.check_integrity()


def _kv(tokens, layers=2, bump=None):
    """A row cache whose slot i is a function of tokens[:i + 1] (as a model's KV is); `bump`:
    a slot whose value is off in the last bits (a prefix computed beside a stored one)."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import KVCache

    h, slots = 0, []
    for t in tokens:
        h = (h * 31 + t + 1) % 1009
        slots.append(h)
    base = np.array(slots, np.float32).reshape(1, 1, -1, 1) * np.ones((1, 2, 1, 3), np.float32)
    if bump is not None:
        base[0, 0, bump, 0] = np.nextafter(base[0, 0, bump, 0], np.float32(1e9))
    out = []
    for layer in range(layers):
        c = KVCache()
        room = np.zeros((1, 2, len(tokens) + 5, 3), np.float32)  # a buffer with spare slots
        room[..., :len(tokens), :] = base + layer
        c.state = (mx.array(room), mx.array(-room), len(tokens))
        out.append(c)
    return out


def test_an_entry_built_from_a_hit_extends_it_without_a_comparison(monkeypatch):
    """A row's KV built from a hit holds the stored slots bit for bit (its provenance,
    `trusted`): the entry it stores next is a delta over them, with no comparison (~3% of
    the engine's time on CPU), and its row may trust that one in turn. Without provenance
    the slots are compared, and a prefix off in one bit is stored whole."""
    import mlx.core as mx

    tier = RamTier(cap_bytes=1 << 20)
    prompt, turn, more = list(range(1, 13)), list(range(1, 21)), list(range(1, 29))
    tier.insert(prompt, _kv(prompt))
    assert tier.lookup(turn)[0] == len(prompt)
    trusted, compared, equal = tier.hit_chain, [], mx.array_equal
    monkeypatch.setattr(mx, "array_equal", lambda *a: compared.append(1) or equal(*a))
    got = tier.insert(turn, _kv(turn), trusted=trusted)
    assert not compared and tier._lru[tuple(turn)].parent == tuple(prompt) and trusted < got
    tier.insert(more, _kv(more), trusted=got)  # a row's own earlier entry: trusted too
    assert not compared and tier._lru[tuple(more)].parent == tuple(turn)
    for key in (turn, more):
        for g, want in zip(tier.cache_at(tuple(key)), _kv(key), strict=True):
            assert equal(g.keys[..., :len(key), :], want.keys[..., :len(key), :]).item()
    beside = list(range(1, 13)) + [40, 41]  # computed beside the stored prompt: compared
    tier.insert(beside, _kv(beside, bump=3))
    assert compared and tier._lru[tuple(beside)].parent is None
    tier.check_integrity()


def test_entries_that_extend_stored_ones_hold_only_their_new_slots():
    """Random branching conversations into a tier with a tight cap: an entry over a stored
    prefix holds only its new slots, and only over a prefix whose KV is its own bit for bit
    (one differing in a bit is stored whole); every stored key's joined cache is exactly
    what was inserted for it; eviction takes leaves only; the tier stays consistent."""
    import random

    import mlx.core as mx

    rng = random.Random(0)
    tier = RamTier(cap_bytes=40_000)
    inserted: dict[tuple, list] = {}
    convs = [[rng.randrange(50) for _ in range(12)]]  # a shared system prompt
    deltas = differing = 0
    for step in range(300):
        base = rng.choice([c for c in convs if len(c) < 48])
        toks = list(base) + [rng.randrange(50) for _ in range(rng.randrange(1, 9))]
        if rng.random() < 0.5:
            convs.append(toks)
        bump = rng.randrange(len(toks)) if rng.random() < 0.15 else None
        cache = _kv(toks, bump=bump)
        key, stored_under, before = tuple(toks), tier._trie.longest(toks[:-1]), tier.stats.deltas
        new = key not in tier._lru  # (a key already stored keeps its entry)
        if new:
            inserted[key] = [(c.keys[..., :len(toks), :], c.values[..., :len(toks), :])
                             for c in _kv(toks, bump=bump)]
        tier.insert(toks, cache)
        tier.check_integrity()
        if tier.stats.deltas == before + 1:
            deltas += 1
            e = tier._lru[key]
            p = len(e.parent)
            assert e.cache[0].keys.shape[2] == len(toks) - p
            # shared only where the parent holds exactly this entry's own first slots
            for (pk, pv), (k, v) in zip(inserted[e.parent], inserted[key], strict=True):
                assert mx.array_equal(pk, k[..., :p, :]).item()
                assert mx.array_equal(pv, v[..., :p, :]).item()
        elif new and key in tier._lru and bump is not None and bump < stored_under:
            differing += 1  # its first slots differ from the stored prefix's: whole
        for key in rng.sample(list(tier._lru), min(3, len(tier._lru))):
            got = tier.cache_at(key)
            assert all(g.offset == len(key) for g in got)
            for g, (k, v) in zip(got, inserted[key], strict=True):
                n = len(key)  # (a whole entry keeps its buffer's spare slots)
                assert mx.array_equal(g.keys[..., :n, :], k).item()
                assert mx.array_equal(g.values[..., :n, :], v).item()
        if step % 7 == 0:
            n, hit = tier.lookup(toks + [0])
            assert n == len(toks) or tuple(toks) not in tier._lru
    assert deltas > 50 and differing > 5 and tier.stats.evictions > 50
    tier.trim(0)
    assert len(tier) == 0 and tier.nbytes == 0 and tier._trie.empty()
