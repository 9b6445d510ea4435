"""`kv.start` inside a batch: one quantized layer whose rows sit on both sides of `start`.

A lone row keeps its KV native until it holds `start` tokens, then encodes all of it
(mlx-lm's `quantized_kv_start`; `Scheme.maybe_quantize`). In a batch the same holds per
row: rows below `start` sit in a native `FullLayout`, the others in a `QuantLayout`, and a
row moves across, encoded once, at its first write after it reaches `start`. Attention runs
per part, over that part's rows (queries gathered), with that part's own mask.

What mlx-lm's model reads of a layer, `offset` (RoPE) and `make_mask` (which the model may
take from this layer for every full-attention layer), is kept here as one batch layout
would keep it (left padding, shared cursor, lengths), so layers that stay native beside
this one get the mask they always had. That bookkeeping, and each part's, is host-side
(`_Rows`): no device sync per step, and the layers of a pass share one mask per part.
"""

from __future__ import annotations

import threading

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask

from appliance.engine.kv.native import FullLayout, drop_tails
from appliance.engine.kv.quantized import Parts, QuantLayout, QuantRowCache


class _Rows:
    """Host-side copy of a left-padded layout's bookkeeping (mlx-lm's BatchKVCache rules):
    each row's length and left padding, and the shared write cursor."""

    def __init__(self, lengths: list[int]):
        self.idx = max(lengths, default=0)
        self.lengths = list(lengths)
        self.pads = [self.idx - n for n in lengths]

    def update(self, n: int) -> None:
        self.idx += n
        self.lengths = [x + n for x in self.lengths]

    def drop(self, counts: list[int], common: int) -> None:
        """Row i loses its last counts[i] slots: `common` of them by moving the cursor back
        (drop_tails), the rest by rolling the row right (finalize, rollback)."""
        self.idx -= common
        self.lengths = [x - c for x, c in zip(self.lengths, counts, strict=True)]
        self.pads = [p + c - common for p, c in zip(self.pads, counts, strict=True)]

    def filter(self, keep: list[int]) -> None:
        self.lengths = [self.lengths[b] for b in keep]
        self.pads = [self.pads[b] for b in keep]
        shift = min(self.pads, default=0)
        self.idx -= shift
        self.pads = [p - shift for p in self.pads]

    def extend(self, other: _Rows) -> None:
        idx = max(self.idx, other.idx)
        self.pads = ([p + idx - self.idx for p in self.pads]
                     + [p + idx - other.idx for p in other.pads])
        self.lengths = self.lengths + other.lengths
        self.idx = idx

    def mask(self, N: int, **kwargs) -> mx.array:
        return _memo(("mask", N, self.idx, tuple(self.pads), tuple(kwargs.items())),
                     lambda: create_causal_mask(N, offset=self.idx,
                                                left_padding=mx.array(self.pads), **kwargs))


_LOCAL = threading.local()  # per engine thread: only the thread that made an array uses it


def _memo(key, make):
    """Every split layer of a pass asks for the same few small arrays: build each once."""
    memo = _LOCAL.__dict__.setdefault("memo", {})
    value = memo.get(key)
    if value is None:
        if len(memo) >= 32:
            memo.clear()
        value = memo[key] = make()
    return value


