"""kv=native: KV in the compute dtype, held in mlx-lm's own batch cache classes.

Their arithmetic is what mlx-lm's BatchGenerator runs, so a native row is token-exact
with it at the same B. What is added here is per-row rollback.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, BatchKVCache, BatchRotatingKVCache


class FullLayout(BatchKVCache):
    """Full attention: rows left-padded to the shared write cursor `_idx`; `offset` per row."""

    @classmethod
    def merge(cls, caches):
        out = super().merge(caches)
        out.__class__ = cls  # mlx-lm builds an empty merge as a plain BatchKVCache
        return out

    def rollback(self, i: int, n: int) -> None:
        roll_row_back(self, i, n)


def roll_row_back(layout, i: int, n: int) -> None:
    """Drop row i's last n tokens: its data moves n slots right, so it still ends at the
    shared cursor, and the n slots it frees on the left become padding (masked). No other
    row moves, and the cursor where the next token is written stays where it is."""
    if n <= 0:
        return
    length = int((layout.offset[i]).item())
    if n > length:
        raise ValueError(f"cannot roll row {i} back by {n}: it holds {length} tokens")
    end = layout._idx
    for name in ("keys", "values"):
        buf = getattr(layout, name)
        parts = buf if isinstance(buf, tuple) else (buf,)
        moved = []
        for x in parts:
            x[i:i + 1, :, n:end] = x[i:i + 1, :, :end - n]
            moved.append(x)
        setattr(layout, name, tuple(moved) if isinstance(buf, tuple) else moved[0])
    step = mx.zeros(layout.offset.shape, dtype=layout.offset.dtype).at[i].add(n)
    layout.offset = layout.offset - step
    layout.left_padding = layout.left_padding + step.astype(layout.left_padding.dtype)


class SlidingLayout(BatchRotatingKVCache):
    """Sliding window: each row keeps its last `max_size` tokens (mlx-lm's rotation)."""

    def rollback(self, i: int, n: int) -> None:
        raise NotImplementedError("a sliding-window layer cannot roll a row back yet "
                                  "(its window may have wrapped over the dropped tokens)")


class RecurrentLayout(ArraysCache):
    """Recurrent (SSM / linear attention) state: constant size per row."""

    def rollback(self, i: int, n: int) -> None:
        raise NotImplementedError("a recurrent layer rolls back from state snapshots, "
                                  "which this layout does not take yet")
