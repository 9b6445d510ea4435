"""The plain decode step as one compiled graph (`mx.compile`), for models whose every layer
is full attention held natively.

Why: on a launch-bound backend (MLX's CUDA build on an H200) a decode step of a small model
costs its kernel launches and the Python that builds its graph, not its bytes. A compiled
step builds the graph once per shape and fuses the elementwise work between the matmuls.

What makes it compilable is fixed shapes, with positions as arrays:
- each layer's whole KV buffer goes in and comes out (`FullLayout` keeps it, grown 256
  slots at a time), and the new token is written at the shared cursor `idx` given as an
  array (`slice_update`), so the shapes change only when a buffer grows or the batch size
  changes, and a traced graph is reused for every other step;
- attention spans the whole buffer, masked: slot j of row b is seen when
  `left_padding[b] <= j <= idx`, which is exactly the slots the uncompiled step reads;
- each row's RoPE position is its `offset` (an array, as in mlx-lm's batch cache).
Sampling and logits processors stay outside: they differ per row and are cheap.

Off by default (`batch.compile_step`): on an H200 it measured 1.16x at B=1 but 0.85x / 0.72x
at B=8 / 32, the dynamic slice update copying the buffer there (docs/benchmarks.md).
"""

from __future__ import annotations

import mlx.core as mx

from appliance.engine.kv.native import FullLayout


class _Slot:
    """A full-attention layer inside the traced step: what the model's attention reads
    (`offset`, `make_mask`, `update_and_fetch`), over arrays that are the graph's inputs."""

    def __init__(self, keys, values, offset, left_padding, idx):
        self.keys, self.values = keys, values
        self.offset, self.left_padding, self.idx = offset, left_padding, idx

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs):
        if N != 1 or window_size is not None:
            raise ValueError("the compiled step decodes one token per row, full attention")
        pos = mx.arange(self.keys.shape[2])
        mask = (pos[None] >= self.left_padding[:, None]) & (pos[None] <= self.idx)
        return mask[:, None, None, :]

    def update_and_fetch(self, keys, values):
        self.keys = mx.slice_update(self.keys, keys, self.idx, axes=(2,))
        self.values = mx.slice_update(self.values, values, self.idx, axes=(2,))
        return self.keys, self.values


def compilable(model, layers: list) -> bool:
    """Every layer is a native full-attention layout that has been written (and the model
    is a plain one: no hidden-state tap)."""
    return bool(layers) and all(type(c) is FullLayout and c.keys is not None
                                and c._holes is None for c in layers) and hasattr(model, "layers")


STEP = FullLayout.step


def _on_grid(c: FullLayout) -> None:
    """Keep a buffer a multiple of STEP slots with room for one more token, so its size
    (a new trace) changes once per STEP tokens, not with every join or leave."""
    size = c.keys.shape[2]
    if size % STEP == 0 and c._idx < size:
        return
    need = (c._idx + STEP) // STEP * STEP
    if need <= size:
        c.keys, c.values = c.keys[..., :need, :], c.values[..., :need, :]
    else:
        c.reserve(need - c._idx)
        c.keys, c.values = c.keys[..., :need, :], c.values[..., :need, :]


class CompiledDecode:
    """`step(model, tokens, layers)` -> logits [B, V]: one decode step over `layers`
    (FullLayouts), which advance as the uncompiled step would advance them."""

    def __init__(self, model):
        self.model = model

        def run(tokens, idx, offsets, pads, keys, values):
            slots = [_Slot(*a, idx) for a in zip(keys, values, offsets, pads, strict=True)]
            logits = model(tokens[:, None], cache=slots)[:, -1, :]
            return logits, [s.keys for s in slots], [s.values for s in slots]

        self._run = mx.compile(run)

    def __call__(self, tokens: mx.array, layers: list) -> mx.array:
        for c in layers:
            _on_grid(c)
        idx = mx.array(layers[0]._idx, dtype=mx.int32)
        logits, keys, values = self._run(tokens, idx, [c.offset for c in layers],
                                         [c.left_padding for c in layers],
                                         [c.keys for c in layers], [c.values for c in layers])
        for c, k, v in zip(layers, keys, values, strict=True):
            c.keys, c.values = k, v
            c.offset = c.offset + 1
            c._idx += 1
        return logits
