"""Quantized weights held dense (`model.dequantize`): each quantized layer becomes its
plain counterpart, with the very values the quantized kernels multiply by.

Why: on MLX's CUDA backend the quantized matmul is fast for one token and slow for many.
On an H200 (Llama-3-8B shape, 4-bit) a 512-token prefill over 2k cached tokens took 70.6 ms
quantized against 19.1 ms dense, a 16-row decode step 60.2 ms against 11.4 ms, and a
one-row step the same (8.0 / 7.7 ms); docs/benchmarks.md. The plan turns it on where it
pays and fits (`appliance.plan.source.dequantize`).
"""

from __future__ import annotations


def dequantize(model, dtype) -> int:
    """Replace every QuantizedLinear / QuantizedEmbedding of `model` in place by a Linear /
    Embedding whose weight is `mx.dequantize` of it, in `dtype`. Returns how many."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_unflatten

    def dense_weight(q):
        return mx.dequantize(q.weight, q.scales, q.get("biases"), q.group_size, q.bits,
                             mode=getattr(q, "mode", "affine"), dtype=dtype)

    swaps = []
    for name, q in model.named_modules():
        if isinstance(q, nn.QuantizedLinear):
            w = dense_weight(q)
            layer = nn.Linear(w.shape[1], w.shape[0], bias="bias" in q)
            layer.weight = w
            if "bias" in q:
                layer.bias = q.bias.astype(dtype)
        elif isinstance(q, nn.QuantizedEmbedding):
            w = dense_weight(q)
            layer = nn.Embedding(*w.shape)
            layer.weight = w
        else:
            continue
        swaps.append((name, layer))
    if swaps:
        model.update_modules(tree_unflatten(swaps))
        mx.eval(model.parameters())
    return len(swaps)
