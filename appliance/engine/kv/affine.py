"""kv=affine8|affine4|k8v4: keys and values stored as `mx.quantize` codes, each with its bits.

Prefill attends over float KV (the fresh chunk as computed, the history dequantized) with
fused SDPA, then stores the chunk quantized. Decode attends over the stored codes with
`mx.quantized_matmul` (mlx-lm's quantized attention, with keys and values at their own
bits; with equal bits it is mlx-lm's arithmetic exactly). `reference=True` dequantizes and
runs SDPA instead: the plain-MLX path the fast one is checked against.

mlx-lm's attention routes any cache with a `bits` attribute to
`base.quantized_scaled_dot_product_attention`; `install()` wraps that one function so it
also takes float KV (prefill) and `Codes` with their own bits. Every other cache goes
through as before.
"""

from __future__ import annotations

import mlx.core as mx
import mlx_lm.models.base as base
from mlx.utils import tree_map
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache, dynamic_roll

from appliance.engine.kv.native import roll_row_back


class Codes(tuple):
    """(packed words, scales, biases) of K or V, with the bits they were packed at."""

    def __new__(cls, parts, bits: int, group_size: int):
        obj = super().__new__(cls, parts)
        obj.bits, obj.group_size = bits, group_size
        return obj


def quantize(x: mx.array, bits: int, group_size: int) -> tuple:
    return tuple(mx.quantize(x, group_size=group_size, bits=bits))


def dequantize(codes: tuple, bits: int, group_size: int) -> mx.array:
    return mx.dequantize(*codes, group_size=group_size, bits=bits)


def attention(queries, keys: Codes, values: Codes, scale: float, mask) -> mx.array:
    """mlx-lm's quantized attention with keys and values at their own bits."""
    B, n_q_heads, L, D = queries.shape
    n_kv_heads = keys[0].shape[-3]
    n_repeats = n_q_heads // n_kv_heads
    queries = queries * scale
    k, v = tuple(keys), tuple(values)
    if n_repeats > 1:
        queries = mx.reshape(queries, (B, n_kv_heads, n_repeats, L, D))
        k = tree_map(lambda x: mx.expand_dims(x, axis=-3), k)
        v = tree_map(lambda x: mx.expand_dims(x, axis=-3), v)
    scores = mx.quantized_matmul(queries, *k, transpose=True, group_size=keys.group_size,
                                 bits=keys.bits)
    if mask is not None:
        if isinstance(mask, str):
            qL, kL = scores.shape[-2:]
            mask = mx.arange(kL - qL, kL)[:, None] >= mx.arange(kL)[None]
        if n_repeats > 1 and mask.ndim > 3:
            mask = mx.expand_dims(mask, -3)
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.finfo(scores.dtype).min)
        else:
            scores += mask
    scores = mx.softmax(scores, axis=-1, precise=True)
    out = mx.quantized_matmul(scores, *v, transpose=False, group_size=values.group_size,
                              bits=values.bits)
    if n_repeats > 1:
        out = mx.reshape(out, (B, n_q_heads, L, D))
    return out


_original = base.quantized_scaled_dot_product_attention


def _dispatch(queries, q_keys, q_values, scale, mask, group_size=64, bits=8):
    if isinstance(q_keys, mx.array):  # float KV (a prefill chunk, or the reference path)
        return mx.fast.scaled_dot_product_attention(queries, q_keys, q_values, scale=scale,
                                                    mask=mask)
    if isinstance(q_keys, Codes):
        return attention(queries, q_keys, q_values, scale, mask)
    return _original(queries, q_keys, q_values, scale=scale, mask=mask,
                     group_size=group_size, bits=bits)


def install() -> None:
    base.quantized_scaled_dot_product_attention = _dispatch


