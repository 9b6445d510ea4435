"""kv=turboquant: norm + random rotation + Lloyd-Max codes per coordinate (TurboQuant-MSE).

Each head vector x is stored as its norm (float16) and, for u = x / |x| rotated by a fixed
random orthogonal R, the index of the nearest Lloyd-Max centroid of every coordinate
(coordinates of a rotated unit vector are close to N(0, 1/d)). Indices are packed into
uint32 words. Rotations: `hadamard`, two rounds of a randomized Hadamard transform (one
round does not spread spiky inputs; tech-brief 1.1), or `orthogonal`, a dense QR-random
matrix. Bits per coordinate, for keys and values each: 2, 3, 4, or 3.5.

3.5 bits is the paper's outlier-channel split: per layer and kv head, the half of the
channels with the largest mean |x| (found once per model by `calibrate`, one pass over
seeded token ids) is one vector at 4 bits, the other half one at 3; each half has its own
norm and its own rotation (of half the size), so an outlier channel's magnitude stays in
its own half instead of being spread over every coordinate of the head.

Attention runs in the rotated space: q is rotated once (float32), scores are
n_t <Rq, c[idx_t]>, the values are weighted in rotated space, and one inverse rotation
maps the output back. On MLX's CUDA backend a decode step runs two fused kernels over the
packed codes, and one kernel encodes (turboquant_cuda.py); elsewhere it is plain MLX
(gathers). The plan says which.
"""

from __future__ import annotations

import functools
import json
import math

import mlx.core as mx

from appliance.engine.kv import cuda_decode, turboquant_cuda
from appliance.engine.kv.quantized import CODECS, masked_softmax

# Lloyd-Max quantizer of N(0, 1): positive centroids (Max 1960; tech-brief 1.2). For unit
# vectors in dimension d the centroids scale by 1/sqrt(d).
CENTROIDS = {
    2: (0.4528, 1.5104),
    3: (0.2451, 0.7560, 1.3439, 2.1519),
    4: (0.1284, 0.3880, 0.6568, 0.9423, 1.2562, 1.6180, 2.0690, 2.7326),
}
HADAMARD_SIZES = (1, 12, 20, 28)  # n = m * 2^k that mx.hadamard_transform supports


def hadamard_ok(d: int) -> bool:
    """Whether mx.hadamard_transform supports size d (others crash the process)."""
    while d % 2 == 0 and d > 1:
        d //= 2
    return d in HADAMARD_SIZES


def _split(x: mx.array) -> tuple[mx.array, mx.array]:
    """x as a bfloat16-exact head plus a float32 tail."""
    head = x.astype(mx.bfloat16).astype(mx.float32)
    return head, x - head


def _matmul(x: mx.array, parts: tuple[mx.array, mx.array]) -> mx.array:
    """x @ m to float32 accuracy where float32 matmuls run at TF32 (MLX's CUDA backend by
    default): bfloat16-exact heads multiply exactly, and the tails' rounding is second
    order. One matmul in TF32 moved logits by 0.027 on the H200; this keeps the query
    rotation float32, as it must be (tech-brief 1.9)."""
    xh, xl = _split(x)
    mh, ml = parts
    return xh @ mh + (xh @ ml + xl @ mh)


class _Rotation:
    """A fixed random orthogonal map of size d, applied in float32 to the last axis."""

    def __init__(self, d: int, kind: str, key):
        self.d, self.kind = d, kind
        if kind == "hadamard":
            k1, k2 = mx.random.split(key)
            self.signs = [mx.where(mx.random.bernoulli(key=k, shape=(d,)), 1.0, -1.0)
                          for k in (k1, k2)]
        else:
            g = mx.random.normal((d, d), key=key, dtype=mx.float32)
            q, r = mx.linalg.qr(g, stream=mx.cpu)
            self.matrix = q * mx.sign(mx.diagonal(r))[None]  # Haar-distributed
            self._parts = {t: _split(m) for t, m in (("T", self.matrix.T),
                                                      ("", self.matrix))}

    def rotate(self, x: mx.array) -> mx.array:
        if self.kind == "hadamard":
            for s in self.signs:
                x = mx.hadamard_transform(x * s, scale=1 / math.sqrt(self.d))
            return x
        return _matmul(x, self._parts["T"])

    def unrotate(self, y: mx.array) -> mx.array:
        if self.kind == "hadamard":
            for s in reversed(self.signs):
                y = mx.hadamard_transform(y, scale=1 / math.sqrt(self.d)) * s
            return y
        return _matmul(y, self._parts[""])


