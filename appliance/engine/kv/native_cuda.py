"""Masked decode attention over float KV as two CUDA kernels (`mx.fast.cuda_kernel`), for
MLX's CUDA backend.

Why: a batched decode step's rows are left-padded, so attention gets an array mask, and MLX's
CUDA backend runs its fused one-query kernel only without one; with a mask it takes a path
that is several times slower. Measured on an H200 (Llama-3-8B shape in bf16, 16 rows of 3.5k
tokens): a whole decode step took 26.7 ms over mlx-lm's BatchKVCache against 10.0 ms over
plain caches of the same width, the difference being attention (docs/benchmarks.md, 19th
session). These kernels read the mask per key instead: split-K ("flash decoding"), one block
per (row, kv head, chunk of CHUNK keys) with an online softmax per warp for the head's whole
query group, then a combine across chunks. K and V are read in place through their strides
(a layout's buffer sliced to its cursor is not copied).

`install()` routes `mx.fast.scaled_dot_product_attention` here for what the kernels cover
(one query token, a [B or 1, 1, 1, T] bool or additive mask, head dim 64/128/256, a query
group of at most 8); everything else goes to MLX as before. tests/test_kv_cuda.py checks them
against MLX on a CUDA device (skipped elsewhere).
"""

from __future__ import annotations

import functools

import mlx.core as mx

from appliance.engine.kv.cuda_decode import available
from appliance.plan.kv import NATIVE_CUDA_DIMS as DIMS  # what the plan says runs here

CHUNK = 256  # keys per block
WARPS = 4
MAX_GROUP = 8  # query heads per kv head held in registers

_PARTIAL = """
    constexpr int E = D / 32;
    int H = k_shape[1], T = k_shape[2];
    int C = (T + CHUNK - 1) / CHUNK;
    int c = blockIdx.x % C, bh = blockIdx.x / C, b = bh / H, h = bh % H;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float sc = scale[0];
    float qv[R][E], m[R], l[R], o[R][E];
    for (int r = 0; r < R; ++r) {
        const auto* qr = q + b * q_strides[0] + (h * R + r) * q_strides[1];
        for (int i = 0; i < E; ++i) {
            qv[r][i] = (float)qr[(lane * E + i) * q_strides[3]] * sc;
            o[r][i] = 0.0f;
        }
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    const auto* kb = k + b * k_strides[0] + h * k_strides[1];
    const auto* vb = v + b * v_strides[0] + h * v_strides[1];
    const auto* mrow = mask + (mask_shape[0] == 1 ? 0 : b) * mask_strides[0];
    int t1 = min(T, (c + 1) * CHUNK);
    for (int t = c * CHUNK + warp; t < t1; t += WARPS) {
        float add = 0.0f;
        if (BOOL_MASK) {
            if (!mrow[t * mask_strides[3]]) continue;
        } else {
            add = (float)mrow[t * mask_strides[3]];
            if (add == -INFINITY) continue;
        }
        float kv[E], vv[E];
        for (int i = 0; i < E; ++i) {
            kv[i] = (float)kb[t * k_strides[2] + (lane * E + i) * k_strides[3]];
            vv[i] = (float)vb[t * v_strides[2] + (lane * E + i) * v_strides[3]];
        }
        for (int r = 0; r < R; ++r) {
            float s = 0.0f;
            for (int i = 0; i < E; ++i) s += qv[r][i] * kv[i];
            for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffff, s, off);
            s += add;
            float mn = fmaxf(m[r], s), f = expf(m[r] - mn), p = expf(s - mn);
            l[r] = l[r] * f + p;
            for (int i = 0; i < E; ++i) o[r][i] = o[r][i] * f + p * vv[i];
            m[r] = mn;
        }
    }
    __shared__ float sm[WARPS][R], sl[WARPS][R], so[WARPS][R][D];
    for (int r = 0; r < R; ++r) {
        if (lane == 0) { sm[warp][r] = m[r]; sl[warp][r] = l[r]; }
        for (int i = 0; i < E; ++i) so[warp][r][lane * E + i] = o[r][i];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < R * D; idx += blockDim.x) {
        int r = idx / D, j = idx % D;
        float M = -INFINITY, L = 0.0f, O = 0.0f;
        for (int w = 0; w < WARPS; ++w) M = fmaxf(M, sm[w][r]);
        if (M != -INFINITY) {
            for (int w = 0; w < WARPS; ++w) {
                float f = expf(sm[w][r] - M);
                L += sl[w][r] * f;
                O += so[w][r][j] * f;
            }
        }
        size_t at = ((size_t)bh * C + c) * R + r;
        part_o[at * D + j] = O;
        if (j == 0) { part_m[at] = M; part_l[at] = L; }
    }
"""

