"""The KV layout contract (appliance/engine/kv/base.py), one suite over every layout.

Rows of uneven lengths are merged, extended, filtered and rolled back; after each
operation every row's extracted KV must be exactly its own tokens, and a new token must
land right after each row's last kept token. That is the failure found in another
server's batched quantized cache: it derived the write position from the rows' lengths,
so after a row left, new tokens overwrote live KV.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, save_prompt_cache

from appliance.engine.kv import Scheme, load_blob
from appliance.engine.kv.affine import AffineCodec
from appliance.engine.kv.quantized import QuantRowCache
from appliance.engine.kv.split import SplitLayout
from appliance.engine.kv.turboquant import TurboCodec

H, D = 2, 64
SCHEMES = {
    "native": Scheme(),
    "affine8": Scheme(AffineCodec(64, 8, 8), (0,)),
    "k8v4": Scheme(AffineCodec(64, 8, 4), (0,)),
    "turboquant": Scheme(TurboCodec(64, 4, 4), (0,)),
    "turboquant3-orthogonal": Scheme(TurboCodec(64, 3, 3, "orthogonal", 5), (0,)),
    # 3.5 bits: an outlier half per head (as calibrate would find), at 4 bits
    "turboquant3.5": Scheme(TurboCodec(64, 3.5, 3.5, channels={
        "k": [list(range(63, -1, -1)), list(range(1, 64, 2)) + list(range(0, 64, 2))],
        "v": [list(range(64)), list(range(63, -1, -1))]}), (0,)),
    # kv.start 8: rows below it native, the rest encoded, in one layer (kv/split.py)
    "k8v4-start8": Scheme(AffineCodec(64, 8, 4), (0,), start=8),
    "turboquant-start8": Scheme(TurboCodec(64, 4, 4), (0,), start=8),
}


def _tokens(n: int, seed: int):
    k = mx.random.normal((1, H, n, D), key=mx.random.key(seed))
    v = mx.random.normal((1, H, n, D), key=mx.random.key(seed + 1000))
    return k, v


def _row(scheme: Scheme, n: int, seed: int):
    c = KVCache()
    if n:
        c.update_and_fetch(*_tokens(n, seed))
    if scheme.quantized and n >= scheme.start:
        c = QuantRowCache.from_native(c, scheme.codec)
    return c


def _content(c) -> list[mx.array]:
    """A row cache's stored arrays for its tokens (codes for quantized rows)."""
    if c.keys is None or c.offset == 0:
        return []
    if isinstance(c, QuantRowCache):
        keys, values = c.state[:2]
        return [x[..., :c.offset, :] for x in (*keys, *values)]
    return [c.keys[..., :c.offset, :], c.values[..., :c.offset, :]]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and mx.array_equal(x, y).item()
                                    for x, y in zip(a, b, strict=True))


def _expect(scheme, lengths_seeds):
    """What each row must hold: built alone, as row caches."""
    return [_content(_row(scheme, n, s)) for n, s in lengths_seeds]


def _append(layout, scheme, rows: int, seed: int):
    """One new token for every row, as a decode step writes it: its content as a native
    row holds it and as an encoded row does (split layouts hold both kinds of row)."""
    k, v = _tokens(1, seed)
    layout.update_and_fetch(mx.repeat(k, rows, axis=0), mx.repeat(v, rows, axis=0))
    native = KVCache()
    native.update_and_fetch(k, v)
    forms = [_content(native)]
    if scheme.quantized:
        forms.append(_content(QuantRowCache.from_native(native, scheme.codec)))
    return forms


def _cat(a: list, new) -> list:
    """Row content `a` with a new token appended (`new`: `_append`'s forms)."""
    b = next(f for f in new if len(f) == len(a)) if a else new[-1]
    if not a:
        return b
    return [mx.concatenate([x, y], axis=2) for x, y in zip(a, b, strict=True)]


@pytest.fixture(params=list(SCHEMES))
def scheme(request):
    return SCHEMES[request.param]


def test_merge_then_extract_gives_each_row_exactly_its_tokens(scheme):
    spec = [(5, 1), (12, 2), (0, 3), (7, 4)]
    (layout,) = scheme.merge([[_row(scheme, n, s)] for n, s in spec])
    for i, want in enumerate(_expect(scheme, spec)):
        assert _same(_content(layout.extract(i)), want)
    assert layout.offset.tolist() == [n for n, _ in spec]


