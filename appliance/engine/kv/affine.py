"""kv=affine8|affine4|k8v4: `mx.quantize` codes, keys and values each at their own bits.

Per group of `group_size` elements of a head vector: packed words, a scale and a bias in
the compute dtype. Decode attends with `mx.quantized_matmul` (mlx-lm's quantized
attention, with per-tensor bits; with equal bits it is mlx-lm's arithmetic exactly).
MLX's CUDA backend has no such kernel for these shapes: there a decode step runs two fused
kernels over the codes (affine_cuda.py), and a multi-token pass dequantizes, then runs SDPA.
"""

from __future__ import annotations

import json

import mlx.core as mx
from mlx.utils import tree_map

from appliance.engine.kv import affine_cuda
from appliance.engine.kv.native import on_cuda
from appliance.engine.kv.quantized import CODECS, masked_softmax


class AffineCodec:
    name = "affine"

    def __init__(self, group_size: int = 64, key_bits: int = 8, value_bits: int = 8):
        self.group_size, self.key_bits, self.value_bits = group_size, key_bits, value_bits
        # MLX's CUDA backend has no quantized_matmul for attention's shapes ("No
        # implementation for problem shape", seen on the H200): there decode runs our fused
        # kernels where the widths allow (tests/test_kv_cuda.py), else the reference path.
        self.cuda = on_cuda()
        self.fused = self.cuda and key_bits in affine_cuda.BITS and value_bits in affine_cuda.BITS
        self.attends = self.fused or not self.cuda

    def _bits(self, which: str) -> int:
        return self.key_bits if which == "k" else self.value_bits

    def to_json(self) -> str:
        return json.dumps({"codec": self.name, "group_size": self.group_size,
                           "key_bits": self.key_bits, "value_bits": self.value_bits})

    def encode(self, x: mx.array, which: str) -> tuple:
        return tuple(mx.quantize(x, group_size=self.group_size, bits=self._bits(which)))

    def decode(self, codes: tuple, which: str, dtype) -> mx.array:
        return mx.dequantize(*codes, group_size=self.group_size,
                             bits=self._bits(which)).astype(dtype)

    def empty(self, lead: tuple, steps: int, dim: int, dtype, which: str) -> tuple:
        shape = (*lead, steps)
        return (mx.zeros((*shape, dim * self._bits(which) // 32), mx.uint32),
                mx.zeros((*shape, dim // self.group_size), dtype),
                mx.zeros((*shape, dim // self.group_size), dtype))

    def attend(self, queries, keys, values, scale: float, mask) -> mx.array:
        """mlx-lm's quantized attention, with keys and values at their own bits."""
        B, n_q_heads, L, D = queries.shape
        n_kv_heads = keys[0].shape[-3]
        n_repeats = n_q_heads // n_kv_heads
        if self.cuda:
            if L == 1:
                q = (queries.astype(mx.float32) * scale).reshape(B, n_kv_heads, n_repeats, D)
                out = affine_cuda.attend(self, q, keys, values,
                                         None if isinstance(mask, str) else mask)
                return out.reshape(B, n_q_heads, 1, D).astype(queries.dtype)
            dt = queries.dtype  # a multi-token pass (a verify): the reference arithmetic
            return mx.fast.scaled_dot_product_attention(
                queries, self.decode(keys, "k", dt), self.decode(values, "v", dt),
                scale=scale, mask=mask)
        queries = queries * scale
        k, v = tuple(keys), tuple(values)
        if n_repeats > 1:
            queries = mx.reshape(queries, (B, n_kv_heads, n_repeats, L, D))
            k = tree_map(lambda x: mx.expand_dims(x, axis=-3), k)
            v = tree_map(lambda x: mx.expand_dims(x, axis=-3), v)
        scores = mx.quantized_matmul(queries, *k, transpose=True, group_size=self.group_size,
                                     bits=self.key_bits)
        scores = masked_softmax(scores, mask, grouped=n_repeats > 1)
        out = mx.quantized_matmul(scores, *v, transpose=False, group_size=self.group_size,
                                  bits=self.value_bits)
        if n_repeats > 1:
            out = mx.reshape(out, (B, n_q_heads, L, D))
        return out


CODECS[AffineCodec.name] = AffineCodec
