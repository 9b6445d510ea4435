"""kv=native: KV in the compute dtype, held in mlx-lm's own batch cache classes.

Their arithmetic is what mlx-lm's BatchGenerator runs, so a native row is token-exact
with it at the same B. What is added here is per-row rollback.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, BatchKVCache, BatchRotatingKVCache


def on_cuda() -> bool:
    return mx.default_device() == mx.gpu and hasattr(mx, "cuda") and mx.cuda.is_available()


# Rows leaving trim their common left padding only in whole steps (see FullLayout.filter).
GRID_TRIM = on_cuda()


class FullLayout(BatchKVCache):
    """Full attention: rows left-padded to the shared write cursor `_idx`; `offset` per row.

    `whole_buffer` (a speculative verify on CUDA): attention sees the whole allocated
    buffer, the unwritten slots masked, so its key length changes once per 256 tokens
    rather than every step: MLX's CUDA backend compiles a multi-token attention for each
    new key length (measured on an H200: ~50 ms a pass against ~5.5 ms at a fixed one)."""

    whole_buffer = False
    exact_trim = False  # beside encoded layers: a filter trims all common padding (filter)
    # Slots a verify pass left behind in a row that kept fewer tokens than others (bool
    # [B, T], True = masked; None: none). A rollback masks them instead of rolling the
    # row's whole history right (a gather over every layer's K and V: a third of a verify
    # step at B=4 on a 2-core CPU). Slots past its width are not holes.
    _holes = None

    def reserve(self, n: int) -> None:
        """Allocate room for n more tokens now (the mask is built before the write), the
        buffer a whole number of steps wide: a buffer grown by whole steps from an
        off-grid cursor (767 + 256 = 1023) met a new width at almost every growth."""
        if self.keys is not None and self._idx + n <= self.keys.shape[2]:
            return
        self._regrow(-(-(self._idx + n) // self.step) * self.step - self._idx)

    def on_grid(self, n: int) -> None:
        """Make the buffer a whole number of `step` slots with room for n more tokens, as
        an array of its own (not a view of a longer one): MLX's CUDA attention keys its
        graphs on the buffer's strides too, so a prefix hit's exact-length buffer, or a
        view, would make every pass over it a new shape."""
        if self.keys is None:  # (its first write allocates whole steps)
            return
        need = -(-(self._idx + n) // self.step) * self.step
        size = self.keys.shape[2]
        if size % self.step == 0 and size >= need:
            return
        self._regrow(need - self._idx)

    def _regrow(self, room: int) -> None:
        """A new buffer: the slots up to the cursor, then `room` empty ones."""
        B, H, _, D = self.keys.shape
        self.keys = mx.concatenate(
            [self.keys[..., :self._idx, :], mx.zeros((B, H, room, D), self.keys.dtype)], 2)
        self.values = mx.concatenate(
            [self.values[..., :self._idx, :],
             mx.zeros((B, H, room, self.values.shape[3]), self.values.dtype)], 2)

    causal = False  # a lone row's pass over its exact keys: MLX's fused kernel (passes.causal)

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        if self.causal and N > 1:
            return "causal"
        mask = super().make_mask(N, return_array=return_array, **kwargs)
        if self.whole_buffer and self.keys is not None:
            extra = self.keys.shape[2] - (self._idx + N)
            if extra:
                mask = mx.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, extra)])
        if self._holes is not None:
            mask = mask & ~_width(self._holes, mask.shape[-1])[:, None, None]
        return mask

    def mask_tails(self, counts: list[int]) -> None:
        """drop_tails without moving data: each row's last counts[i] slots become holes.
        Those slots are the pass's own writes (its padding and rejected drafts), never
        older holes: counts[i] is at most the tokens the pass fed."""
        if any(counts):
            c = mx.array(counts)
            pos = mx.arange(self._idx)[None]
            new = (pos >= self._idx - c[:, None]).astype(mx.bool_)
            self._holes = new if self._holes is None else _width(self._holes, self._idx) | new
            self.offset = self.offset - c
        self._right_padding = None

    def holes_share(self) -> float:
        """Masked slots over all slots up to the cursor (0.0 without holes)."""
        if self._holes is None or not self._idx:
            return 0.0
        return _width(self._holes, self._idx).sum().item() / (self._holes.shape[0] * self._idx)

    def _held(self, i: int) -> list[int]:
        """The slots row i holds (past its left padding, not holes), in order."""
        pad, h = self.left_padding.tolist()[i], _width(self._holes, self._idx)[i].tolist()
        return [p for p in range(pad, self._idx) if not h[p]]

    def compaction(self) -> tuple[mx.array, list[int]] | None:
        """Where every row's held slots go to sit right-aligned again: a gather index
        (rows, width) and the rows' new left padding; width is a whole number of `step`
        slots (the CUDA shape policy's grid). None without holes."""
        if self._holes is None:
            return None
        held = [self._held(i) for i in range(self.left_padding.shape[0])]
        width = -(-max(map(len, held)) // self.step) * self.step
        return (mx.array([[0] * (width - len(k)) + k for k in held]),
                [width - len(k) for k in held])

    def compact(self, plan: tuple[mx.array, list[int]]) -> None:
        """Apply a `compaction` (the same for every layer of a batch: their holes agree)."""
        index, pads = plan
        B, width = index.shape
        for name in ("keys", "values"):
            x = getattr(self, name)
            at = mx.broadcast_to(index[:, None, :, None], (B, x.shape[1], width, x.shape[3]))
            setattr(self, name, mx.take_along_axis(x, at, axis=2))
        self.left_padding = mx.array(pads)
        self._idx, self._holes = width, None

    def finalize(self):
        """A pass's right padding: rolled away as mlx-lm does, or masked where the rows
        already carry holes (which a roll would move out of place)."""
        if self._holes is not None and self._right_padding is not None:
            return self.mask_tails(self._right_padding.tolist())
        super().finalize()

    def filter(self, batch_indices):
        """mlx-lm's: keep these rows, then trim their common left padding. On CUDA
        (`GRID_TRIM`) only whole `step`s of it, sliced before the gather, so the buffer
        stays its own array a whole number of steps wide: a decode step over a new key
        length or stride builds its CUDA graphs anew (on an H200 the steps after a row left
        took 16-29 ms against 3-5), and on the grid a batch size's shapes recur. Not beside
        encoded layers (`exact_trim`), which trim all of it: the model builds one mask for
        every full-attention layer, so their key lengths must agree."""
        keep = list(batch_indices)
        grid = GRID_TRIM and not self.exact_trim
        if not keep or (self._holes is None and not grid):
            return super().filter(batch_indices)
        rows, holes = mx.array(keep), self._holes
        pads = self.left_padding.tolist()  # (read on the host: a new lazy array would wait)
        trim = min(pads[i] for i in keep)  # as mlx-lm's
        if grid:
            trim = trim // self.step * self.step
            if self.keys is not None:
                self.keys = self.keys[..., trim:, :][rows]
                self.values = self.values[..., trim:, :][rows]
            self.offset = self.offset[rows]
            self.left_padding = mx.array([pads[i] - trim for i in keep],
                                         self.left_padding.dtype)
            self._idx -= trim
        else:
            super().filter(batch_indices)
        if holes is not None:
            holes = holes[rows][:, trim:]
            self._holes = holes if holes.any().item() else None

    def extend(self, other):
        if self._holes is None and getattr(other, "_holes", None) is None:
            return self._merge(other)
        top = max(self._idx, other._idx)  # (extend right-aligns both at the later cursor)

        def aligned(c):
            h = getattr(c, "_holes", None)
            h = mx.zeros((c.offset.shape[0], c._idx), mx.bool_) if h is None \
                else _width(h, c._idx)
            return mx.pad(h, [(0, 0), (top - c._idx, 0)])

        parts = [aligned(self), aligned(other)]
        self._merge(other)
        self._holes = mx.concatenate(parts)

    def put(self, i: int, other, j: int, pad: int) -> None:
        """Row j of `other` (left padding `pad`, no holes) into row i, in place: its
        slots right-aligned at this cursor, the slots before them masked by the left
        padding (a held row's old values stay there, finite, never attended)."""
        n = other._idx - pad
        start = self._idx - n
        self.keys[i:i + 1, :, start:self._idx, :] = other.keys[j:j + 1, :, pad:other._idx, :]
        self.values[i:i + 1, :, start:self._idx, :] = \
            other.values[j:j + 1, :, pad:other._idx, :]
        self.offset[i] = other.offset[j]
        self.left_padding[i] = start

    def _merge(self, other) -> None:
        """mlx-lm's `extend` (both right-aligned at the later cursor, in a buffer as long as
        the longer one, other's rows after these), written into one new buffer: mlx-lm pads
        each side, then concatenates, so the batch's rows are copied twice. The same values
        in the same slots. A merge of 6 layers at 8 rows of ~2.3k tokens: 38-51 ms against
        79-96 ms on a 2-core CPU, and MLX's peak above the inputs 115 MB against 241 MB."""
        if self.keys is None or other.keys is None:
            return BatchKVCache.extend(self, other)
        top = max(self._idx, other._idx)
        size, rows = max(self.keys.shape[2], other.keys.shape[2]), self.keys.shape[0]
        for name in ("keys", "values"):
            a = getattr(self, name)
            buf = mx.zeros((rows + other.offset.shape[0], a.shape[1], size, a.shape[3]),
                           a.dtype)
            for c, r in ((self, 0), (other, rows)):
                x, left = getattr(c, name), top - c._idx
                n = min(x.shape[2], size - left)  # (mlx-lm drops what runs past the end)
                buf[r:r + x.shape[0], :, left:left + n, :] = x[..., :n, :]
            setattr(self, name, buf)
        self.left_padding = mx.concatenate([self.left_padding + (top - self._idx),
                                            other.left_padding + (top - other._idx)])
        self.offset = mx.concatenate([self.offset, other.offset])
        self._idx = top

    def rollback(self, i: int, n: int) -> None:
        if self._holes is None:
            return roll_row_back(self, i, n)
        held = self._held(i)
        if n > len(held):
            raise ValueError(f"cannot roll row {i} back by {n}: it holds {len(held)} tokens")
        drop = mx.zeros((self._idx,), mx.bool_)
        if n:
            drop[mx.array(held[-n:])] = True
        self._holes = _width(self._holes, self._idx)
        self._holes[i] = self._holes[i] | drop
        self.offset = self.offset - mx.zeros_like(self.offset).at[i].add(n)

    def extract(self, i: int, upto: int | None = None):
        """Row i's cache as a KVCache; `upto`: only its first `upto` tokens (a checkpoint a
        prefill pass went past)."""
        from mlx_lm.models.cache import KVCache

        if self.keys is None:  # never written (a drafter's layer before it first ran)
            return KVCache()
        if self._holes is None and upto is None:
            return super().extract(i)
        if self._holes is None:
            pad = self.left_padding.tolist()[i]  # (no new lazy op: see filter)
            cache = KVCache()
            cache.keys = mx.contiguous(self.keys[i:i + 1, :, pad:pad + upto])
            cache.values = mx.contiguous(self.values[i:i + 1, :, pad:pad + upto])
            cache.offset = upto
            return cache
        if upto is not None:
            raise ValueError("a truncated extract of a row with holes")

        at = mx.array(self._held(i))
        cache = KVCache()
        cache.keys = mx.contiguous(self.keys[i:i + 1, :, at])
        cache.values = mx.contiguous(self.values[i:i + 1, :, at])
        cache.offset = cache.keys.shape[2]
        return cache

    def update_and_fetch(self, keys, values):
        k, v = super().update_and_fetch(keys, values)
        return (self.keys, self.values) if self.whole_buffer else (k, v)

    @classmethod
    def merge(cls, caches):
        out = super().merge(caches)
        out.__class__ = cls  # mlx-lm builds an empty merge as a plain BatchKVCache
        return out


def _width(holes: mx.array, n: int) -> mx.array:
    """`holes` cut or padded (not holes) to n slots."""
    w = holes.shape[1]
    return holes[:, :n] if w >= n else mx.pad(holes, [(0, 0), (0, n - w)])


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


def empty(layout) -> bool:
    """Drop every row's KV from a full-attention layout at once: a fresh buffer, written
    again from slot 0 (rows keep their count). False for any other layout."""
    if type(layout) not in (FullLayout, BatchKVCache):
        return False
    layout.keys = layout.values = None
    layout._idx = 0
    layout.offset = mx.zeros_like(layout.offset)
    layout.left_padding = mx.zeros_like(layout.left_padding)
    layout._right_padding = None
    if isinstance(layout, FullLayout):
        layout._holes = None
    return True


def drop_tails(layout, counts: list[int], holes: bool = False) -> None:
    """After a right-padded pass that has not been finalized: drop each row's last
    counts[i] positions (its padding, then its rejected drafts) in one roll per layer,
    the way `finalize` rolls a prefill chunk's padding away (rows stay right-aligned).
    `holes` (every full-attention layer native: their one mask can carry them): a native
    layout masks what rows drop beyond the common part instead (FullLayout.mask_tails)."""
    if hasattr(layout, "drop_tails"):  # a split layout drops each part's tails
        layout.drop_tails(counts)
        return
    if holes and isinstance(layout, FullLayout) and layout.keys is not None:
        common = min(counts)
        if common:
            layout._idx -= common
            layout.offset = layout.offset - common
        layout.mask_tails([c - common for c in counts])
        return
    if any(counts):
        if isinstance(layout, BatchRotatingKVCache):
            layout._lengths = layout.offset - mx.array(counts)
        elif isinstance(layout, BatchKVCache):
            # What every row drops moves the shared cursor back (free: the slots are
            # simply written again); only the rest moves data (a roll of the buffer).
            common = min(counts)
            if common:
                layout._idx -= common
                layout.offset = layout.offset - common
                counts = [c - common for c in counts]
            layout._right_padding = mx.array(counts) if any(counts) else None
    layout.finalize()


class SlidingLayout(BatchRotatingKVCache):
    """Sliding window: each row keeps its last `max_size` tokens (mlx-lm's rotation)."""

    def make_mask(self, N: int, window_size=None, return_array: bool = False):
        """mlx-lm's mask; for a multi-token pass over a ring that plain steps rotated, the
        ring is put in time order first, as the pass's write does first (`_update_concat`):
        the oldest slots that write trims then count from the ring's length, not from its
        write cursor. mlx-lm counted from the cursor and masked one slot too many, the oldest
        token of a row whose window was not yet full (a verify pass after plain steps)."""
        if N > 1 and self.rotated:
            self._temporal_order()
        return super().make_mask(N, window_size=window_size, return_array=return_array)

    def rollback(self, i: int, n: int) -> None:
        """Exact while the buffer is in time order and ends at the write cursor: before the
        ring first wraps, and right after a multi-token pass (mlx-lm then keeps the last
        `max_size - 1` tokens plus all new ones, so dropping up to the new ones less one
        still leaves every row its whole window). A 1-token step writes into the ring in
        place over the oldest token, which a rollback could not bring back: refused."""
        if self.keys is None or self.rotated or self._idx != self.keys.shape[2]:
            raise NotImplementedError("a sliding-window layer can roll a row back only "
                                      "right after a multi-token pass, or before it wraps")
        if self._offset > self._idx and self._idx - n < self.max_size - 1:
            raise NotImplementedError(f"rolling back {n} tokens would cut into the "
                                      f"{self.max_size}-token window")
        roll_row_back(self, i, n)


class RecurrentLayout(ArraysCache):
    """Recurrent (SSM / linear attention) state: constant size per row.

    A forward pass folds every token into the state, so rolling back means going back to
    a snapshot: `checkpoint()` keeps the state arrays as they are (MLX arrays are values,
    so that is a reference, not a copy), and `rollback(i, n)` puts row i back to it; the
    caller then feeds again the tokens it keeps. Adding or dropping rows forgets it."""

    _snapshot: list | None = None

    def checkpoint(self) -> None:
        self._snapshot = list(self.cache)

    def restore(self) -> None:
        """Every row back to the checkpoint (and no right padding pending)."""
        self.cache = list(self._snapshot)
        self.finalize()

    def rollback(self, i: int, n: int) -> None:
        if self._snapshot is None:
            raise ValueError("no checkpoint to roll back to (call checkpoint() first)")
        for k, (now, then) in enumerate(zip(self.cache, self._snapshot, strict=True)):
            if now is not None and then is not None:
                now[i:i + 1] = then[i:i + 1]
                self.cache[k] = now

    def filter(self, batch_indices):
        self._snapshot = None
        super().filter(batch_indices)

    def extend(self, other):
        self._snapshot = None
        super().extend(other)
