"""Quantized KV, whatever the codec: one row's cache and the batched layout.

A codec (`affine.py`, `turboquant.py`) turns float K or V, (rows, heads, tokens, dim),
into a tuple of arrays with the token axis second to last, and back; and attends over
its own codes. Everything here only stores, moves and slices those tuples, so each row's
logical length (`offset`) and the shared write cursor (`_idx`) are handled once for all.

Prefill attends over float KV (the fresh chunk as computed, the history decoded) with
fused SDPA, then stores the chunk encoded. Decode attends over the stored codes with the
codec's attention; `reference=True` decodes them and runs SDPA instead, the plain-MLX path
the fast one is checked against. mlx-lm's attention sends any cache with a `bits`
attribute to `base.quantized_scaled_dot_product_attention`; `install()` wraps that one
function so it also takes float KV, `Codes` and a split layout's parts (split.py). Other
caches go through as before.
"""

from __future__ import annotations

import json
import threading

import mlx.core as mx
import mlx_lm.models.base as base
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache, dynamic_roll

from appliance.engine.kv.native import roll_row_back

CODECS: dict = {}  # codec name -> class (filled by the codec modules)


class Codes(tuple):
    """A codec's arrays for K or V (token axis second to last), and the codec."""

    def __new__(cls, parts, codec):
        obj = super().__new__(cls, parts)
        obj.codec = codec
        return obj


class Parts(list):
    """What a split layout (split.py) hands attention: per part (its rows' indices, or None
    for all rows in order; keys; values; mask), and `order`, which puts the parts' outputs
    back in row order (None: already in order)."""

    order = None


def masked_softmax(scores: mx.array, mask, grouped: bool) -> mx.array:
    """Softmax over the keys after masking as mlx-lm's quantized attention does: a "causal"
    string, a boolean or an additive mask. `grouped`: the scores carry a query-group axis
    (grouped-query attention) that the mask lacks."""
    if mask is not None:
        if isinstance(mask, str):
            qL, kL = scores.shape[-2:]
            mask = mx.arange(kL - qL, kL)[:, None] >= mx.arange(kL)[None]
        if grouped and mask.ndim > 3:
            mask = mx.expand_dims(mask, -3)
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    return mx.softmax(scores, axis=-1, precise=True)


class _Dense:
    """Float K/V attended with matmuls and mlx-lm's quantized-attention softmax (scores in
    the compute dtype, a precise softmax): a few query tokens over whole buffers, where
    MLX's fused attention would build a graph per shape on CUDA (passes.whole_buffers)."""

    name = "dense"

    @staticmethod
    def attend(queries, keys, values, scale: float, mask) -> mx.array:
        """Each kv head's query group as one (group x tokens) matrix: two plain matmuls
        per kv head, no broadcast copy of K or V."""
        k, v = keys[0], values[0]
        B, n_q, L, D = queries.shape
        h, T = k.shape[1], k.shape[2]
        rep = n_q // h
        q = (queries * scale).reshape(B, h, rep * L, D)
        scores = (q @ k.swapaxes(-1, -2)).reshape(B, h, rep, L, T)
        weights = masked_softmax(scores, mask, grouped=True).astype(v.dtype)
        out = weights.reshape(B, h, rep * L, T) @ v
        return out.reshape(B, n_q, L, v.shape[-1])


DENSE = _Dense()
_original = base.quantized_scaled_dot_product_attention
_pass = threading.local()  # .dense: this thread runs a verify's or drafter's short pass


def dense_pass(on: bool) -> bool:
    """Set whether float KV of multi-token passes on this thread is attended by DENSE
    (passes.whole_buffers); returns the setting it replaces."""
    was = getattr(_pass, "dense", False)
    _pass.dense = on
    return was


def _dispatch(queries, q_keys, q_values, scale, mask, group_size=64, bits=8):
    if isinstance(q_keys, Parts):  # rows on both sides of kv.start
        outs = [_dispatch(queries if idx is None else queries[idx], k, v, scale, part_mask)
                for idx, k, v, part_mask in q_keys]
        out = outs[0] if len(outs) == 1 else mx.concatenate(outs)
        return out if q_keys.order is None else out[q_keys.order]
    if isinstance(q_keys, mx.array):  # float KV: a prefill chunk, or the reference path
        if queries.shape[2] > 1 and getattr(_pass, "dense", False):  # or a verify pass
            return DENSE.attend(queries, (q_keys,), (q_values,), scale, mask)
        return mx.fast.scaled_dot_product_attention(queries, q_keys, q_values, scale=scale,
                                                    mask=mask)
    if isinstance(q_keys, Codes):
        return q_keys.codec.attend(queries, q_keys, q_values, scale, mask)
    return _original(queries, q_keys, q_values, scale=scale, mask=mask,
                     group_size=group_size, bits=bits)


def install() -> None:
    """Route mlx-lm's quantized attention through `_dispatch` (idempotent)."""
    base.quantized_scaled_dot_product_attention = _dispatch