def test_filter_extend_and_append_keep_rows_apart(scheme):
    spec = [(5, 1), (12, 2), (3, 3)]
    (layout,) = scheme.merge([[_row(scheme, n, s)] for n, s in spec])
    want = _expect(scheme, spec)
    new = _append(layout, scheme, 3, 50)
    want = [_cat(w, new) for w in want]
    layout.filter([0, 2])  # the longest row leaves: the others keep their KV
    want = [want[0], want[2]]
    (other,) = scheme.merge([[_row(scheme, 9, 7)]])
    layout.extend(other)
    want.append(_expect(scheme, [(9, 7)])[0])
    new = _append(layout, scheme, 3, 51)
    want = [_cat(w, new) for w in want]
    for i, w in enumerate(want):
        assert _same(_content(layout.extract(i)), w), i
    assert layout.offset.tolist() == [7, 5, 10]


def test_rollback_drops_one_rows_tail_and_the_next_token_follows_its_kept_ones(scheme):
    spec = [(6, 1), (10, 2), (4, 3)]
    (layout,) = scheme.merge([[_row(scheme, n, s)] for n, s in spec])
    want = _expect(scheme, spec)
    layout.rollback(1, 3)
    want[1] = [x[..., :7, :] for x in want[1]]
    for i, w in enumerate(want):
        assert _same(_content(layout.extract(i)), w), i
    new = _append(layout, scheme, 3, 60)
    want = [_cat(w, new) for w in want]
    for i, w in enumerate(want):
        assert _same(_content(layout.extract(i)), w), i
    assert layout.offset.tolist() == [7, 8, 5]
    mask = layout.make_mask(1)  # the next token sees row 1's 8 tokens and itself, no more
    assert mask[1].reshape(-1).tolist().count(True) == 9
    with pytest.raises(ValueError):
        layout.rollback(2, 6)


def test_a_rows_blob_round_trips(scheme, tmp_path):
    (layout,) = scheme.merge([[_row(scheme, n, s)] for n, s in [(5, 1), (9, 2)]])
    row = layout.extract(1)
    save_prompt_cache(str(tmp_path / "b.safetensors"), [row], {"n_tokens": "9"})
    (loaded,), info = load_blob(str(tmp_path / "b.safetensors"))
    assert type(loaded) is type(row) and info["n_tokens"] == "9"
    assert _same(_content(loaded), _content(row))


def test_bytes_are_what_the_layout_holds(scheme):
    (layout,) = scheme.merge([[_row(scheme, n, s)] for n, s in [(5, 1), (9, 2)]])
    parts = [p for p in (layout.native, layout.coded) if p is not None] \
        if isinstance(layout, SplitLayout) else [layout]
    arrays = [a for p in parts for a in (p.keys, p.values)]
    flat = [x for a in arrays for x in (a if isinstance(a, tuple) else (a,))]
    assert layout.nbytes == sum(x.nbytes for x in flat) > 0


@pytest.mark.parametrize("name", ["k8v4-start8", "turboquant-start8"])
def test_a_row_reaching_start_in_a_batch_is_encoded_once_at_its_next_write(name):
    """Rows of 7, 3 and 12 tokens at kv.start 8: the first holds 8 after one step, so the
    next write encodes its 8 tokens and appends the new one encoded, as a lone row's
    cache would be (mlx-lm's quantized_kv_start); the others stay what they were."""
    scheme = SCHEMES[name]
    spec = [(7, 1), (3, 2), (12, 3)]
    (layout,) = scheme.merge([[_row(scheme, n, s)] for n, s in spec])
    assert layout.rows_n == [0, 1] and layout.rows_c == [2]
    keys = [_tokens(n, s) for n, s in spec]
    for step in (70, 71):
        k, v = _tokens(1, step)
        layout.update_and_fetch(mx.repeat(k, 3, axis=0), mx.repeat(v, 3, axis=0))
        keys = [(mx.concatenate([a, k], axis=2), mx.concatenate([b, v], axis=2))
                for a, b in keys]
    assert layout.rows_n == [1] and layout.rows_c == [2, 0]
    assert layout.offset.tolist() == [9, 5, 14]
    for i, (k, v) in enumerate(keys):
        row = KVCache()
        row.update_and_fetch(k, v)
        want = row if i == 1 else QuantRowCache.from_native(row, scheme.codec)
        got = layout.extract(i)
        assert type(got) is type(want) and _same(_content(got), _content(want)), i
    mask = layout.make_mask(1)  # the batch-level mask a native layer beside it would use
    assert [m.reshape(-1).tolist().count(True) for m in mask] == [10, 6, 15]


