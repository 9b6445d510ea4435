"""The SSD tier: restart, fingerprint namespace, corruption, a disk that fails."""

from __future__ import annotations

import errno
import logging
import os
import time

import pytest
from conftest import app_for
from harness import Collector, drive

from appliance import oracle
from appliance.engine import GenerationRequest
from appliance.engine.budget import Budget, KVShape
from appliance.engine.continuous import ContinuousScheduler
from appliance.engine.prefix_cache import PrefixCache, RamTier
from appliance.engine.ssd_tier import SsdTier

FP = "fp_test"


MODELS = ("tiny", "tiny-qwen3-next")  # the `loaded` fixture runs over these


def _process(model, tok, root, fingerprint=FP, ram=True, ceiling=None, scheme=None):
    """What a fresh appliance process has: an empty RAM tier, the SSD tier on `root`."""
    start = scheme.start if scheme is not None else 0  # (as build.py passes kv.start)
    prefix = PrefixCache(ram=RamTier(1 << 30, encoded_from=start) if ram else None,
                         ssd=SsdTier(root, 1 << 30, fingerprint, encoded_from=start))
    return ContinuousScheduler(model, set(tok.eos_token_ids), 4, 32,
                               Budget(1 << 40, KVShape(1, 0, 0, 0)), prefix=prefix,
                               ceiling=ceiling, scheme=scheme)


def _reqs(tok):
    ids = oracle.batch_prompts(tok)
    system = ids["b"][:40]
    return (GenerationRequest(system + ids["a"][:20], 10, checkpoints=(40,)),
            GenerationRequest(system + ids["c"][:15], 10, checkpoints=(40,)))


def _run(s, req):
    c = Collector(req)
    drive(s, [(0, "insert", "r")], {"r": c})
    return c


def _cold(model, tok, req, tmp_path, scheme=None):
    s = _process(model, tok, tmp_path / "cold", ram=False, scheme=scheme)
    tokens = _run(s, req).tokens
    s.close()  # its writer must not outlive the test (others patch os.fsync)
    return tokens


def test_prefixes_survive_a_restart(loaded, tmp_path):
    _, model, tok = loaded
    first, second = _reqs(tok)
    a = _process(model, tok, tmp_path)
    _run(a, first)
    a.abort_all()
    a.close()  # graceful shutdown: pending SSD writes finish
    assert a.prefix.ssd.stats()["entries"] >= 2 and a.prefix.ssd.backlog() == 0
    assert (a.prefix.ssd.hits, a.prefix.ssd.misses) == (0, 1)  # found nowhere: a miss there too

    b = _process(model, tok, tmp_path)  # a new process: nothing in RAM
    got = _run(b, second)
    assert got.finished.cached_tokens == 40
    assert b.prefix.ssd.hits == 1 and b.prefix.ssd.dropped == 0 and b.prefix.ssd.misses == 0
    assert got.tokens == _cold(model, tok, second, tmp_path)
    b.close()


def test_a_re_sent_prompt_hits_its_turn_after_a_restart(loaded, tmp_path):
    """A prompt with no checkpoints (a completions request) leaves only its whole turn on
    SSD: re-sent after a restart, its prefix is that turn's first slots, as a RAM lookup
    takes them (it was prefilled again). Only over KV layers: the hybrid model's entry
    (recurrent state) cannot be cut, and stays a miss."""
    name, model, tok = loaded
    req = GenerationRequest(oracle.batch_prompts(tok)["b"][:40], 10)
    a = _process(model, tok, tmp_path)
    _run(a, req)
    a.close()
    b = _process(model, tok, tmp_path)
    got = _run(b, req)
    cut = name == "tiny"
    assert got.finished.cached_tokens == (len(req.prompt) - 1 if cut else 0)
    assert (b.prefix.ssd.hits, b.prefix.ssd.dropped) == ((1 if cut else 0), 0)
    assert got.tokens == _cold(model, tok, req, tmp_path)
    b.close()


def test_an_entry_s_first_slots_are_read_only_where_its_blob_is_used_half(tmp_path):
    """A longer SSD entry serves a prompt's prefix where that prompt shares more of it than
    any whole entry gives, reading only the blobs the prefix needs, the last one cut; a
    few shared tokens of a long blob (a chat template's) read nothing."""
    import numpy as np

    turn, longer = list(range(1, 61)), list(range(1, 101))
    ssd = SsdTier(tmp_path, 1 << 30, FP)
    ssd.put(turn, _layers_for(turn))
    ssd.step_started()  # (the second extends the first while it is queued: a delta)
    ssd.put(longer, _layers_for(longer))
    ssd.close()
    ssd = SsdTier(tmp_path, 1 << 30, FP)
    cache = PrefixCache(ram=RamTier(1 << 30), ssd=ssd)
    n, got = cache.lookup(list(range(1, 81)) + [500])  # 80 of `longer`: 20 of its 40-token delta
    assert n == 80 and ssd.hits == 1
    assert np.array_equal(np.array(got[1].keys[0, 0, :, 0]), np.arange(1, 81) + 1)
    n, got = cache.lookup(list(range(1, 71)) + [500])  # 10 of the delta's 40: the turn only
    assert n == 60 and ssd.hits == 2 and got[0].keys.shape[2] == 60
    assert cache.lookup(list(range(1, 13)) + [500])[0] == 0  # 12 of the turn's 60: no read
    assert ssd.hits == 2 and ssd.dropped == 0
    ssd.close()


