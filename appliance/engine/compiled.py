"""Decode steps and verify passes as compiled graphs (`mx.compile`), for models whose every
layer is full attention held natively.

Why: on a launch-bound backend (MLX's CUDA build on an H200) a decode step of a small model
costs its kernel launches and the Python that builds its graph, not its bytes. A compiled
pass builds the graph once per shape and fuses the elementwise work between the matmuls.
A verify pass (speculation) is synchronous: its tokens are read before the next proposal,
so none of its graph building hides behind the device, and compiling it matters more.

What makes a pass compilable is fixed shapes, with positions as arrays:
- each layer's whole KV buffer goes in and comes out (`FullLayout` keeps it, grown 256
  slots at a time), and the pass's n tokens per row are written at the shared cursor `idx`
  given as an array (`slice_update`), so the shapes change only when a buffer grows or the
  batch size changes, and a traced graph is reused for every other pass;
- attention spans the whole buffer, masked: query q of row b sees slot j when
  `left_padding[b] <= j <= idx + q`, exactly the slots the uncompiled pass reads; a pass
  of several tokens attends with plain matmuls (`quantized.DENSE`), as the uncompiled
  verify pass does on CUDA;
- each row's RoPE position is its `offset` (an array, as in mlx-lm's batch cache).
Sampling and logits processors stay outside: they differ per row and are cheap.

Plain decode steps are compiled only on request (`batch.compile_step`): on an H200 it
measured 1.16x at B=1 but 0.85x / 0.72x at B=8 / 32, the dynamic slice update copying the
buffer there (docs/benchmarks.md). Verify passes are compiled on CUDA
(`ContinuousScheduler`'s `compile_verify`).
"""

from __future__ import annotations

import mlx.core as mx

from appliance.engine.kv import quantized
from appliance.engine.kv.native import FullLayout


class _Slot:
    """A full-attention layer inside the traced pass: what the model's attention reads
    (`offset`, `make_mask`, `update_and_fetch`), over arrays that are the graph's inputs."""

    def __init__(self, keys, values, offset, left_padding, idx, dense: bool):
        self.keys, self.values = keys, values
        self.offset, self.left_padding, self.idx = offset, left_padding, idx
        if dense:  # mlx-lm sends a cache with `bits` to quantized._dispatch: DENSE attention
            self.bits = self.group_size = None

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs):
        if window_size is not None:
            raise ValueError("the compiled pass is for full attention")
        pos = mx.arange(self.keys.shape[2])
        last = self.idx + mx.arange(N)  # the slot each query token is written to
        mask = (pos[None, None] >= self.left_padding[:, None, None]) \
            & (pos[None, None] <= last[None, :, None])
        return mask[:, None]  # [B, 1, N, slots]

    def update_and_fetch(self, keys, values):
        self.keys = mx.slice_update(self.keys, keys, self.idx, axes=(2,))
        self.values = mx.slice_update(self.values, values, self.idx, axes=(2,))
        return self.keys, self.values


def compilable(model, layers: list) -> bool:
    """Every layer is a native full-attention layout that has been written, without
    holes, and the model keeps its layers in `layers`."""
    return bool(layers) and all(type(c) is FullLayout and c.keys is not None
                                and c._holes is None for c in layers) and hasattr(model, "layers")


STEP = FullLayout.step


def _on_grid(c: FullLayout, n: int) -> None:
    """Keep a buffer a multiple of STEP slots with room for n more tokens, so its size
    (a new trace) changes once per STEP tokens, not with every join or leave."""
    size = c.keys.shape[2]
    if size % STEP == 0 and c._idx + n <= size:
        return
    need = (c._idx + n + STEP - 1) // STEP * STEP
    if need > size:
        c.reserve(need - c._idx)
    c.keys, c.values = c.keys[..., :need, :], c.values[..., :need, :]


class CompiledDecode:
    """`compiled(tokens, layers)` -> logits [B, V]: one decode step; `forward(tokens, layers)`
    -> logits [B, n, V]: n tokens per row (a verify pass, right-padded). Both over `layers`
    (FullLayouts), which advance as the uncompiled pass would advance them."""

    def __init__(self, model):
        self.model = model
        tapped = getattr(model, "tapped", None)  # (speculate.Tapped: an MTP head reads them)

        def run(tokens, idx, offsets, pads, keys, values):
            n = tokens.shape[1]
            slots = [_Slot(*a, idx, n > 1) for a in zip(keys, values, offsets, pads, strict=True)]
            if tapped is not None:
                logits, hidden = tapped(tokens, cache=slots)
            else:
                logits, hidden = model(tokens, cache=slots), []
            return logits, hidden, [s.keys for s in slots], [s.values for s in slots]

        self._run = mx.compile(run)

    def __call__(self, tokens: mx.array, layers: list) -> mx.array:
        return self.forward(tokens[:, None], layers)[:, -1, :]

    def forward(self, tokens: mx.array, layers: list) -> mx.array:
        n = tokens.shape[1]
        for c in layers:
            _on_grid(c, n)
        idx = mx.array(layers[0]._idx, dtype=mx.int32)
        if n > 1:  # (read while tracing: a traced graph keeps the attention it was built with)
            quantized.install()
            was = quantized.dense_pass(True)
        try:
            logits, hidden, keys, values = self._run(tokens, idx, [c.offset for c in layers],
                                             [c.left_padding for c in layers],
                                             [c.keys for c in layers],
                                             [c.values for c in layers])
        finally:
            if n > 1:
                quantized.dense_pass(was)
        for c, k, v in zip(layers, keys, values, strict=True):
            c.keys, c.values = k, v
            c.offset = c.offset + n
            c._idx += n
        if not isinstance(hidden, list):  # a Tapped model keeps its last pass's hidden states
            self.model.hidden = hidden
        return logits