def codec_from_json(text: str):
    d = json.loads(text)
    return CODECS[d.pop("codec")](**d)


def _slice(t: tuple | None, a: int, b: int) -> tuple | None:
    return None if t is None else tuple(x[..., a:b, :] for x in t)


class _Stored:
    """What the row cache and the layout share: growing buffers and what attention gets."""

    codec: object
    reference: bool

    # mlx-lm sends a cache with `bits` to quantized attention, passing these two along
    # (the dispatcher reads the codec from the Codes instead)
    bits = group_size = None

    def _write(self, keys, values, at: int, end: int) -> None:
        n = keys.shape[2]
        if self.keys is None or end > self.keys[0].shape[-2]:
            steps = (256 + n - 1) // 256 * 256
            new_k = self.codec.empty(keys.shape[:2], steps, keys.shape[-1], keys.dtype, "k")
            new_v = self.codec.empty(values.shape[:2], steps, values.shape[-1], keys.dtype, "v")
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = tuple(mx.concatenate([a[..., :at, :], b], axis=2)
                                  for a, b in zip(self.keys, new_k, strict=True))
                self.values = tuple(mx.concatenate([a[..., :at, :], b], axis=2)
                                    for a, b in zip(self.values, new_v, strict=True))
        for buf, x, which in ((self.keys, keys, "k"), (self.values, values, "v")):
            for b, part in zip(buf, self.codec.encode(x, which), strict=True):
                b[..., at:end, :] = part

    # A multi-token pass that stands for that many decode steps (a speculative verify)
    # attends as decode does, over the codes of every token, its own included, so its
    # tokens equal those steps'; a prefill chunk attends over its fresh float KV, a
    # one-token chunk too (`prefill_like`, set by passes.prefilling): by length alone, a
    # batched row's one-token chunk attended codes where a lone row's, still native before
    # it encodes, attended float, and a two-token prompt's tokens changed with the load.
    decode_like = prefill_like = False

    def _fetch(self, end: int, fresh_k, fresh_v):
        """Codes for a decode step; float KV (history decoded + the fresh chunk as computed)
        for a prefill chunk, and for every step on the reference path."""
        n = fresh_k.shape[2]
        keys, values = _slice(self.keys, 0, end), _slice(self.values, 0, end)
        decode = (n == 1 and not self.prefill_like) or self.decode_like
        if decode and not self.reference and self.codec.attends:
            return Codes(keys, self.codec), Codes(values, self.codec)
        dt = fresh_k.dtype
        if decode:
            return self.codec.decode(keys, "k", dt), self.codec.decode(values, "v", dt)
        if end == n:
            return fresh_k, fresh_v
        return (mx.concatenate([self.codec.decode(_slice(keys, 0, end - n), "k", dt), fresh_k],
                               axis=2),
                mx.concatenate([self.codec.decode(_slice(values, 0, end - n), "v", dt),
                                fresh_v], axis=2))


class QuantRowCache(_Stored, QuantizedKVCache):
    """One row's encoded KV (a lone row, a prefix-cache entry, an SSD blob)."""

    def __init__(self, codec, reference: bool = False):
        self.keys = self.values = None
        self.offset = 0
        self.codec, self.reference = codec, reference

    @classmethod
    def from_native(cls, c: KVCache, codec, reference: bool = False) -> QuantRowCache:
        """A native row's KV encoded (as mlx-lm's `to_quantized`, for any codec)."""
        q = cls(codec, reference)
        q.offset = c.offset
        if c.keys is not None:
            q.keys, q.values = codec.encode(c.keys, "k"), codec.encode(c.values, "v")
        return q

    def update_and_fetch(self, keys, values):
        prev = self.offset
        self.offset += keys.shape[2]
        self._write(keys, values, prev, self.offset)
        return self._fetch(self.offset, keys, values)

    @property
    def state(self):
        """Its tokens only (not the buffer's spare slots), the offset and the codec."""
        return (_slice(self.keys, 0, self.offset), _slice(self.values, 0, self.offset),
                self.offset, self.codec.to_json())

    @state.setter
    def state(self, v):
        keys, values, self.offset, codec = v
        self.keys = None if keys is None else tuple(keys)  # a loaded blob gives lists
        self.values = None if values is None else tuple(values)
        self.codec, self.reference = codec_from_json(codec), False

    def trim(self, n):
        raise NotImplementedError("roll a row back through its layout")

    def cut(self, n: int) -> QuantRowCache:
        """Its first n slots, in buffers of their own (a prefix-cache hit on a longer
        entry: a token's codes are its own, so they are the prefix's)."""
        q = QuantRowCache(self.codec, self.reference)
        q.offset = n
        q.keys, q.values = (tuple(mx.contiguous(x) for x in _slice(t, 0, n))
                            for t in (self.keys, self.values))
        return q

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else sum(x.nbytes for x in (*self.keys, *self.values))