def _turns(model, tok, tmp_path):
    """Two turns of one conversation, each in a process of its own: the second turn's
    prompt extends the first turn's whole text (prompt and reply), as an agent's does; and
    the third turn's request."""
    first, _ = _reqs(tok)
    a = _process(model, tok, tmp_path)
    reply = _run(a, first).tokens
    a.close()
    ids = oracle.batch_prompts(tok)["d"][:12]
    second = GenerationRequest([*first.prompt, *reply, *ids], 10,
                               checkpoints=(40, len(first.prompt)))
    b = _process(model, tok, tmp_path)
    reply = _run(b, second).tokens
    b.close()
    third = GenerationRequest([*second.prompt, *reply, *ids[:5]], 10)  # (over both turns)
    return first, third, b.prefix.ssd


def test_a_turn_that_extends_a_stored_one_is_written_as_its_new_tokens(loaded, tmp_path):
    """On CPU, writing every turn's whole prefix cost an agents run 3-13% (25th session).
    A turn over a stored prefix is written as the KV of its new tokens, over that entry;
    a restart reads the chain and joins it, token-exact with a cold run. Where a layer is
    not a plain KVCache (a hybrid model's recurrent state), the entry is written whole."""
    name, model, tok = loaded
    first, third, ssd = _turns(model, tok, tmp_path)
    metas = sorted(ssd._meta.values(), key=lambda m: len(m["tokens"]))
    last = metas[-1]
    per_token = {len(m["tokens"]): m["nbytes"] / len(m["tokens"]) for m in metas
                 if "parent" not in m}
    if name == "tiny-qwen3-next":  # (recurrent state: no deltas)
        assert not any("parent" in m for m in metas)
        return
    assert last["parent"] and last["start"] > len(first.prompt) and last["depth"] >= 1
    whole = max(per_token.values()) * len(last["tokens"])
    assert last["nbytes"] < whole * (len(last["tokens"]) - last["start"] + 16) \
        / len(last["tokens"])  # its new tokens' KV (and the blob's header), not the whole
    c = _process(model, tok, tmp_path)  # a new process: nothing in RAM, the chain on SSD
    got = _run(c, third)
    assert got.finished.cached_tokens == len(last["tokens"]) and c.prefix.ssd.hits == 1
    assert got.tokens == _cold(model, tok, third, tmp_path)
    c.close()


