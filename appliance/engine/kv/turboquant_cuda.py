"""TurboQuant on MLX's CUDA backend (`mx.fast.cuda_kernel`). Decode attention is two kernels:
scores straight from the packed key codes, then the values weighted in rotated space straight
from the packed value codes, so no float K or V is materialized. Encoding a decode step's new
token is one kernel (threshold, then pack): in plain MLX it is ~30 small ops per layer, K and V
each, and at decode sizes MLX's CUDA backend is bound by launches, not bytes.

The codes are read in place through their strides (a layout's buffer sliced to its cursor
is not copied). Used for one query token per row (decode) with whole bits (2, 3, 4);
everything else takes the plain-MLX path in turboquant.py. tests/test_kv_cuda.py checks the
two against each other on a CUDA device (it is skipped elsewhere).
"""

from __future__ import annotations

import functools

import mlx.core as mx

from appliance.engine.kv import cuda_decode

_SCORES = """
    size_t gid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int H = kp_shape[1], T = kp_shape[2];
    size_t BH = (size_t)kp_shape[0] * H;
    if (gid >= BH * T) return;
    size_t bh = gid / T, b = bh / H, h = bh % H;
    int t = gid % T;
    const uint32_t* words = kp + b * kp_strides[0] + h * kp_strides[1] + t * kp_strides[2];
    const float* qb = q + bh * R * D;
    float acc[R];
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int j = 0; j < D; ++j) {
        int pos = j * BITS, w = pos >> 5, s = pos & 31;
        uint32_t v = words[w] >> s;
        if (s + BITS > 32) v |= words[w + 1] << (32 - s);
        float c = book[v & ((1u << BITS) - 1u)];
        for (int r = 0; r < R; ++r) acc[r] += qb[r * D + j] * c;
    }
    float n = (float)kn[b * kn_strides[0] + h * kn_strides[1] + t * kn_strides[2]];
    for (int r = 0; r < R; ++r) scores[(bh * R + r) * T + t] = acc[r] * n;
"""

_VALUES = """
    size_t gid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int H = vp_shape[1], T = vp_shape[2];
    size_t BH = (size_t)vp_shape[0] * H;
    int C = (T + CHUNK - 1) / CHUNK;
    if (gid >= BH * C * D) return;
    int j = gid % D;
    size_t rest = gid / D;
    int c = rest % C;
    size_t bh = rest / C, b = bh / H, h = bh % H;
    int w = (j * BITS) >> 5, shift = (j * BITS) & 31;
    bool spill = shift + BITS > 32;
    float acc[R];
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    int t1 = min(T, (c + 1) * CHUNK);
    for (int t = c * CHUNK; t < t1; ++t) {
        const uint32_t* words = vp + b * vp_strides[0] + h * vp_strides[1] + t * vp_strides[2];
        uint32_t code = words[w] >> shift;
        if (spill) code |= words[w + 1] << (32 - shift);
        float v = book[code & ((1u << BITS) - 1u)]
            * (float)vn[b * vn_strides[0] + h * vn_strides[1] + t * vn_strides[2]];
        for (int r = 0; r < R; ++r) acc[r] += p[(bh * R + r) * T + t] * v;
    }
    for (int r = 0; r < R; ++r) part[((bh * C + c) * R + r) * D + j] = acc[r];
"""

# One thread per output word: the codes of every coordinate whose bits touch it (a 3-bit
# code may straddle two words; the high bits of one from the previous word come first).
_PACK = """
    size_t gid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= (size_t)y_shape[0] * W) return;
    const float* yv = y + (gid / W) * D;
    int w = gid % W;
    uint32_t out = 0u;
    int hi = min(D, (32 * w + 32 + BITS - 1) / BITS);
    for (int j = (32 * w) / BITS; j < hi; ++j) {
        float x = yv[j];
        uint32_t idx = 0u;
        for (int i = 0; i < (1 << BITS) - 1; ++i) idx += x > th[i] ? 1u : 0u;
        int pos = j * BITS - 32 * w;
        out |= pos >= 0 ? (idx << pos) : (idx >> (-pos));
    }
    packed[gid] = out;
"""


@functools.cache
def _pack_kernel():
    return mx.fast.cuda_kernel(name="tq_pack", input_names=["y", "th"],
                               output_names=["packed"], source=_PACK)


def pack(y: mx.array, thresholds: mx.array, bits: int, words: int) -> mx.array:
    """The packed Lloyd-Max indices of rotated unit vectors `y` (..., D) float32: the same
    words as TurboCodec's plain-MLX threshold-and-pack (tests/test_kv_cuda.py)."""
    lead, D = y.shape[:-1], y.shape[-1]
    flat = y.reshape(-1, D)
    (out,) = _pack_kernel()(
        inputs=[flat, thresholds], template=[("D", D), ("BITS", bits), ("W", words)],
        grid=(flat.shape[0] * words, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(flat.shape[0], words)], output_dtypes=[mx.uint32])
    return out.reshape(*lead, words)


@functools.cache
def _kernels():
    scores = mx.fast.cuda_kernel(name="tq_scores", input_names=["q", "kp", "kn", "book"],
                                 output_names=["scores"], source=_SCORES,
                                 ensure_row_contiguous=False)
    values = mx.fast.cuda_kernel(name="tq_values", input_names=["p", "vp", "vn", "book"],
                                 output_names=["part"], source=_VALUES,
                                 ensure_row_contiguous=False)
    return scores, values


def attend(codec, q_rot: mx.array, keys, values, mask) -> mx.array:
    """Rotated-space attention for one query per row. `q_rot`: (B, Hkv, R, D) float32,
    rotated and scaled. Returns the output in rotated space, (B, Hkv, R, D) float32."""
    kb, vb = int(codec.key_bits), int(codec.value_bits)
    (kp, kn), (vp, vn) = keys, values
    return cuda_decode.attend(_kernels(), q_rot, [kp, kn, codec.books[(kb, codec.dim)][0]],
                              [vp, vn, codec.books[(vb, codec.dim)][0]],
                              [("WK", kp.shape[-1]), ("BITS", kb)],
                              [("WV", vp.shape[-1]), ("BITS", vb)], mask)