class TurboCodec:
    name = "turboquant"
    attends = True  # decode attends over the codes (fused on CUDA, plain MLX elsewhere)

    def __init__(self, dim: int, key_bits: float = 4, value_bits: float = 4,
                 rotation: str = "hadamard", seed: int = 0, channels: dict | None = None):
        """`channels` (fractional bits only): per side ("k", "v") and kv head, the channel
        order that puts the outlier half first (`calibrate`)."""
        self.dim, self.key_bits, self.value_bits = dim, key_bits, value_bits
        self.rotation, self.seed = rotation, seed
        split = [w for w in "kv" if self._bits(w) != int(self._bits(w))]
        if split and dim % 2:
            raise ValueError(f"a fractional rate splits the channels in halves: {dim} is odd")
        sizes = {dim // 2 if w in split else dim for w in "kv"}
        if rotation == "hadamard" and not all(hadamard_ok(d) for d in sizes):
            raise ValueError(f"no Hadamard transform of size {min(sizes)}")
        key = mx.random.key(seed)  # (the whole head's rotation as before the split existed)
        self.rotations = {d: _Rotation(d, rotation, key if d == dim
                                       else mx.random.split(key, 3)[2]) for d in sizes}
        # without `channels` a split codec is a template: Scheme.calibrate makes the
        # per-layer codecs from it, and it encodes nothing itself
        self.channels = channels
        self._split = split
        self._order = {}  # side -> (order, inverse), each (1, heads, 1, dim)
        for w in split if channels else ():
            order = mx.array(channels[w], dtype=mx.int32)
            self._order[w] = (order[None, :, None], mx.argsort(order, axis=-1)[None, :, None])
        self.books = {(b, n): self._book(b, n) for w in "kv" for b, _, n in self._segments(w)}
        # the fused decode kernels: MLX's CUDA backend, whole bits (tests/test_kv_cuda.py)
        self.fused = (cuda_decode.available() and key_bits == int(key_bits)
                      and value_bits == int(value_bits))
        self.fused_encode = cuda_decode.available()  # whole bits (one segment) only

    @property
    def needs_channels(self) -> bool:
        """A split codec without its outlier channels (a template)."""
        return bool(self._split) and not self.channels

    def with_channels(self, channels: dict) -> TurboCodec:
        return TurboCodec(self.dim, self.key_bits, self.value_bits, self.rotation, self.seed,
                          {w: channels[w] for w in self._split})

    def _book(self, bits: int, n: int):
        """Centroids and thresholds for unit vectors of n coordinates (~N(0, 1/n) each)."""
        h = mx.array(CENTROIDS[bits], dtype=mx.float32) / math.sqrt(n)
        c = mx.concatenate([-h[::-1], h])
        return c, (c[1:] + c[:-1]) / 2  # centroids, decision thresholds

    def _bits(self, which: str) -> float:
        return self.key_bits if which == "k" else self.value_bits

    def _segments(self, which: str) -> list[tuple[int, int, int]]:
        """(bits, first channel, channels): the vectors a head vector is stored as, each
        with its own norm and rotation. 3.5 bits: the outlier half (first, in the
        calibrated channel order) at 4 bits, the rest at 3."""
        bits, d = self._bits(which), self.dim
        if bits == int(bits):
            return [(int(bits), 0, d)]
        lo, half = int(bits), d // 2
        return [(lo + 1, 0, half), (lo, half, d - half)]

    def to_json(self) -> str:
        return json.dumps({"codec": self.name, "dim": self.dim, "key_bits": self.key_bits,
                           "value_bits": self.value_bits, "rotation": self.rotation,
                           "seed": self.seed, "channels": self.channels})

    # -- channel order and rotation (float32) -------------------------------------------
    def _permute(self, x: mx.array, which: str, inverse: bool = False) -> mx.array:
        """x's channels in the calibrated order (outliers first), or back. x: (B, H, T, D)."""
        if which not in self._split:
            return x
        if which not in self._order:
            raise RuntimeError("a split codec without its outlier channels encodes nothing: "
                               "Scheme.calibrate makes the per-layer codecs")
        idx = self._order[which][1 if inverse else 0]
        return mx.take_along_axis(x, mx.broadcast_to(idx, x.shape), axis=-1)

    def rotate(self, x: mx.array, which: str = "k") -> mx.array:
        """Each segment of x (channels in the calibrated order) rotated on its own."""
        segs = self._segments(which)
        if len(segs) == 1:
            return self.rotations[self.dim].rotate(x)
        return mx.concatenate([self.rotations[n].rotate(x[..., a:a + n]) for _, a, n in segs],
                              axis=-1)

    def unrotate(self, y: mx.array, which: str = "k") -> mx.array:
        segs = self._segments(which)
        if len(segs) == 1:
            return self.rotations[self.dim].unrotate(y)
        return mx.concatenate([self.rotations[n].unrotate(y[..., a:a + n])
                               for _, a, n in segs], axis=-1)

    # -- codes -----------------------------------------------------------------------
    # Indices are packed densely: coordinate j of a run takes bits [j*b, j*b + b) of the
    # run's words, crossing word boundaries where it must (3 bits: 32 indices in 3 words).
    @staticmethod
    def _block(bits: int) -> int:
        """Indices per whole number of words: 8 at 4 bits, 16 at 2, 32 at 3."""
        return 32 // math.gcd(32, bits)

    @classmethod
    def _words(cls, bits: int, n: int) -> int:
        block = cls._block(bits)
        return -(-n // block) * block * bits // 32

    def words(self, which: str) -> int:
        return sum(self._words(b, n) for b, _, n in self._segments(which))

    @functools.cache  # noqa: B019 (a handful of (bits, n) pairs per codec)
    def _layout(self, bits: int, n: int):
        """Per coordinate: its first word, the shift there, and the spill into the next."""
        pos = mx.arange(n, dtype=mx.uint32) * bits
        word, shift = pos // 32, pos % 32
        spill = (shift + bits) > 32
        return word, shift, spill, mx.where(spill, 32 - shift, 0).astype(mx.uint32)

    def _pack(self, idx: mx.array, bits: int) -> mx.array:
        n = idx.shape[-1]
        words = self._words(bits, n)
        word, shift, spill, back = self._layout(bits, n)
        onehot = mx.arange(words, dtype=mx.uint32)[:, None] == word[None]  # (words, n)
        spills = (mx.arange(words, dtype=mx.uint32)[:, None] == word[None] + 1) & spill[None]
        x = idx[..., None, :]  # disjoint bits: a sum is an OR
        lo = mx.where(onehot, x << shift, 0)
        hi = mx.where(spills, x >> mx.maximum(back, 1), 0)
        return (lo + hi).sum(axis=-1).astype(mx.uint32)

    def _unpack(self, packed: mx.array, bits: int, n: int) -> mx.array:
        if 32 % bits == 0:  # no index crosses a word: shift every word at once
            shifts = mx.arange(32 // bits, dtype=mx.uint32) * bits
            idx = (packed[..., None] >> shifts) & ((1 << bits) - 1)
            return idx.reshape(*packed.shape[:-1], -1)[..., :n]
        word, shift, spill, back = self._layout(bits, n)
        lo = packed[..., word] >> shift
        nxt = mx.minimum(word + 1, packed.shape[-1] - 1)
        hi = mx.where(spill, packed[..., nxt] << back, 0)
        return (lo | hi) & ((1 << bits) - 1)

    def encode(self, x: mx.array, which: str) -> tuple:
        x = self._permute(x.astype(mx.float32), which)
        segments = self._segments(which)
        norms = [mx.linalg.norm(x[..., a:a + n], axis=-1, keepdims=True) for _, a, n in segments]
        units = [x[..., a:a + n] / mx.maximum(nm, 1e-12)
                 for (_, a, n), nm in zip(segments, norms, strict=True)]
        y = self.rotate(units[0] if len(units) == 1 else mx.concatenate(units, axis=-1), which)
        n = norms[0] if len(norms) == 1 else mx.concatenate(norms, axis=-1)
        if len(segments) == 1 and self.fused_encode:
            bits = segments[0][0]
            return (turboquant_cuda.pack(y, self.books[(bits, self.dim)][1], bits,
                                         self.words(which)), n.astype(mx.float16))
        packed = []
        for bits, at, count in segments:
            _, thresholds = self.books[(bits, count)]
            idx = (y[..., at:at + count, None] > thresholds).sum(axis=-1).astype(mx.uint32)
            packed.append(self._pack(idx, bits))
        return mx.concatenate(packed, axis=-1), n.astype(mx.float16)

    def _centroids(self, codes: tuple, which: str) -> mx.array:
        """Each segment's n * c[idx]: the vectors in (per segment) rotated space, float32."""
        packed, n = codes
        n = n.astype(mx.float32)
        parts, word = [], 0
        for s, (bits, _, count) in enumerate(self._segments(which)):
            words = self._words(bits, count)
            idx = self._unpack(packed[..., word:word + words], bits, count)
            parts.append(self.books[(bits, count)][0][idx] * n[..., s:s + 1])
            word += words
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)

    def decode(self, codes: tuple, which: str, dtype) -> mx.array:
        x = self.unrotate(self._centroids(codes, which), which)
        return self._permute(x, which, inverse=True).astype(dtype)

    def empty(self, lead: tuple, steps: int, dim: int, dtype, which: str) -> tuple:
        return (mx.zeros((*lead, steps, self.words(which)), mx.uint32),
                mx.zeros((*lead, steps, len(self._segments(which))), mx.float16))

    def attend(self, queries, keys, values, scale: float, mask) -> mx.array:
        """Attention in the rotated space: rotate q once, weight the values there, rotate
        the output back once (all float32). With an outlier split, q takes the keys'
        channel order and segments, the output leaves the values' (scores sum over
        segments: the permuted dot product is the same one)."""
        B, n_q_heads, L, D = queries.shape
        n_kv_heads = keys[0].shape[-3]
        r = n_q_heads // n_kv_heads
        q = self._permute(queries.astype(mx.float32).reshape(B, n_kv_heads, r * L, D), "k")
        q = self.rotate(q, "k") * scale
        if L == 1 and self.fused:
            out = turboquant_cuda.attend(self, q.reshape(B, n_kv_heads, r, D), keys, values,
                                         None if isinstance(mask, str) else mask)
            return self.unrotate(out).reshape(B, n_q_heads, 1, D).astype(queries.dtype)
        q = q.reshape(B, n_kv_heads, r, L, D)
        k = mx.expand_dims(self._centroids(keys, "k"), 2)  # (B, Hkv, 1, T, D)
        v = mx.expand_dims(self._centroids(values, "v"), 2)
        p = masked_softmax(q @ k.swapaxes(-1, -2), mask, grouped=True)
        out = self.unrotate(p @ v, "v").reshape(B, n_kv_heads, r * L, D)
        return self._permute(out, "v", inverse=True).reshape(B, n_q_heads, L, D) \
            .astype(queries.dtype)


def calibrate(model, layers, seed: int, tokens: int = 256) -> dict:
    """Per layer in `layers`, per side and kv head: the channel order with the half of
    largest mean |x| first, from one pass of the model over `tokens` token ids drawn with
    `seed` (the same for a model and seed). Layer -> {"k": [[...]], "v": [[...]]}."""
    from mlx_lm.models.cache import make_prompt_cache

    vocab = getattr(getattr(model, "args", None), "vocab_size", 256)
    ids = mx.random.randint(0, vocab, (1, tokens), key=mx.random.key(seed))
    cache = make_prompt_cache(model)
    model(ids, cache=cache)
    out = {}
    for i in layers:
        c = cache[i]
        k, v = c.keys[..., :c.offset, :], c.values[..., :c.offset, :]
        out[i] = {w: mx.argsort(-mx.abs(x.astype(mx.float32)).mean(axis=(0, 2)),
                                axis=-1).tolist() for w, x in (("k", k), ("v", v))}
    return out


CODECS[TurboCodec.name] = TurboCodec