class SplitLayout:
    """One quantized layer's rows in a batch: `native` holds those below `start`, `coded`
    the rest; `rows_n` / `rows_c` map each part's rows to the batch's row order."""

    # mlx-lm sends a cache with `bits` to quantized attention (quantized._dispatch)
    bits = group_size = None

    def __init__(self, codec, start: int, reference: bool, lengths: list[int]):
        self.codec, self.start, self.reference = codec, start, reference
        self.native: FullLayout | None = None
        self.coded: QuantLayout | None = None
        self.rows_n: list[int] = []  # the batch row of each native-part row, in part order
        self.rows_c: list[int] = []
        self.rows = _Rows(lengths)  # the batch, as one left-padded layout would hold it
        self.n_rows, self.c_rows = _Rows([]), _Rows([])  # each part's own
        self._rp: list[int] | None = None  # right padding of the pass under way
        # a verify pass, a prefill pass (see quantized._Stored)
        self.decode_like = self.prefill_like = False

    # -- what the model reads ------------------------------------------------------
    @property
    def offset(self) -> mx.array:
        return _memo(("offset", tuple(self.rows.lengths)),
                     lambda: mx.array(self.rows.lengths))

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        return self.rows.mask(N, **kwargs)

    # -- building ------------------------------------------------------------------
    @classmethod
    def merge(cls, rows: list, codec, start: int, reference: bool = False) -> SplitLayout:
        """Rows at or past `start` (or already encoded) go to the encoded part."""
        lengths = [r.offset if r.keys is not None else 0 for r in rows]
        out = cls(codec, start, reference, lengths)
        coded = [isinstance(r, QuantRowCache) or n >= start
                 for r, n in zip(rows, lengths, strict=True)]
        out.rows_n = [b for b, c in enumerate(coded) if not c]
        out.rows_c = [b for b, c in enumerate(coded) if c]
        if out.rows_n:
            out.native = FullLayout.merge([rows[b] for b in out.rows_n])
            out.native.exact_trim = True  # (a filter trims as its book: native.py)
            out.n_rows = _Rows([lengths[b] for b in out.rows_n])
        if out.rows_c:
            out.coded = QuantLayout.merge([rows[b] for b in out.rows_c], codec, reference)
            out.c_rows = _Rows([lengths[b] for b in out.rows_c])
        return out

    def _parts(self):
        return ((self.native, self.rows_n, self.n_rows), (self.coded, self.rows_c, self.c_rows))

    def _locate(self, i: int):
        if i in self.rows_n:
            return self.native, self.n_rows, self.rows_n.index(i)
        return self.coded, self.c_rows, self.rows_c.index(i)

    def _migrate(self) -> None:
        """Encode the native rows that reached `start` and move them to the other part."""
        move = [j for j, b in enumerate(self.rows_n) if self.rows.lengths[b] >= self.start]
        if not move:
            return
        new = QuantLayout.merge([QuantRowCache.from_native(self.native.extract(j), self.codec)
                                 for j in move], self.codec, self.reference)
        moved = _Rows([self.n_rows.lengths[j] for j in move])
        if self.coded is None:
            self.coded, self.c_rows = new, moved
        else:
            self.coded.extend(new)
            self.c_rows.extend(moved)
        self.rows_c += [self.rows_n[j] for j in move]
        stay = [j for j in range(len(self.rows_n)) if j not in move]
        if stay:
            self.native.filter(stay)
            self.n_rows.filter(stay)
        else:
            self.native, self.n_rows = None, _Rows([])
        self.rows_n = [self.rows_n[j] for j in stay]

    # -- a forward pass ------------------------------------------------------------
    def prepare(self, *, left_padding=None, lengths=None, right_padding=None) -> None:
        if left_padding is not None:
            raise ValueError("left padding is set by merge")
        if right_padding is not None and max(right_padding) > 0:
            self._rp = list(right_padding)

    def update_and_fetch(self, keys, values):
        self._migrate()
        L, B = keys.shape[2], len(self.rows.lengths)
        out, perm = Parts(), self.rows_n + self.rows_c
        for part, rows, book in self._parts():
            if not rows:
                continue
            idx = None if rows == perm == list(range(B)) else \
                _memo(("rows", tuple(rows)), lambda r=rows: mx.array(r))
            if self._rp is not None:
                part.prepare(right_padding=[self._rp[b] for b in rows])
            if isinstance(part, QuantLayout):
                part.decode_like, part.prefill_like = self.decode_like, self.prefill_like
            mask = book.mask(L)  # before the write, as the model builds its mask
            k, v = part.update_and_fetch(*((keys, values) if idx is None
                                           else (keys[idx], values[idx])))
            book.update(L)
            out.append((idx, k, v, mask))
        if perm != list(range(B)):  # back to row order
            inverse = [0] * B
            for pos, b in enumerate(perm):
                inverse[b] = pos
            out.order = _memo(("rows", tuple(inverse)), lambda: mx.array(inverse))
        self.rows.update(L)
        return out, None

    def finalize(self) -> None:
        """Roll the pass's right padding away, as BatchKVCache.finalize does."""
        if self._rp is None:
            return
        for part, rows, book in self._parts():
            if part is not None:
                part.finalize()
                book.drop([self._rp[b] for b in rows], 0)
        self.rows.drop(self._rp, 0)
        self._rp = None

    def drop_tails(self, counts: list[int]) -> None:
        """native.drop_tails for this layout: each part drops its rows' tails."""
        for part, rows, book in self._parts():
            if part is not None:
                sub = [counts[b] for b in rows]
                drop_tails(part, sub)
                if any(sub):
                    book.drop(sub, min(sub))
        if any(counts):
            self.rows.drop(counts, min(counts))
        self._rp = None

    @property
    def state(self):
        return [part.state for part, _, _ in self._parts() if part is not None]

    # -- rows in and out -----------------------------------------------------------
    def filter(self, keep: list[int]) -> None:
        new = {b: i for i, b in enumerate(keep)}
        for name in ("native", "coded"):
            part = getattr(self, name)
            rows = self.rows_n if name == "native" else self.rows_c
            book = self.n_rows if name == "native" else self.c_rows
            sel = [j for j, b in enumerate(rows) if b in new]
            if sel:
                part.filter(sel)
                book.filter(sel)
            else:  # an empty part starts afresh (mlx-lm's layouts would keep a stale cursor)
                part, book = None, _Rows([])
            setattr(self, name, part)
            setattr(self, "n_rows" if name == "native" else "c_rows", book)
            setattr(self, "rows_n" if name == "native" else "rows_c", [new[rows[j]] for j in sel])
        self.rows.filter(keep)

    def extend(self, other: SplitLayout) -> None:
        B = len(self.rows.lengths)
        for name, book in (("native", "n_rows"), ("coded", "c_rows")):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is None:
                setattr(self, name, theirs)
                setattr(self, book, getattr(other, book))
            elif theirs is not None:
                mine.extend(theirs)
                getattr(self, book).extend(getattr(other, book))
        self.rows_n = self.rows_n + [b + B for b in other.rows_n]
        self.rows_c = self.rows_c + [b + B for b in other.rows_c]
        self.rows.extend(other.rows)

    def extract(self, i: int):
        """Row i's cache; encoded once it holds `start` tokens, as a lone row is after the
        pass that brings it there (here it moves at its next write): an entry or a row taken
        out is then what a lone row would hold."""
        part, book, j = self._locate(i)
        row = part.extract(j)
        if part is self.native and book.lengths[j] >= self.start:
            return QuantRowCache.from_native(row, self.codec, self.reference)
        return row

    def rollback(self, i: int, n: int) -> None:
        part, book, j = self._locate(i)
        part.rollback(j, n)
        for b, at in ((book, j), (self.rows, i)):
            b.drop([n if k == at else 0 for k in range(len(b.lengths))], 0)

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part, _, _ in self._parts() if part is not None)