# One thread per output coordinate: the chunks' partial sums, rescaled to one maximum.
_COMBINE = """
    size_t gid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int C = part_m_shape[1];
    size_t n = (size_t)part_m_shape[0] * R * D;
    if (gid >= n) return;
    int j = gid % D;
    size_t br = gid / D, bh = br / R;
    int r = br % R;
    float M = -INFINITY, L = 0.0f, O = 0.0f;
    for (int c = 0; c < C; ++c) M = fmaxf(M, part_m[(bh * C + c) * R + r]);
    for (int c = 0; c < C; ++c) {
        size_t at = (bh * C + c) * R + r;
        float mc = part_m[at];
        if (mc == -INFINITY) continue;
        float f = expf(mc - M);
        L += part_l[at] * f;
        O += part_o[at * D + j] * f;
    }
    out[gid] = O / L;
"""


@functools.cache
def _kernels():
    partial = mx.fast.cuda_kernel(
        name="native_decode_partial", input_names=["q", "k", "v", "mask", "scale"],
        output_names=["part_o", "part_m", "part_l"], source=_PARTIAL,
        ensure_row_contiguous=False)
    combine = mx.fast.cuda_kernel(
        name="native_decode_combine", input_names=["part_o", "part_m", "part_l"],
        output_names=["out"], source=_COMBINE)
    return partial, combine


def covers(q: mx.array, k: mx.array, mask) -> bool:
    """Whether the kernels take this call (else MLX's own attention does)."""
    if not isinstance(mask, mx.array) or q.ndim != 4 or q.shape[2] != 1 or mask.ndim != 4:
        return False
    B, Hq, _, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    return (D in DIMS and k.shape[3] == D and Hq % Hkv == 0 and Hq // Hkv <= MAX_GROUP
            and mask.shape[0] in (1, B) and mask.shape[1] == 1 and mask.shape[2] == 1
            and mask.shape[3] == T and T > 0
            and (mask.dtype == mx.bool_ or mx.issubdtype(mask.dtype, mx.floating)))


def attend(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array) -> mx.array:
    """One query token per row over K/V (B, Hkv, T, D), `mask` [B or 1, 1, 1, T] (True or
    0 = attend). Returns (B, Hq, 1, D) in q's dtype."""
    B, Hq, _, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    R, C = Hq // Hkv, -(-T // CHUNK)
    partial, combine = _kernels()
    part_o, part_m, part_l = partial(
        inputs=[q, k, v, mask, mx.array([scale], mx.float32)],
        template=[("D", D), ("R", R), ("CHUNK", CHUNK), ("WARPS", WARPS),
                  ("BOOL_MASK", mask.dtype == mx.bool_)],
        grid=(B * Hkv * C * 32 * WARPS, 1, 1), threadgroup=(32 * WARPS, 1, 1),
        output_shapes=[(B * Hkv, C, R, D), (B * Hkv, C, R), (B * Hkv, C, R)],
        output_dtypes=[mx.float32] * 3)
    n = B * Hq * D
    (out,) = combine(inputs=[part_o, part_m, part_l], template=[("D", D), ("R", R)],
                     grid=(-(-n // 256) * 256, 1, 1), threadgroup=(256, 1, 1),
                     output_shapes=[(B, Hq, 1, D)], output_dtypes=[q.dtype])
    return out


_mlx = getattr(mx.fast.scaled_dot_product_attention, "__wrapped__",
               mx.fast.scaled_dot_product_attention)


def _dispatch(queries, keys, values, *, scale, mask=None, sinks=None, **kw):
    if sinks is None and not kw and covers(queries, keys, mask):
        return attend(queries, keys, values, scale, mask)
    return _mlx(queries, keys, values, scale=scale, mask=mask, sinks=sinks, **kw)


_dispatch.__wrapped__ = _mlx


def install() -> None:
    """Route MLX's attention through the kernels where they apply (idempotent; only where
    MLX runs on CUDA)."""
    if available():
        mx.fast.scaled_dot_product_attention = _dispatch