def test_a_sliding_row_rolls_back_until_its_window_wraps():
    from mlx_lm.models.cache import RotatingKVCache

    def row(n, seed):
        c = RotatingKVCache(max_size=16)
        c.update_and_fetch(*_tokens(n, seed))
        return c

    (layout,) = Scheme().merge([[row(5, 1)], [row(9, 2)]])
    layout.rollback(1, 3)
    got = layout.extract(1)
    want = _tokens(9, 2)
    assert mx.array_equal(got.keys[..., :got.offset, :], want[0][..., :6, :]).item()
    assert mx.array_equal(layout.extract(0).keys[..., :5, :], _tokens(5, 1)[0]).item()
    for s in range(12):  # 9 + 12 > 16: the ring wraps
        _append(layout, Scheme(), 2, 100 + s)
    with pytest.raises(NotImplementedError):
        layout.rollback(0, 1)


def test_a_recurrent_row_rolls_back_to_its_checkpoint_alone():
    from mlx_lm.models.cache import ArraysCache

    def row(seed):
        c = ArraysCache(2)
        c[0] = mx.random.normal((1, 3, 4), key=mx.random.key(seed))
        c[1] = mx.random.normal((1, 5), key=mx.random.key(seed + 1))
        return c

    (layout,) = Scheme().merge([[row(1)], [row(2)], [row(3)]])
    before = [mx.array(x) for x in layout.cache]
    layout.checkpoint()
    layout[0] = layout[0] + 1.0  # a forward pass folds new tokens into every row
    layout[1] = layout[1] * 2.0
    after = [mx.array(x) for x in layout.cache]
    layout.rollback(1, 2)
    for k in range(2):
        assert mx.array_equal(layout.cache[k][1], before[k][1]).item()  # row 1: restored
        for i in (0, 2):
            assert mx.array_equal(layout.cache[k][i], after[k][i]).item()  # others: not
    layout.filter([0, 2])
    with pytest.raises(ValueError):
        layout.rollback(0, 1)


def test_masked_tails_equal_rolled_tails():
    """A verify pass over native layers masks what each row drops beyond the common part
    (FullLayout holes) instead of rolling every row's history right. Rows, attention, and
    what the rows hold after later writes, leaves, joins and a rollback are the same either
    way."""
    from appliance.engine.kv.native import drop_tails

    def batch():
        rows = [KVCache() for _ in range(3)]
        for i, (r, n) in enumerate(zip(rows, (9, 5, 12), strict=True)):
            r.update_and_fetch(*_tokens(n, i))
        (layout,) = Scheme().merge([[r] for r in rows])
        k, v = _tokens(4, 50)  # a 4-token pass for every row, then each keeps its own part
        layout.update_and_fetch(mx.repeat(k, 3, axis=0), mx.repeat(v, 3, axis=0))
        return layout

    def rows_of(layout, n):
        return [(layout.extract(i).keys, layout.extract(i).values) for i in range(n)]

    def attend(layout, n):
        k, v = _tokens(1, 77)
        mask = layout.make_mask(1)  # (as a model builds it: before the write)
        keys, values = layout.update_and_fetch(mx.repeat(k, n, axis=0), mx.repeat(v, n, axis=0))
        q = mx.random.normal((n, H, 1, D), key=mx.random.key(5))
        return mx.fast.scaled_dot_product_attention(q, keys, values, scale=D ** -0.5, mask=mask)

    rolled, masked = batch(), batch()
    drop_tails(rolled, [3, 1, 0])
    drop_tails(masked, [3, 1, 0], holes=True)
    assert masked._holes is not None and rolled._holes is None
    for a, b in zip(rows_of(rolled, 3), rows_of(masked, 3), strict=True):
        assert all(mx.array_equal(x, y).item() for x, y in zip(a, b, strict=True))
    assert mx.allclose(attend(rolled, 3), attend(masked, 3), atol=1e-6).item()
    for layout in (rolled, masked):  # a row leaves, a new one joins, one rolls back 2
        layout.filter([0, 2])
        fresh = KVCache()
        fresh.update_and_fetch(*_tokens(7, 9))
        layout.extend(Scheme().merge([[fresh]])[0])
        layout.rollback(1, 2)
    for a, b in zip(rows_of(rolled, 3), rows_of(masked, 3), strict=True):
        assert all(mx.array_equal(x, y).item() for x, y in zip(a, b, strict=True))
    assert mx.allclose(attend(rolled, 3), attend(masked, 3), atol=1e-6).item()
    k, v = _tokens(3, 60)  # another 3-token pass, more holes, then compacted away
    for layout in (rolled, masked):
        layout.update_and_fetch(mx.repeat(k, 3, axis=0), mx.repeat(v, 3, axis=0))
    drop_tails(rolled, [0, 2, 1])
    drop_tails(masked, [0, 2, 1], holes=True)
    masked.compact(masked.compaction())
    assert masked._holes is None and masked._idx % masked.step == 0
    for a, b in zip(rows_of(rolled, 3), rows_of(masked, 3), strict=True):
        assert all(mx.array_equal(x, y).item() for x, y in zip(a, b, strict=True))
    assert mx.allclose(attend(rolled, 3), attend(masked, 3), atol=1e-6).item()


