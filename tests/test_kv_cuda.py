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


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
@pytest.mark.parametrize("dim,heads,rep,T", [(64, 8, 4, 700), (128, 8, 1, 33),
                                             (128, 2, 8, 1100)])
@pytest.mark.parametrize("additive", [False, True])
def test_native_masked_decode_equals_mlx(dtype, dim, heads, rep, T, additive):
    """The masked decode kernels (native_cuda) against MLX's own attention, over a buffer
    sliced to its cursor (read in place), rows left-padded by different amounts."""
    from appliance.engine.kv import native_cuda

    B = 3
    key = mx.random.key(3)
    k, v, q = (mx.random.normal(s, key=kk).astype(dtype) for s, kk in zip(
        [(B, heads, T + 40, dim), (B, heads, T + 40, dim), (B, heads * rep, 1, dim)],
        mx.random.split(key, 3), strict=True))
    k, v = k[..., :T, :], v[..., :T, :]
    pad = mx.array([0, 5, T - 1])
    mask = (mx.arange(T)[None] >= pad[:, None])[:, None, None, :]
    if additive:
        mask = mx.where(mask, 0.0, -mx.inf).astype(dtype)
    assert native_cuda.covers(q, k, mask)
    fused = native_cuda.attend(q, k, v, dim ** -0.5, mask)
    plain = native_cuda._mlx(q, k, v, scale=dim ** -0.5, mask=mask)
    assert fused.dtype == q.dtype and fused.shape == plain.shape
    tol = 2e-2 if dtype == mx.bfloat16 else 2e-3  # (float32 matmuls run as TF32 on CUDA)
    assert mx.abs(fused.astype(mx.float32) - plain.astype(mx.float32)).max().item() < tol


def test_batched_decode_takes_the_masked_kernel_and_keeps_its_tokens():
    """A batched step's decode attention goes through the kernels once a BatchStep exists,
    and greedy tokens over rows of different lengths equal those of MLX's own path."""
    from mlx.utils import tree_map
    from mlx_lm.models import llama

    from appliance.engine.kv import native_cuda
    from appliance.engine.step import BatchStep

    # random weights with a head dim the kernels take (the tiny test models' is 16), scaled
    # up so that greedy tokens vary from step to step (at init scale they repeat one token)
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs(
        model_type="llama", hidden_size=256, num_hidden_layers=2, intermediate_size=512,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
        vocab_size=4096, tie_word_embeddings=True))
    model.update(tree_map(lambda p: p * 3.0, model.parameters()))
    mx.eval(model.parameters())
    prompts = [[(7 * i + j) % 4000 + 1 for j in range(n)] for i, n in enumerate((40, 300, 9))]

    def run():
        step = BatchStep(model, set(), 4, 512)
        for p in prompts:
            step.insert([p], 24, lambda x: mx.argmax(x, axis=-1))
        out: dict[int, list[int]] = {}
        while len(step):
            for e in step.tick()[1]:
                out.setdefault(e.uid, []).append(e.token)
        return [out[u] for u in sorted(out)]

    taken = []
    real = native_cuda.attend
    native_cuda.attend = lambda *a: taken.append(1) or real(*a)
    try:
        fused = run()
        assert taken, "decode attention did not take the kernels"
        mx.fast.scaled_dot_product_attention = native_cuda._mlx
        plain = run()
    finally:
        native_cuda.attend = real
        native_cuda.install()
    assert fused == plain
