"""How a pass's attention is shaped on CUDA, where MLX's backend builds graphs per shape and
fuses attention only for some masks: whole buffers and dense attention for passes of a few
tokens a row (`whole_buffers`), and the "causal" mask for a lone row's prefill (`fusable`,
`causal`). On other backends the callers leave these off. And, on every backend, what kind of
pass encoded layers attend for (`flagged`: a prefill chunk, a verify pass)."""

from __future__ import annotations

from appliance.engine.kv.native import FullLayout


class whole_buffers:
    """`with whole_buffers(layers, n, on)`: for a pass of n tokens per row, full-attention
    layouts attend over their whole buffers (see native.FullLayout); a no-op unless `on`, and
    where encoded layers sit beside native ones (the model builds one mask, from its first
    layer, for every full-attention layer: their key lengths must agree).

    `dense` (a pass of a few tokens a row: a verify, a drafter's): float KV, native layers'
    and a split layer's native rows' alike, is attended with plain matmuls and a softmax
    (`quantized.DENSE`), not MLX's fused attention, which on CUDA builds a cuDNN graph for
    every new (rows, key length) pair: 50-90 ms against a 5-8 ms verify step at B=16 on an
    H200, paid again whenever a row leaves or a buffer grows (2026-12-01 trace: a third of
    the speculative steps' time; beside encoded layers the key length is new every step).
    Prefill chunks keep the fused kernel (their scores would be chunk x keys per head)."""

    def __init__(self, layers: list, n: int, on: bool, dense: bool = False):
        full = [c for c in layers if isinstance(c, FullLayout) and c.keys is not None] \
            if on else []
        self.layers = [] if any(hasattr(c, "decode_like") for c in layers) else full
        self.dense = full if on and dense and n > 1 else None  # (None: no dense pass)
        self.n = n

    def __enter__(self):
        if self.dense is not None:
            from appliance.engine.kv import quantized

            quantized.install()
            self._was = quantized.dense_pass(True)
            for c in self.dense:  # mlx-lm sends a cache with `bits` to quantized._dispatch
                c.bits = c.group_size = None
        for c in self.layers:
            c.reserve(self.n)
            c.whole_buffer = True

    def __exit__(self, *exc):
        for c in self.layers:
            c.whole_buffer = False
        if self.dense is not None:
            from appliance.engine.kv import quantized

            quantized.dense_pass(self._was)
            for c in self.dense:
                del c.bits, c.group_size


def fusable(layers: list, rows: int) -> bool:
    """Whether a prefill pass over `layers` may take MLX's fused attention (`causal`): one
    row, every layout one that can hand out the "causal" mask (full attention, native or
    encoded: an encoded layer's prefill attends over float keys), no holes, no left
    padding.

    Why (on CUDA, where BatchStep asks): an array mask, which rows prefilled together need
    for their padding, runs MLX's CUDA attention unfused, with score matrices of chunk x
    keys per head. Measured on an H200 (1B shape, 2048-token chunks, warm): 17-23 ms and
    1.1-1.9 GiB a chunk fused against 49-203 ms and 9-25 GiB unfused as the context grew
    to 16k. The fused kernel builds a cuDNN graph per (chunk, keys) shape (~50 ms the first
    time), which whole buffers avoided; the unfused pass paid ~70-90 ms for its own new
    shapes too. Sliding-window and recurrent layers keep the array mask; the plan counts
    the unfused passes' score matrices (plan/derive.py: activations)."""
    return (rows == 1 and bool(layers)
            and all(getattr(c, "causal", None) is False and getattr(c, "_holes", None) is None
                    for c in layers)
            and not layers[0].left_padding.tolist()[0])  # (no new lazy op to wait for)


class flagged:
    """`with flagged(layers, name, on)`: for one pass, attribute `name` is True on each
    layout that has it (a no-op unless `on`)."""

    def __init__(self, layers: list, name: str, on: bool = True):
        self.layers = [c for c in layers if hasattr(c, name)] if on else []
        self.name = name

    def __enter__(self):
        for c in self.layers:
            setattr(c, self.name, True)

    def __exit__(self, *exc):
        for c in self.layers:
            setattr(c, self.name, False)


def causal(layers: list, on: bool) -> flagged:
    """The layouts of a `fusable` pass hand attention the "causal" mask, which MLX fuses."""
    return flagged(layers, "causal", on)


def prefilling(layers: list) -> flagged:
    """A prefill pass: encoded layers (a split layer's encoded part too) attend over float
    KV whatever the chunk's length (quantized._Stored)."""
    return flagged(layers, "prefill_like")