def test_the_masked_decode_kernels_take_one_query_token_with_a_row_mask_only():
    """native_cuda's routing rule (its kernels run on CUDA only, tests/test_kv_cuda.py):
    a batched decode step's shapes go to the kernels, anything else to MLX; and installing
    it changes nothing where MLX does not run on CUDA."""
    from appliance.engine.kv import native_cuda

    q, k = mx.zeros((3, 8, 1, 64)), mx.zeros((3, 2, 100, 64))
    rows = mx.ones((3, 1, 1, 100), mx.bool_)
    assert native_cuda.covers(q, k, rows)
    assert native_cuda.covers(q, k, mx.zeros((1, 1, 1, 100), mx.bfloat16))  # additive
    assert not native_cuda.covers(q, k, None)  # MLX's fused kernel already takes it
    assert not native_cuda.covers(q, k, "causal")
    assert not native_cuda.covers(mx.zeros((3, 8, 2, 64)), k, mx.ones((3, 1, 2, 100), mx.bool_))
    assert not native_cuda.covers(q, k, mx.ones((3, 8, 1, 100), mx.bool_))  # per head
    assert not native_cuda.covers(q, k, mx.ones((3, 1, 1, 99), mx.bool_))
    assert not native_cuda.covers(mx.zeros((3, 8, 1, 16)), mx.zeros((3, 2, 100, 16)),
                                  mx.ones((3, 1, 1, 100), mx.bool_))  # head dim
    assert not native_cuda.covers(mx.zeros((3, 32, 1, 64)), mx.zeros((3, 2, 100, 64)), rows)
    before = mx.fast.scaled_dot_product_attention
    native_cuda.install()
    assert mx.fast.scaled_dot_product_attention is before or native_cuda.available()


@pytest.mark.parametrize("shape", [(2300, 2307, 2560, 2560), (1800, 900, 2048, 1024),
                                   (700, 1000, 1024, 1024), (500, 200, 512, 768)])
def test_a_native_merge_equals_mlx_lms(shape):
    """FullLayout's merge writes the batch and the joining rows into one buffer (mlx-lm's
    pads, then concatenates): the same buffers, padding, lengths and cursor as
    `BatchKVCache.extend`, whichever side is longer, in cursor and in buffer (a buffer
    longer than the cursor keeps its empty tail; past the merged size it is cut)."""
    from mlx_lm.models.cache import BatchKVCache

    from appliance.engine.kv.native import FullLayout

    n1, n2, cap1, cap2 = shape

    def batch(rows, n, cap, seed):
        c = FullLayout([0] * rows)
        c.update_and_fetch(*(mx.random.normal((rows, H, n, D), key=mx.random.key(seed + i))
                             for i in (0, 1000)))
        grow = cap - c.keys.shape[2]  # (a buffer whole steps wide, as decoding leaves it)
        if grow > 0:
            c.keys, c.values = (mx.pad(x, [(0, 0), (0, 0), (0, grow), (0, 0)])
                                for x in (c.keys, c.values))
        return c

    ours, theirs = batch(3, n1, cap1, 1), batch(3, n1, cap1, 1)
    ours.extend(batch(1, n2, cap2, 2))
    BatchKVCache.extend(theirs, batch(1, n2, cap2, 2))
    assert ours._idx == theirs._idx
    for a, b in ((ours.keys, theirs.keys), (ours.values, theirs.values)):  # whole buffers
        assert a.shape == b.shape and mx.array_equal(a, b).item()
    for name in ("left_padding", "offset"):
        assert getattr(ours, name).tolist() == getattr(theirs, name).tolist()