class _Stored:
    """Shared by the row cache and the layout: what `update_and_fetch` hands attention."""

    key_bits: int
    value_bits: int
    group_size: int
    reference: bool

    @property
    def bits(self) -> int:  # mlx-lm routes a cache with `bits` to quantized attention
        return self.key_bits

    def _fetch(self, keys, values, fresh_k, fresh_v, n_new: int):
        """Codes for a decode step; float KV (history dequantized + the fresh chunk as
        computed) for a prefill chunk, and for every step on the reference path."""
        kb, vb, g = self.key_bits, self.value_bits, self.group_size
        if n_new == 1 and not self.reference:
            return Codes(keys, kb, g), Codes(values, vb, g)
        if n_new == 1:
            return dequantize(keys, kb, g), dequantize(values, vb, g)
        hist_k = tuple(x[..., :-n_new, :] for x in keys)
        hist_v = tuple(x[..., :-n_new, :] for x in values)
        if hist_k[0].shape[-2] == 0:
            return fresh_k, fresh_v
        return (mx.concatenate([dequantize(hist_k, kb, g), fresh_k], axis=2),
                mx.concatenate([dequantize(hist_v, vb, g), fresh_v], axis=2))

    def _grow(self, shape_k, shape_v, n: int, dtype, keys, values, used: int):
        """Buffers with room for `n` more tokens after `used` (256-token steps)."""
        def empty(shape, bits):
            B, H, _, D = shape
            steps = (256 + n - 1) // 256 * 256
            return (mx.zeros((B, H, steps, D * bits // 32), mx.uint32),
                    mx.zeros((B, H, steps, D // self.group_size), dtype),
                    mx.zeros((B, H, steps, D // self.group_size), dtype))

        new_k, new_v = empty(shape_k, self.key_bits), empty(shape_v, self.value_bits)
        if keys is None:
            return new_k, new_v
        def grown(old, new):
            return tuple(mx.concatenate([a[..., :used, :], b], axis=2)
                         for a, b in zip(old, new, strict=True))

        return grown(keys, new_k), grown(values, new_v)


class AffineRowCache(_Stored, QuantizedKVCache):
    """One row's quantized KV (a lone row, a prefix-cache entry, an SSD blob)."""

    def __init__(self, group_size: int = 64, key_bits: int = 8, value_bits: int = 8,
                 reference: bool = False):
        self.keys = self.values = None
        self.offset = 0
        self.group_size, self.key_bits, self.value_bits = group_size, key_bits, value_bits
        self.reference = reference

    @classmethod
    def from_native(cls, c: KVCache, **settings) -> AffineRowCache:
        """A native row's KV quantized (mlx-lm's `to_quantized`, with per-tensor bits)."""
        q = cls(**settings)
        q.offset = c.offset
        if c.keys is not None:
            q.keys = quantize(c.keys, q.key_bits, q.group_size)
            q.values = quantize(c.values, q.value_bits, q.group_size)
        return q

    def update_and_fetch(self, keys, values):
        prev, n = self.offset, keys.shape[2]
        if self.keys is None or prev + n > self.keys[0].shape[-2]:
            self.keys, self.values = self._grow(keys.shape, values.shape, n, keys.dtype,
                                                self.keys, self.values, prev)
        self.offset += n
        for buf, x, bits in ((self.keys, keys, self.key_bits),
                             (self.values, values, self.value_bits)):
            for b, part in zip(buf, quantize(x, bits, self.group_size), strict=True):
                b[..., prev:self.offset, :] = part
        stored = (tuple(x[..., :self.offset, :] for x in self.keys),
                  tuple(x[..., :self.offset, :] for x in self.values))
        return self._fetch(*stored, keys, values, n)

    @property
    def state(self):
        """Its tokens only (not the buffer's spare slots), the offset and the settings."""
        def cut(t):
            return (None if t is None else tuple(x[..., :self.offset, :] for x in t))
        return cut(self.keys), cut(self.values), self.offset, self.group_size, \
            self.key_bits, self.value_bits

    @state.setter
    def state(self, v):
        keys, values, self.offset, self.group_size, self.key_bits, self.value_bits = v
        self.keys = None if keys is None else tuple(keys)  # a loaded blob gives lists
        self.values = None if values is None else tuple(values)
        self.reference = False

    def trim(self, n):
        raise NotImplementedError("roll back through the layout")


class AffineLayout(_Stored, BatchKVCache):
    """Many rows' quantized KV, left-padded to one write cursor (`_idx`); `offset` per row."""

    def __init__(self, left_padding: list[int], group_size: int, key_bits: int,
                 value_bits: int, reference: bool = False):
        super().__init__(left_padding)
        self.group_size, self.key_bits, self.value_bits = group_size, key_bits, value_bits
        self.reference = reference

    def _settings(self) -> dict:
        return {"group_size": self.group_size, "key_bits": self.key_bits,
                "value_bits": self.value_bits, "reference": self.reference}

    def update_and_fetch(self, keys, values):
        prev, n = self._idx, keys.shape[2]
        if self.keys is None or prev + n > self.keys[0].shape[-2]:
            self.keys, self.values = self._grow(keys.shape, values.shape, n, keys.dtype,
                                                self.keys, self.values, prev)
        self.offset = self.offset + n
        self._idx += n
        for buf, x, bits in ((self.keys, keys, self.key_bits),
                             (self.values, values, self.value_bits)):
            for b, part in zip(buf, quantize(x, bits, self.group_size), strict=True):
                b[..., prev:self._idx, :] = part
        stored = (tuple(x[..., :self._idx, :] for x in self.keys),
                  tuple(x[..., :self._idx, :] for x in self.values))
        return self._fetch(*stored, keys, values, n)

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
        if self.keys is not None:
            idx = mx.array(keep)
            self.keys = tuple(x[idx] for x in self.keys)
            self.values = tuple(x[idx] for x in self.values)
        self.offset = self.offset[mx.array(keep)]
        self.left_padding = self.left_padding[mx.array(keep)]
        shift = min(self.left_padding.tolist())
        if shift > 0:
            if self.keys is not None:
                self.keys = tuple(x[..., shift:, :] for x in self.keys)
                self.values = tuple(x[..., shift:, :] for x in self.values)
            self._idx -= shift
            self.left_padding -= shift

    def extend(self, other: AffineLayout) -> None:
        """Right-align both to the later cursor, then stack the rows."""
        idx = max(self._idx, other._idx)
        parts = [c._aligned(idx) for c in (self, other) if c.keys is not None]
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([self.left_padding + (idx - self._idx),
                                            other.left_padding + (idx - other._idx)])
        if parts:
            rows = [self._empty_like(parts[0], len(c.offset), idx) if c.keys is None
                    else c._aligned(idx) for c in (self, other)]
            self.keys = tuple(mx.concatenate(x) for x in zip(*(r[0] for r in rows), strict=False))
            self.values = tuple(mx.concatenate(x) for x in zip(*(r[1] for r in rows), strict=False))
        self._idx = idx

    def _aligned(self, idx: int):
        left = idx - self._idx
        pad = lambda x: mx.pad(x[..., :self._idx, :], [(0, 0), (0, 0), (left, 0), (0, 0)])  # noqa
        return tuple(pad(x) for x in self.keys), tuple(pad(x) for x in self.values)

    @staticmethod
    def _empty_like(row, n: int, idx: int):
        z = lambda x: mx.zeros((n, x.shape[1], idx, x.shape[3]), x.dtype)  # noqa: E731
        return tuple(z(x) for x in row[0]), tuple(z(x) for x in row[1])

    def extract(self, i: int) -> AffineRowCache:
        pad = self.left_padding.tolist()[i]
        c = AffineRowCache(**self._settings())
        if self.keys is not None:
            c.keys = tuple(mx.contiguous(x[i:i + 1, :, pad:self._idx]) for x in self.keys)
            c.values = tuple(mx.contiguous(x[i:i + 1, :, pad:self._idx]) for x in self.values)
            c.offset = self._idx - pad
        return c

    def rollback(self, i: int, n: int) -> None:
        roll_row_back(self, i, n)

    @classmethod
    def merge(cls, rows: list, group_size: int, key_bits: int, value_bits: int,
              reference: bool = False) -> AffineLayout:
        """Rows (native caches are quantized here; quantized ones are taken as they are,
        never re-quantized), left-padded to the longest."""
        settings = {"group_size": group_size, "key_bits": key_bits, "value_bits": value_bits,
                    "reference": reference}
        rows = [r if isinstance(r, AffineRowCache) else AffineRowCache.from_native(r, **settings)
                for r in rows]
        lengths = [r.offset if r.keys is not None else 0 for r in rows]
        longest = max(lengths)
        out = cls([longest - n for n in lengths], **settings)
        if longest == 0:
            return out
        ref = next(r for r in rows if r.keys is not None)

        def stack(pick):
            parts = []
            for r, n in zip(rows, lengths, strict=True):
                parts.append(tuple(
                    mx.pad(y[..., :n, :], [(0, 0), (0, 0), (longest - n, 0), (0, 0)])
                    if r.keys is not None else
                    mx.zeros((1, x.shape[1], longest, x.shape[3]), x.dtype)
                    for x, y in zip(pick(ref), pick(r) if r.keys is not None else pick(ref),
                                    strict=True)))
            return tuple(mx.concatenate(x) for x in zip(*parts, strict=False))

        out.keys, out.values = stack(lambda r: r.keys), stack(lambda r: r.values)
        out.offset = out.offset + longest
        out._idx = longest
        return out

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return sum(x.nbytes for x in (*self.keys, *self.values))
