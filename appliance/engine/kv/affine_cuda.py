"""Affine (`mx.quantize`) decode attention as two CUDA kernels (`mx.fast.cuda_kernel`), for
MLX's CUDA backend, which has no `quantized_matmul` for attention's shapes: scores straight
from the packed key codes and their scales and biases, then the values weighted straight from
the packed value codes, so no float K or V is materialized.

The codes are read in place through their strides: a layout's buffer sliced to its cursor is
not copied. Used for one query token per row (decode) at 2, 4 or 8 bits; everything else
dequantizes and runs fused SDPA (affine.py). tests/test_kv_cuda.py checks the kernels
against that path on a CUDA device (it is skipped elsewhere).
"""

from __future__ import annotations

import functools

import mlx.core as mx

from appliance.engine.kv import cuda_decode

BITS = (2, 4, 8)  # widths whose codes never straddle two 32-bit words

# One thread per (row, head, token): R query rows (the head's group) against one key.
_SCORES = """
    size_t gid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int H = kw_shape[1], T = kw_shape[2];
    size_t BH = (size_t)kw_shape[0] * H;
    if (gid >= BH * T) return;
    size_t bh = gid / T, b = bh / H, h = bh % H;
    int t = gid % T;
    const uint32_t* words = kw + b * kw_strides[0] + h * kw_strides[1] + t * kw_strides[2];
    size_t so = b * ks_strides[0] + h * ks_strides[1] + t * ks_strides[2];
    size_t zo = b * kz_strides[0] + h * kz_strides[1] + t * kz_strides[2];
    const float* qb = q + bh * R * D;
    float acc[R];
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int g = 0; g < D / GS; ++g) {
        float s = (float)ks[so + g * ks_strides[3]], z = (float)kz[zo + g * kz_strides[3]];
        for (int i = 0; i < GS; ++i) {
            int j = g * GS + i, pos = j * BITS;
            uint32_t c = (words[(pos >> 5) * kw_strides[3]] >> (pos & 31)) & ((1u << BITS) - 1u);
            float k = (float)c * s + z;
            for (int r = 0; r < R; ++r) acc[r] += qb[r * D + j] * k;
        }
    }
    for (int r = 0; r < R; ++r) scores[(bh * R + r) * T + t] = acc[r];
"""

# One thread per (row, head, chunk of tokens, coordinate): a partial weighted sum of values.
_VALUES = """
    size_t gid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int H = vw_shape[1], T = vw_shape[2];
    size_t BH = (size_t)vw_shape[0] * H;
    int C = (T + CHUNK - 1) / CHUNK;
    if (gid >= BH * C * D) return;
    int j = gid % D;
    size_t rest = gid / D;
    int c = rest % C;
    size_t bh = rest / C, b = bh / H, h = bh % H;
    int pos = j * BITS, g = j / GS;
    float acc[R];
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    int t1 = min(T, (c + 1) * CHUNK);
    for (int t = c * CHUNK; t < t1; ++t) {
        const uint32_t* words = vw + b * vw_strides[0] + h * vw_strides[1] + t * vw_strides[2];
        uint32_t code = (words[(pos >> 5) * vw_strides[3]] >> (pos & 31)) & ((1u << BITS) - 1u);
        float s = (float)vs[b * vs_strides[0] + h * vs_strides[1] + t * vs_strides[2]
                            + g * vs_strides[3]];
        float z = (float)vz[b * vz_strides[0] + h * vz_strides[1] + t * vz_strides[2]
                            + g * vz_strides[3]];
        float v = (float)code * s + z;
        for (int r = 0; r < R; ++r) acc[r] += p[(bh * R + r) * T + t] * v;
    }
    for (int r = 0; r < R; ++r) part[((bh * C + c) * R + r) * D + j] = acc[r];
"""


@functools.cache
def _kernels():
    scores = mx.fast.cuda_kernel(name="affine_scores", input_names=["q", "kw", "ks", "kz"],
                                 output_names=["scores"], source=_SCORES,
                                 ensure_row_contiguous=False)
    values = mx.fast.cuda_kernel(name="affine_values", input_names=["p", "vw", "vs", "vz"],
                                 output_names=["part"], source=_VALUES,
                                 ensure_row_contiguous=False)
    return scores, values


def attend(codec, q: mx.array, keys, values, mask) -> mx.array:
    """Attention for one query per row. `q`: (B, Hkv, R, D) float32, scaled. Returns
    (B, Hkv, R, D) float32."""
    gs = codec.group_size
    return cuda_decode.attend(_kernels(), q, list(keys), list(values),
                              [("GS", gs), ("BITS", codec.key_bits)],
                              [("GS", gs), ("BITS", codec.value_bits)], mask)