class QuantLayout(_Stored, BatchKVCache):
    """Many rows' encoded KV, left-padded to one write cursor (`_idx`); `offset` per row."""

    causal = False  # a lone row's prefill: the "causal" mask MLX fuses (passes.causal)

    def __init__(self, left_padding: list[int], codec, reference: bool = False):
        super().__init__(left_padding)
        self.codec, self.reference = codec, reference

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        if self.causal and N > 1:  # (prefill attends over float keys of exact length)
            return "causal"
        return super().make_mask(N, return_array=return_array, **kwargs)

    def update_and_fetch(self, keys, values):
        prev = self._idx
        self._idx += keys.shape[2]
        self.offset = self.offset + keys.shape[2]
        self._write(keys, values, prev, self._idx)
        return self._fetch(self._idx, keys, values)

    def finalize(self):
        if self._right_padding is not None:
            pad = self._right_padding[:, None]
            self.keys = tuple(dynamic_roll(x, pad, axis=2) for x in self.keys)
            self.values = tuple(dynamic_roll(x, pad, axis=2) for x in self.values)
            self.offset = self.offset - self._right_padding
            self.left_padding += self._right_padding
            self._right_padding = None

    @property
    def state(self):
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    def filter(self, keep):
        idx = mx.array(keep)
        if self.keys is not None:
            self.keys = tuple(x[idx] for x in self.keys)
            self.values = tuple(x[idx] for x in self.values)
        pads = self.left_padding.tolist()  # (on the host: a new lazy array would wait)
        shift = min(pads[i] for i in keep)
        self.offset = self.offset[idx]
        self.left_padding = mx.array([pads[i] - shift for i in keep], self.left_padding.dtype)
        if shift > 0:  # padding every row shares
            self.keys = _slice(self.keys, shift, None)
            self.values = _slice(self.values, shift, None)
            self._idx -= shift

    def extend(self, other: QuantLayout) -> None:
        """Right-align both to the later cursor, then stack the rows."""
        idx = max(self._idx, other._idx)
        filled = next((c for c in (self, other) if c.keys is not None), None)
        if filled is not None:
            parts = [c._aligned(idx, filled) for c in (self, other)]
            self.keys = tuple(mx.concatenate(x) for x in zip(*(p[0] for p in parts),
                                                             strict=True))
            self.values = tuple(mx.concatenate(x) for x in zip(*(p[1] for p in parts),
                                                               strict=True))
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([self.left_padding + (idx - self._idx),
                                            other.left_padding + (idx - other._idx)])
        self._idx = idx

    def _aligned(self, idx: int, like: QuantLayout):
        rows = self.offset.shape[0]
        if self.keys is None:
            def zeros(t):
                return tuple(mx.zeros((rows, x.shape[1], idx, x.shape[3]), x.dtype) for x in t)
            return zeros(like.keys), zeros(like.values)
        pad = [(0, 0), (0, 0), (idx - self._idx, 0), (0, 0)]
        return (tuple(mx.pad(x[..., :self._idx, :], pad) for x in self.keys),
                tuple(mx.pad(x[..., :self._idx, :], pad) for x in self.values))

    def extract(self, i: int) -> QuantRowCache:
        pad = self.left_padding.tolist()[i]
        c = QuantRowCache(self.codec, self.reference)
        if self.keys is not None:
            c.keys = tuple(mx.contiguous(x[i:i + 1, :, pad:self._idx]) for x in self.keys)
            c.values = tuple(mx.contiguous(x[i:i + 1, :, pad:self._idx]) for x in self.values)
            c.offset = self._idx - pad
        return c

    def rollback(self, i: int, n: int) -> None:
        roll_row_back(self, i, n)

    @classmethod
    def merge(cls, rows: list, codec, reference: bool = False) -> QuantLayout:
        """Rows left-padded to the longest. Native rows are encoded here; encoded rows are
        taken as they are, never encoded twice."""
        rows = [r if isinstance(r, QuantRowCache) else QuantRowCache.from_native(r, codec)
                for r in rows]
        lengths = [r.offset if r.keys is not None else 0 for r in rows]
        longest = max(lengths)
        out = cls([longest - n for n in lengths], codec, reference)
        if longest == 0:
            return out
        like = next(r for r in rows if r.keys is not None)

        def stack(pick):
            parts = []
            for r, n in zip(rows, lengths, strict=True):
                pad = [(0, 0), (0, 0), (longest - n, 0), (0, 0)]
                parts.append(tuple(
                    mx.pad(y[..., :n, :], pad) if r.keys is not None
                    else mx.zeros((1, y.shape[1], longest, y.shape[3]), y.dtype)
                    for y in pick(r if r.keys is not None else like)))
            return tuple(mx.concatenate(x) for x in zip(*parts, strict=True))

        out.keys, out.values = stack(lambda r: r.keys), stack(lambda r: r.values)
        out.offset = out.offset + longest
        out._idx = longest
        return out

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else sum(x.nbytes for x in (*self.keys, *self.values))
