"""What the fused CUDA decode kernels of every codec share (`mx.fast.cuda_kernel`, MLX's CUDA
backend): one query token per row, scores from the key codes, a masked softmax, then a
partial weighted sum of values per chunk of tokens, summed. Each codec (affine_cuda.py,
turboquant_cuda.py) brings its two kernels, their extra inputs and compile-time constants.
"""

from __future__ import annotations

import mlx.core as mx

from appliance.engine.kv.quantized import masked_softmax

CHUNK = 256  # tokens per partial sum in the value kernel (more blocks for long rows)


def available() -> bool:
    return mx.default_device() == mx.gpu and hasattr(mx, "cuda") and mx.cuda.is_available()


def attend(kernels, q: mx.array, key_inputs: list, value_inputs: list, key_consts: list,
           value_consts: list, mask) -> mx.array:
    """`q`: (B, Hkv, R, D) float32, scaled. `key_inputs` / `value_inputs` follow the query
    (or probabilities) into the kernels, the first one's token axis third; the kernels
    also get D, R and, for values, CHUNK. Returns (B, Hkv, R, D) float32."""
    scores_k, values_k = kernels
    B, H, R, D = q.shape
    T = key_inputs[0].shape[2]
    (scores,) = scores_k(
        inputs=[mx.contiguous(q), *key_inputs], template=[("D", D), ("R", R), *key_consts],
        grid=(B * H * T, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(B, H, R, T)], output_dtypes=[mx.float32])
    p = masked_softmax(scores, mask, grouped=False)  # scores (B, Hkv, R, T): no group axis
    chunks = -(-T // CHUNK)
    (part,) = values_k(
        inputs=[mx.contiguous(p), *value_inputs],
        template=[("D", D), ("R", R), *value_consts, ("CHUNK", CHUNK)],
        grid=(B * H * chunks * D, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(B, H, chunks, R, D)], output_dtypes=[mx.float32])
    return part.sum(axis=2)
