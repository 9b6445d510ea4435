"""The fused decode kernels (TurboQuant, affine) against the plain-MLX path, where MLX runs
on CUDA.

Skipped on other backends: the plan claims the kernels only where this test ran."""

from __future__ import annotations

import mlx.core as mx
import pytest

from appliance.engine.kv import cuda_decode
from appliance.engine.kv.affine import AffineCodec
from appliance.engine.kv.quantized import Codes
from appliance.engine.kv.turboquant import TurboCodec

pytestmark = pytest.mark.skipif(not cuda_decode.available(),
                                reason="needs MLX's CUDA backend")


@pytest.mark.parametrize("bits", [(4, 4), (3, 3), (4, 2)])
@pytest.mark.parametrize("dim,heads,rep,T", [(64, 8, 4, 700), (128, 8, 1, 33)])
@pytest.mark.parametrize("strided", [False, True])
def test_fused_decode_equals_the_plain_path(bits, dim, heads, rep, T, strided):
    codec = TurboCodec(dim, *bits)
    assert codec.fused
    B = 3
    key = mx.random.key(0)
    k, v, q = (mx.random.normal(s, key=kk) for s, kk in zip(
        [(B, heads, T, dim), (B, heads, T, dim), (B, heads * rep, 1, dim)],
        mx.random.split(key, 3), strict=True))
    keys = Codes(codec.encode(k, "k"), codec)
    values = Codes(codec.encode(v, "v"), codec)
    if strided:  # a layout's buffer sliced to its cursor: the kernels read it in place
        spare = Codes(codec.encode(mx.concatenate([k, k[:, :, :40]], axis=2), "k"), codec)
        keys = Codes(tuple(x[:, :, :T] for x in spare), codec)
    pad = mx.array([0, 5, T - 1])  # rows left-padded by different amounts
    mask = (mx.arange(T)[None] >= pad[:, None])[:, None, None, :]
    fused = codec.attend(q, keys, values, 0.125, mask)
    codec.fused = False
    plain = codec.attend(q, keys, values, 0.125, mask)
    assert mx.abs(fused - plain).max().item() < 1e-4


@pytest.mark.parametrize("bits", [(8, 8), (8, 4), (4, 4), (4, 2)])
@pytest.mark.parametrize("dim,heads,rep,T", [(64, 8, 4, 700), (128, 8, 1, 33)])
def test_fused_affine_decode_equals_dequantize_then_sdpa(bits, dim, heads, rep, T):
    """The affine kernels read a layout's buffer sliced to its cursor in place (strided)."""
    codec = AffineCodec(64, *bits)
    assert codec.fused
    B = 3
    key = mx.random.key(1)
    k, v, q = (mx.random.normal(s, key=kk).astype(mx.bfloat16) for s, kk in zip(
        [(B, heads, T + 40, dim), (B, heads, T + 40, dim), (B, heads * rep, 1, dim)],
        mx.random.split(key, 3), strict=True))
    keys = Codes(tuple(x[..., :T, :] for x in codec.encode(k, "k")), codec)  # strided views
    values = Codes(tuple(x[..., :T, :] for x in codec.encode(v, "v")), codec)
    pad = mx.array([0, 5, T - 1])
    mask = (mx.arange(T)[None] >= pad[:, None])[:, None, None, :]
    fused = codec.attend(q, keys, values, 0.125, mask)
    plain = mx.fast.scaled_dot_product_attention(
        q, codec.decode(keys, "k", mx.float32).astype(mx.bfloat16),
        codec.decode(values, "v", mx.float32).astype(mx.bfloat16), scale=0.125, mask=mask)
    assert mx.abs(fused.astype(mx.float32) - plain.astype(mx.float32)).max().item() < 2e-2


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("dim", [64, 128])
def test_fused_encode_equals_the_plain_path(bits, dim):
    """The encode kernel writes the same words and norms as plain MLX, 3-bit codes that
    straddle two words included."""
    codec = TurboCodec(dim, bits, bits)
    assert codec.fused_encode
    x = mx.random.normal((3, 8, 37, dim), key=mx.random.key(2)).astype(mx.bfloat16)
    fused = codec.encode(x, "k")
    codec.fused_encode = False
    plain = codec.encode(x, "k")
    assert fused[0].dtype == plain[0].dtype == mx.uint32
    assert mx.array_equal(fused[0], plain[0]).item()
    assert mx.array_equal(fused[1], plain[1]).item()