def test_a_bad_base_drops_the_entries_built_on_it(loaded, tmp_path, caplog):
    """A corrupt blob under a chain: the hit is never served, the entries over it go with
    it (a restart finds every entry's base), and the prefix computed again is stored."""
    name, model, tok = loaded
    if name != "tiny":
        pytest.skip("chains are of KVCache layers")
    _, third, ssd = _turns(model, tok, tmp_path)
    last = max(ssd._meta.values(), key=lambda m: len(m["tokens"]))
    base = ssd._meta[last["parent"]]
    path = tmp_path / FP / "blobs" / base["file"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    d = _process(model, tok, tmp_path)
    with caplog.at_level(logging.WARNING):
        got = _run(d, third)
    assert got.tokens == _cold(model, tok, third, tmp_path)
    assert got.finished.cached_tokens < len(base["tokens"]) and d.prefix.ssd.dropped == 1
    d.close()
    d.prefix.ssd.check_integrity()  # every entry's base is there
    assert last["file"] not in {m["file"] for m in d.prefix.ssd._meta.values()}
    assert max(len(m["tokens"]) for m in d.prefix.ssd._meta.values()) > len(third.prompt)
    e = _process(model, tok, tmp_path)  # (the turn computed again, stored)
    e.prefix.ssd.check_integrity()
    assert e.prefix.ssd._meta.keys() == d.prefix.ssd._meta.keys()
    e.close()


def test_an_entry_whose_base_was_lost_is_not_restored(loaded, tmp_path):
    """A crash between a base's removal and its children's (or a lost index row): at the
    next start an entry whose chain is broken is dropped, blob and row."""
    name, model, tok = loaded
    if name != "tiny":
        pytest.skip("chains are of KVCache layers")
    _, _, ssd = _turns(model, tok, tmp_path)
    last_key = max(ssd._meta, key=lambda k: len(ssd._meta[k]["tokens"]))
    ssd._index.delete(ssd._meta[last_key]["parent"])  # the base's row, lost
    f = _process(model, tok, tmp_path)
    assert last_key not in f.prefix.ssd._meta and last_key not in f.prefix.ssd._index
    assert not (tmp_path / FP / "blobs" / ssd._meta[last_key]["file"]).exists()
    f.prefix.ssd.check_integrity()
    f.close()


def _layers_for(tokens: list[int]) -> list:
    """Two KVCache layers as a live row holds them (a 256-slot buffer), whose slot i encodes
    tokens[i]: any chain a hit joins can be checked slot by slot."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    t = mx.array(tokens, dtype=mx.float32)
    out = []
    for layer in range(2):
        c = KVCache()
        k = mx.broadcast_to(t[None, None, :, None] + layer, (1, 2, len(tokens), 8))
        c.update_and_fetch(k, -k)
        mx.eval(c.keys, c.values)
        out.append(c)
    return out


def _settled(tier) -> None:
    deadline = time.monotonic() + 30
    while tier.backlog() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_chains_hold_under_branching_turns_evictions_corruption_and_restarts(tmp_path):
    """Conversations that branch and grow turn by turn, a byte cap that evicts, blobs
    corrupted on disk: every entry's base is there, every hit joins its chain into exactly
    the stored slots or is refused (its blob or a base's is bad), and a restart finds the
    same entries."""
    import random

    import numpy as np

    rng, bad = random.Random(0), set()
    tier = SsdTier(tmp_path, 48_000, FP)
    for step in range(60):
        live = [m["tokens"] for m in tier._meta.values()]
        base = rng.choice(live) if live and rng.random() < 0.8 else []
        tokens = [*base, *(rng.randrange(1, 4000) for _ in range(rng.randrange(4, 24)))]
        tier.put(tokens, _layers_for(tokens))
        _settled(tier)
        if step % 9 == 8:  # a blob goes bad on disk
            key = rng.choice(sorted(tier._meta))
            path = tmp_path / FP / "blobs" / tier._meta[key]["file"]
            data = bytearray(path.read_bytes())
            data[-5] ^= 0xFF
            path.write_bytes(bytes(data))
            bad.add(key)
        bad &= set(tier._meta)  # (an evicted bad blob is gone; its prefix may come back)
        tier.check_integrity()
    assert tier.evictions and any("parent" in m for m in tier._meta.values())

    def check(t) -> int:
        served = 0
        for key, meta in sorted(t._meta.items()):
            if key not in t._meta:
                continue  # dropped with a bad base earlier in this loop
            chain = {k for k, _ in t._chain(key)}
            got = t.load(meta["tokens"], len(meta["tokens"]))
            _settled(t)
            if chain & bad:
                assert got is None and key not in t._meta
                continue
            assert got is not None, key
            for layer, c in enumerate(got):
                want = np.array(meta["tokens"], dtype=np.float32) + layer
                assert c.offset == len(meta["tokens"])
                assert np.array_equal(np.array(c.keys[0, 1, :, 3]), want)
                assert np.array_equal(np.array(c.values[0, 0, :, 7]), -want)
            served += 1
        t.check_integrity()
        return served

    child = max(tier._meta, key=lambda k: tier._meta[k].get("depth", 0))
    base = tier._meta[child]["parent"]  # and a base under the deepest chain goes bad
    path = tmp_path / FP / "blobs" / tier._meta[base]["file"]
    path.write_bytes(path.read_bytes()[:-3])
    bad.add(base)
    assert check(tier) and tier.dropped and child not in tier._meta
    tier.close()
    again = SsdTier(tmp_path, 48_000, FP)  # a restart
    assert again._meta.keys() == tier._meta.keys() and check(again) == len(again._meta)
    again.close()


def test_an_entry_larger_than_the_cap_counts_as_skipped(tmp_path):
    """With cache.ssd.bytes=1MiB a probe's entries vanished from the counters: neither
    written nor skipped. An entry bigger than the whole tier is now counted as skipped."""
    tier = SsdTier(tmp_path, 1_000, FP)
    tier.put(list(range(1, 41)), _layers_for(list(range(1, 41))))
    tier.close()
    assert (tier.writes, tier.skipped, len(tier._meta)) == (0, 1, 0)
    assert tier.stats()["skipped"] == 1


def test_one_server_a_directory(tmp_path, caplog):
    """Two servers on one cache.ssd.path: the second's start deleted the first's half-written
    blobs as crash leftovers (a probe), and each counted the cap alone. The second now runs
    without the tier, saying why; once the first closes, the directory is free again."""
    first = SsdTier(tmp_path, 1 << 30, FP)
    first.put([1, 2, 3], _layers_for([1, 2, 3]))
    second = SsdTier(tmp_path, 1 << 30, FP)
    assert first.disabled is None
    assert "another appliance process uses it" in second.disabled
    assert "SSD prefix cache disabled" in caplog.text
    second.close()
    first.close()
    third = SsdTier(tmp_path, 1 << 30, FP)
    assert third.disabled is None and len(third._meta) == 1
    third.close()


def test_a_turn_extends_a_prefix_still_queued_for_the_disk(tmp_path):
    """Agents arriving together end their first turns before the shared prompt's blob has
    landed: a turn extends the queued prompt (written first, one queue), and a restart
    joins the chain; if that base is never written, the turn is not written either."""
    import numpy as np

    prompt, turn = list(range(1, 41)), list(range(1, 61))
    tier = SsdTier(tmp_path, 1 << 30, FP)
    tier.step_started()  # a busy engine: nothing is written yet
    tier.put(prompt, _layers_for(prompt))
    tier.put(turn, _layers_for(turn))
    tier.close()
    metas = {len(m["tokens"]): m for m in tier._meta.values()}
    assert metas[60]["parent"] and metas[60]["start"] == 40 and metas[60]["depth"] == 1
    again = SsdTier(tmp_path, 1 << 30, FP)
    got = again.load(turn, 60)
    assert np.array_equal(np.array(got[1].keys[0, 0, :, 0]), np.arange(1, 61) + 1)
    again.close()

    # a cap the prompt's blob (40 tokens) is over and the turn's delta (20) is not
    other = SsdTier(tmp_path / "other", metas[40]["nbytes"] - 1, FP)
    other.step_started()
    other.put(prompt, _layers_for(prompt))
    other.put(turn, _layers_for(turn))
    other.close()
    assert metas[60]["nbytes"] < metas[40]["nbytes"] and not other._meta
    assert not list((tmp_path / "other" / FP / "blobs").iterdir())


def test_a_turn_extends_only_an_entry_of_as_many_layers(tmp_path):
    """With a draft, a solo row's entry holds the model's layers and a batched row's the
    drafter's too: a turn over an entry of another layer count is written whole, and both
    load back as they were stored (queued or written)."""
    import numpy as np

    prompt, turn, longer = list(range(1, 41)), list(range(1, 61)), list(range(1, 81))
    tier = SsdTier(tmp_path, 1 << 30, FP)
    tier.step_started()  # the turn meets the prompt still queued
    tier.put(prompt, _layers_for(prompt) + _layers_for(prompt))  # 4 layers
    tier.put(turn, _layers_for(turn))  # 2
    tier.close()
    tier = SsdTier(tmp_path, 1 << 30, FP)
    tier.put(longer, _layers_for(longer)[:1])  # 1, over the written turn
    tier.close()
    metas = {len(m["tokens"]): m for m in tier._meta.values()}
    assert not any(m.get("parent") for m in metas.values())
    again = SsdTier(tmp_path, 1 << 30, FP)
    for toks, n in ((prompt, 4), (turn, 2), (longer, 1)):
        got = again.load(toks, len(toks))
        assert len(got) == n
        assert np.array_equal(np.array(got[0].keys[0, 0, :, 0]), np.array(toks))
    again.close()


@pytest.mark.parametrize("codec", ["k8v4", "turboquant"])
def test_encoded_prefixes_survive_a_restart_and_equal_a_cold_run(loaded, tmp_path, codec):
    """A quantized scheme's blobs hold its codes (never re-encoded) and load as them."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    from appliance.engine.kv import Scheme
    from appliance.engine.kv.affine import AffineCodec
    from appliance.engine.kv.quantized import QuantRowCache
    from appliance.engine.kv.turboquant import TurboCodec

    _, model, tok = loaded
    layers = make_prompt_cache(model)
    full = tuple(i for i, c in enumerate(layers) if type(c) is KVCache)
    model(mx.array([[1]]), cache=layers)
    dim = layers[full[0]].keys.shape[-1]  # the head size
    if codec == "k8v4" and dim % 32:
        pytest.skip(f"head_dim {dim}: no affine group size divides it (the plan refuses)")
    make = {"k8v4": lambda: AffineCodec(32, 8, 4), "turboquant": lambda: TurboCodec(dim, 4, 4)}
    scheme = Scheme(make[codec](), full)
    first, second = _reqs(tok)
    a = _process(model, tok, tmp_path, scheme=scheme)
    _run(a, first)
    a.abort_all()
    a.close()
    b = _process(model, tok, tmp_path, scheme=scheme)
    restored = b.prefix.ssd.load(list(second.prompt), 40)
    assert any(isinstance(c, QuantRowCache) for c in restored)
    got = _run(b, second)
    assert got.finished.cached_tokens == 40 and b.prefix.ssd.dropped == 0
    assert got.tokens == _cold(model, tok, second, tmp_path, scheme)
    b.close()


@pytest.mark.parametrize("start", [16, 66])
def test_an_encoded_entry_s_first_slots_serve_a_prompt_from_kv_start_on(loaded, tmp_path,
                                                                       start):
    """Under TurboQuant an entry past kv.start holds codes, one per token: its first slots
    are a prefix's codes, so a prompt that shares more of it than any whole entry gives
    takes them: from RAM, the next turn to where its reply parts from the tokens generated
    (64), and from SSD after a restart, a re-sent prompt (59; RAM had its prompt end whole):
    the same tokens as that whole entry's. They were taken only where every layer was float
    KV: past kv.start the prompt prefilled again from its last whole entry. Below kv.start
    (64 or 59 tokens at kv.start 66) a row's KV is float, so an encoded entry is not cut
    there; recurrent state (the hybrid model) never is."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    from appliance.engine.kv import Scheme
    from appliance.engine.kv.quantized import QuantRowCache
    from appliance.engine.kv.turboquant import TurboCodec

    name, model, tok = loaded
    layers = make_prompt_cache(model)
    full = tuple(i for i, c in enumerate(layers) if type(c) is KVCache)
    model(mx.array([[1]]), cache=layers)
    scheme = Scheme(TurboCodec(layers[full[0]].keys.shape[-1], 4, 4), full, start=start)
    ids = oracle.batch_prompts(tok)
    req = GenerationRequest(ids["b"][:40] + ids["a"][:20], 10, checkpoints=(40,))
    a = _process(model, tok, tmp_path, scheme=scheme)
    reply = _run(a, req).tokens  # stores 40, the prompt end (59, RAM), the turn (69)
    turn = next(e.cache for k, e in a.prefix.ram._lru.items() if len(k) > 60)
    assert any(isinstance(c, QuantRowCache) for c in turn)  # encoded (69 >= kv.start)
    again = _run(a, req)  # re-sent: the prompt end, whole
    nxt = GenerationRequest(req.prompt + reply[:4] + [(reply[4] + 1) % 200 + 3] + ids["c"][:8],
                            8, checkpoints=(40, 60))
    kv = name == "tiny"  # (the hybrid model's recurrent state is never cut)
    assert _run(a, nxt).finished.cached_tokens == (64 if kv and start <= 64 else 59)
    a.close()
    b = _process(model, tok, tmp_path, scheme=scheme)
    restarted = _run(b, req)  # re-sent after a restart: the turn's first 59, from SSD
    assert again.finished.cached_tokens == 59
    assert restarted.finished.cached_tokens == (59 if kv and start <= 59 else 40)
    assert b.prefix.ssd.hits == 1 and b.prefix.ssd.dropped == 0
    if restarted.finished.cached_tokens == 59:
        assert restarted.tokens == again.tokens
    b.close()


def test_when_the_writer_may_write():
    from appliance.engine.ssd_tier import MAX_DEFER_S, MAX_PENDING, QUIET_S, may_write

    now = 100.0
    assert not may_write(now, now, now, 0, False)  # the engine just stepped; a fresh entry
    assert not may_write(now, float("inf"), now, 0, False)  # a step is running (step_started)
    assert may_write(now, now - 2 * QUIET_S, now, 0, False)  # the engine went quiet
    assert may_write(now, now, now - 2 * MAX_DEFER_S, 0, False)  # steady load: waited enough
    assert may_write(now, now, now, MAX_PENDING // 2, False)  # the queue fills up
    assert may_write(now, now, now, 0, True)  # shutting down


def test_writes_wait_for_a_quiet_engine_and_count_as_backlog(loaded, tmp_path, monkeypatch):
    import appliance.engine.ssd_tier as ssd_mod

    monkeypatch.setattr(ssd_mod, "MAX_DEFER_S", 3600.0)
    _, model, tok = loaded
    first, _ = _reqs(tok)
    s = _process(model, tok, tmp_path, ram=False)
    ssd = s.prefix.ssd
    _run(s, first)
    s.prefix.step_started()  # a long step (a whole prefill is one) is not quiet
    time.sleep(10 * ssd_mod.QUIET_S)
    assert ssd.writes == 0 and ssd.backlog() == 2  # the system checkpoint and the turn
    ssd.note_step()  # the step ended; quiet from now on
    for _ in range(200):
        if ssd.writes == 2:
            break
        time.sleep(0.05)
    assert ssd.writes == 2 and ssd.backlog() == 0
    s.close()


def test_no_write_starts_while_a_step_runs(loaded, tmp_path, monkeypatch):
    """One step can be a whole prefill of seconds: the writer must not take it for quiet
    (it would then serialize beside that request's forward passes)."""
    import appliance.engine.ssd_tier as ssd_mod

    monkeypatch.setattr(ssd_mod, "MAX_DEFER_S", 3600.0)
    _, model, tok = loaded
    first, second = _reqs(tok)
    s = _process(model, tok, tmp_path, ram=False)
    ssd = s.prefix.ssd
    _run(s, first)  # two entries wait for the writer
    seen = []

    class Slow:  # the model, each forward taking many quiet periods
        def __call__(self, *args, **kwargs):
            time.sleep(6 * ssd_mod.QUIET_S)
            seen.append(ssd.writes)
            return model(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(model, name)

    s.model = Slow()
    _run(s, second)
    assert len(seen) >= 2 and set(seen) == {0}, seen
    s.close()
    assert ssd.writes >= 2


def test_closing_writes_what_a_busy_engine_deferred(loaded, tmp_path, monkeypatch):
    import appliance.engine.ssd_tier as ssd_mod

    monkeypatch.setattr(ssd_mod, "MAX_DEFER_S", 3600.0)
    _, model, tok = loaded
    first, _ = _reqs(tok)
    s = _process(model, tok, tmp_path, ram=False)
    _run(s, first)
    s.prefix.step_started()  # still busy when the shutdown comes
    s.close()
    assert s.prefix.ssd.writes == 2 and s.prefix.ssd.stats()["entries"] == 2


def test_another_fingerprint_never_restores(loaded, tmp_path, caplog):
    _, model, tok = loaded
    first, second = _reqs(tok)
    a = _process(model, tok, tmp_path)
    _run(a, first)
    a.close()
    with caplog.at_level(logging.INFO, logger="appliance.engine.ssd_tier"):
        other = _process(model, tok, tmp_path, fingerprint="fp_other")
    assert "0 entries" in caplog.text and "1 other plan(s) have entries here" in caplog.text
    assert _run(other, second).finished.cached_tokens == 0
    assert other.prefix.ssd.hits == 0
    other.close()


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_blobs_are_dropped_with_a_warning(loaded, tmp_path, caplog, damage):
    _, model, tok = loaded
    first, second = _reqs(tok)
    a = _process(model, tok, tmp_path)
    _run(a, first)
    a.close()
    blobs = sorted((tmp_path / FP / "blobs").glob("*.safetensors"))
    assert blobs
    for blob in blobs:
        data = bytearray(blob.read_bytes())
        if damage == "truncate":
            blob.write_bytes(bytes(data[: len(data) // 2]))
        else:
            data[len(data) // 2] ^= 0xFF
            blob.write_bytes(bytes(data))
    b = _process(model, tok, tmp_path)
    with caplog.at_level(logging.WARNING):
        got = _run(b, second)
    assert got.finished.cached_tokens == 0  # never served
    assert got.tokens == _cold(model, tok, second, tmp_path)
    assert b.prefix.ssd.dropped == 1
    assert sum("dropping" in r.message for r in caplog.records) == 1
    b.close()
    # the bad blob was replaced by the prefix b computed again: the next process uses it
    c = _process(model, tok, tmp_path)
    assert _run(c, second).finished.cached_tokens >= 40 and c.prefix.ssd.dropped == 0
    c.close()


def test_unusable_directory_disables_the_tier(loaded, tmp_path, caplog):
    _, model, tok = loaded
    first, _ = _reqs(tok)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    with caplog.at_level(logging.WARNING):
        s = _process(model, tok, blocker)
    assert s.prefix.ssd.disabled and "disabled" in caplog.text
    assert _run(s, first).finished.reason.value in ("length", "stop")  # serving goes on
    s.close()


def test_full_disk_disables_the_tier(loaded, tmp_path, caplog, monkeypatch):
    _, model, tok = loaded
    first, second = _reqs(tok)
    import appliance.engine.ssd_tier as ssd_mod

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ssd_mod.os, "fsync", full)
    s = _process(model, tok, tmp_path)
    with caplog.at_level(logging.WARNING):
        _run(s, first)
        s.prefix.ssd.close()
    assert s.prefix.ssd.disabled and "No space left" in s.prefix.ssd.disabled
    assert caplog.text.count("SSD prefix cache disabled") == 1
    assert s.prefix.ssd.stats()["entries"] == 0


def test_a_write_that_hits_a_full_device_disables_the_tier(loaded, tmp_path, caplog):
    """The blob's temporary file is /dev/full: MLX's own write fails, as on a full disk."""
    from appliance.engine.ssd_tier import _key

    _, model, tok = loaded
    first, _ = _reqs(tok)
    s = _process(model, tok, tmp_path)
    blobs = s.prefix.ssd.dir / "blobs"
    for tokens in (first.prompt[:40], first.prompt):  # the system checkpoint, and any turn
        (blobs / f".tmp-{_key(tokens)}.safetensors").symlink_to("/dev/full")
    with caplog.at_level(logging.WARNING):
        got = _run(s, first)
        s.prefix.ssd.close()
    assert got.finished.reason.value in ("length", "stop")  # serving went on
    assert s.prefix.ssd.disabled and "write failed" in s.prefix.ssd.disabled
    assert caplog.text.count("SSD prefix cache disabled") == 1
    assert s.prefix.ssd.stats()["entries"] == 0


def test_restart_over_http(tmp_path):
    """Two real servers one after the other on one SSD directory: the second one's first
    request reuses the first one's prefix."""
    import httpx

    overrides = ["cache=tiered", f"cache.ssd.path={tmp_path}"]
    system = {"role": "system", "content": "You review Python patches carefully. " * 20}

    def ask(url, plan, q):
        body = {"model": plan.model.id, "max_tokens": 4,
                "messages": [system, {"role": "user", "content": q}]}
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()

    with app_for(overrides) as (plan, engine, url):
        cold = ask(url, plan, "def g(y):")
    with app_for(overrides) as (plan2, engine2, url2):
        warm = ask(url2, plan2, "def g(y):")
        ssd = httpx.get(f"{url2}/stats").json()["cache"]["ssd"]
    assert plan.fingerprint == plan2.fingerprint
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 100
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
    assert ssd["hits"] == 1 and ssd["disabled"] is None


def test_a_foreign_blob_with_a_consistent_index_row_is_not_served(loaded, tmp_path, caplog):
    """Another plan's blob copied over one of ours, index row and all (so the checksum
    matches): its metadata names the other fingerprint, and it is dropped."""
    from appliance.engine.ssd_tier import checksums

    _, model, tok = loaded
    first, second = _reqs(tok)
    for fp in (FP, "fp_other"):
        s = _process(model, tok, tmp_path, fingerprint=fp)
        _run(s, first)
        s.close()
    ours, theirs = tmp_path / FP, tmp_path / "fp_other"
    import diskcache

    index = diskcache.Cache(str(ours / "index"))
    for key in list(index):
        meta = index[key]
        data = (theirs / "blobs" / meta["file"]).read_bytes()
        (ours / "blobs" / meta["file"]).write_bytes(data)
        crcs = checksums(theirs / "blobs" / meta["file"], len(data))
        index[key] = {**meta, "nbytes": len(data), "crcs": crcs}
    index.close()
    b = _process(model, tok, tmp_path)
    with caplog.at_level(logging.WARNING):
        got = _run(b, second)
    assert got.finished.cached_tokens == 0 and b.prefix.ssd.dropped == 1
    assert "another plan" in caplog.text
    b.close()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_server_gracefully(tmp_path, sig):
    """`appliance` as a process: SIGTERM or Ctrl-C after a request ends it only after the
    engine stopped and the SSD tier closed (its queue written out)."""
    import signal
    import subprocess
    import sys

    import diskcache
    import httpx
    from conftest import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "appliance.cli", f"server.port={port}", "cache=ssd",
         f"cache.ssd.path={tmp_path}", "model.dtype=float32"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        body = {"model": "appliance-tiny", "max_tokens": 3, "messages": [
            {"role": "system", "content": "You are terse. " * 30},
            {"role": "user", "content": "def f(x):"}]}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        proc.send_signal(getattr(signal, sig))
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    # A clean exit: not killed by the signal before the SSD tier closed, and no abort at
    # interpreter shutdown from a thread that ran MLX (see appliance/engine/threads.py).
    assert proc.returncode == 0, out[-2000:]
    assert "SSD prefix cache closed: 2 entries on disk" in out, out[-2000:]
    assert "serve - stopped" in out, out[-2000:]
    (index,) = tmp_path.glob("fp_*/index")
    with diskcache.Cache(str(index)) as c:
        assert len(c) == 2  # the system prompt's checkpoint and the whole turn


def _kv_layers(n_tokens: int, seed: int) -> list:
    """Two layers of real mlx-lm KV caches holding exactly n_tokens (buffer == offset)."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    mx.random.seed(seed)
    out = []
    for _ in range(2):
        c = KVCache()
        kv = mx.random.normal((2, 1, 2, n_tokens, 8))
        c.update_and_fetch(kv[0], kv[1])
        c.keys = mx.contiguous(c.keys[..., :n_tokens, :])  # as a restored or trimmed entry's
        c.values = mx.contiguous(c.values[..., :n_tokens, :])
        mx.eval(c.keys, c.values)
        out.append(c)
    return out


def test_the_writer_serializes_one_buffer_of_its_own():
    """Never a view of a RAM-tier entry, and one buffer per blob: on CUDA, reading a buffer
    on the host moves it to managed memory (a device sync each time), and an entry's buffer
    moved that way would be paged back to the GPU on its next hit."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import ArraysCache

    from appliance.engine.ssd_tier import _frozen

    def span(a):
        start = np.asarray(a).__array_interface__["data"][0]
        return start, start + a.nbytes

    mixed = ArraysCache(3)  # odd sizes and mixed dtypes: every view must stay aligned
    mixed.state = [mx.arange(5, dtype=mx.uint8), mx.arange(3, dtype=mx.uint32),
                   mx.ones((2, 3), dtype=mx.float16)]
    layers = [*_kv_layers(16, 0), mixed]
    frozen = _frozen(layers)
    pairs = [(a, b) for c, f in zip(layers, frozen, strict=True)
             for a, b in zip(c.state, f.state, strict=True) if isinstance(a, mx.array)]
    assert len(pairs) == 7 and frozen[0].offset == 16
    for a, b in pairs:
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
        assert span(a)[1] <= span(b)[0] or span(b)[1] <= span(a)[0]  # a copy, not a view
    ends = sorted(span(b) for _, b in pairs)
    assert ends[-1][1] - ends[0][0] < sum(b.nbytes for _, b in pairs) + 16 * len(pairs)


def test_an_entry_over_2_gib_is_copied_for_the_writer():
    """MLX shape dimensions are 32-bit, and one long prefix of a large model is more than
    2 GiB (a 70B model's 8k-token prefix: 2.7 GB): its copy for the writer must still be
    made (it raised OverflowError, so such entries never reached the SSD)."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from appliance.engine.ssd_tier import _frozen

    if os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") < 16 << 30:
        pytest.skip("needs 16 GiB of memory (two copies of a 2.2 GiB entry)")
    layers = []
    for i in range(2):  # 2 layers x (K, V) x 560 MiB
        c = KVCache()
        c.keys = mx.full((1, 8, 35840, 1024), 2 * i + 1, dtype=mx.bfloat16)
        c.values = mx.full((1, 8, 35840, 1024), 2 * i + 2, dtype=mx.bfloat16)
        c.offset = 35840
        layers.append(c)
    mx.eval([c.state for c in layers])
    assert sum(c.nbytes for c in layers) > 2**31
    frozen = _frozen(layers)
    for i, f in enumerate(frozen):
        assert f.offset == 35840 and f.keys.shape == f.values.shape == (1, 8, 35840, 1024)
        for x, want in ((f.keys, 2 * i + 1), (f.values, 2 * i + 2)):
            assert x[0, 0, 0, 0].item() == x[0, -1, -1, -1].item() == want


def _wait_written(ssd: SsdTier, n: int) -> None:
    for _ in range(400):
        if ssd.writes >= n and ssd.backlog() == 0:
            return
        time.sleep(0.025)
    raise AssertionError(f"{ssd.writes} of {n} writes done")


def test_a_ram_hit_keeps_its_prefix_on_ssd_across_restarts(tmp_path):
    """LRU on SSD counts uses served from RAM too: the system prompt every agent hits from
    RAM must not be the first entry the SSD tier evicts (nor be forgotten at restart)."""
    blob = SsdTier(tmp_path / "probe", 1 << 30, FP)
    blob.put([1, 2], _kv_layers(64, 1))
    _wait_written(blob, 1)
    size = blob.nbytes
    blob.close()

    ssd = SsdTier(tmp_path, int(2.5 * size), FP)  # room for two entries
    cache = PrefixCache(ram=RamTier(1 << 30), ssd=ssd)
    system, other, third = [7] * 10, [8] * 10, [9] * 10
    for i, tokens in enumerate((system, other)):
        cache.insert(tokens, _kv_layers(64, 2 + i))
        cache.flush()
        _wait_written(ssd, i + 1)
    n, _ = cache.lookup(system + [1, 2])  # served from RAM
    assert n == len(system) and ssd.hits == 0
    cache.insert(third, _kv_layers(64, 4))
    cache.flush()
    _wait_written(ssd, 3)
    assert ssd.evictions == 1
    assert ssd.longest(system + [1]) == len(system)  # kept: used most recently but one
    assert ssd.longest(other + [1]) == 0  # the least recently used went
    cache.lookup(system + [3])  # served from RAM again: now newer than `third`
    cache.close()  # index rows of used entries are rewritten by then

    again = SsdTier(tmp_path, int(2.5 * size), FP)  # a restart keeps that order
    again.put(other, _kv_layers(64, 5))
    _wait_written(again, 1)
    assert again.longest(system + [1]) == len(system) and again.longest(third + [1]) == 0
    again.close()


def test_copies_waiting_for_the_ssd_count_against_the_memory_ceiling(loaded, tmp_path,
                                                                     monkeypatch):
    """One ceiling for live rows, the RAM tier and the copies the writer has yet to write:
    pending copies crowd RAM entries out, and an entry whose copy does not fit is skipped.
    (check_integrity asserts the ceiling after every step.)"""
    import appliance.engine.ssd_tier as ssd_mod

    monkeypatch.setattr(ssd_mod, "may_write", lambda now, last, queued, n, closing: closing)
    _, model, tok = loaded
    first, second = _reqs(tok)
    free = _process(model, tok, tmp_path / "free")
    _run(free, first)
    copies = free.prefix.pending_bytes
    assert copies > 0 and free.prefix.ssd.writes == 0 and free.prefix.ssd.skipped == 0
    free.close()
    assert free.prefix.ssd.writes == 2 and free.prefix.pending_bytes == 0

    cold = _cold(model, tok, second, tmp_path)
    for ceiling, skips in ((copies // 2, True), (4 * copies, False)):
        s = _process(model, tok, tmp_path / str(ceiling), ceiling=ceiling)
        _run(s, first)
        assert s.prefix.nbytes + s.prefix.pending_bytes <= ceiling
        assert (s.prefix.ssd.skipped > 0) == skips
        assert _run(s, second).tokens == cold  # whatever was kept, output is unchanged
        s.close()


def test_a_broken_index_disables_the_tier_and_frees_the_queue(loaded, tmp_path, caplog):
    """Any failure on the writer's side (here SQLite under diskcache) turns the tier off with
    one warning; the writer keeps draining, so queued copies do not hold memory for ever."""
    import sqlite3

    _, model, tok = loaded
    first, second = _reqs(tok)
    s = _process(model, tok, tmp_path)

    def broken(*a, **k):
        raise sqlite3.OperationalError("disk I/O error")

    s.prefix.ssd._index.set = broken
    with caplog.at_level(logging.WARNING):
        _run(s, first)
        got = _run(s, second)
        s.prefix.ssd.close()
    assert got.finished.reason.value in ("length", "stop")  # serving went on
    assert "OperationalError" in s.prefix.ssd.disabled
    assert caplog.text.count("SSD prefix cache disabled") == 1
    assert s.prefix.ssd.pending_bytes == 0 and s.prefix.ssd.backlog() == 0


def test_a_copy_that_fails_skips_the_entry_and_serving_goes_on(loaded, tmp_path, caplog,
                                                               monkeypatch):
    import appliance.engine.ssd_tier as ssd_mod

    def no_memory(cache, start=0):
        raise RuntimeError("[malloc] Unable to allocate 2.7 GB")

    monkeypatch.setattr(ssd_mod, "_frozen", no_memory)
    _, model, tok = loaded
    first, _ = _reqs(tok)
    s = _process(model, tok, tmp_path)
    cold = _cold(model, tok, first, tmp_path)
    with caplog.at_level(logging.WARNING):
        got = _run(s, first)
    assert got.tokens == cold
    assert s.prefix.ssd.skipped == 2 and not s.prefix.ssd.disabled
    assert s.prefix.ssd.pending_bytes == 0 and "Unable to allocate" in caplog.text
    s.close()


def test_the_writer_thread_runs_no_mlx(tmp_path, monkeypatch):
    """Issue 15 item 8: only the engine thread runs MLX. The writer writes the blob from
    buffers the engine thread evaluated: the MLX functions a serializer would call (eval,
    save, clear_cache, ...) are wrapped here to record the calling thread, and the writer
    calls none. The blob loads back bit-exact, bf16 included, with mlx-lm's own classes
    and metadata."""
    import threading

    import mlx.core as mx
    import numpy as np

    from appliance.engine.kv import load_blob
    from appliance.engine.ssd_tier import SsdTier

    calls = []

    def spy(name, fn):
        def call(*a, **k):
            calls.append((threading.current_thread().name, name))
            return fn(*a, **k)
        return call

    for name in ("eval", "async_eval", "save_safetensors", "save", "clear_cache", "contiguous",
                 "concatenate", "zeros", "synchronize", "load"):
        monkeypatch.setattr(mx, name, spy(name, getattr(mx, name)))

    layers = _kv_layers(24, 1)
    layers[1].keys, layers[1].values = (layers[1].keys.astype(mx.bfloat16),
                                        layers[1].values.astype(mx.bfloat16))
    mx.eval([c.state for c in layers])
    tier = SsdTier(str(tmp_path), 1 << 30, "fp_test")
    tier.put(list(range(24)), layers)
    tier.close()  # the writer finishes the write, then stops
    assert calls and not [c for c in calls if "ssd-writer" in c[0]], calls
    monkeypatch.undo()
    (blob,) = (tmp_path / "fp_test" / "blobs").glob("*.safetensors")
    restored, info = load_blob(str(blob))
    assert info == {"fingerprint": "fp_test", "n_tokens": "24", "start": "0"}
    for a, b in zip(layers, restored, strict=True):
        assert type(b).__name__ == "KVCache" and b.offset == a.offset
        for x, y in ((a.keys, b.keys), (a.values, b.values)):
            assert x.dtype == y.dtype
            assert np.array_equal(np.asarray(x.astype(mx.float32)),
                                  np.asarray(y.astype(mx.float32)))
