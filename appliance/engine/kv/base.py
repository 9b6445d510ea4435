"""The KV layout interface: how one layer holds the KV of the rows decoded together.

A scheme (`conf/kv/<name>.yaml` -> `kv/<name>.py`) makes two kinds of object per layer:

- a **row cache**: one row's KV (what a lone row decodes with, what the prefix cache
  stores and the SSD tier serializes). It has `update_and_fetch`, `offset`, `state`,
  `nbytes`, and a classmethod `merge(row_caches) -> Layout`;
- a **layout**: many rows' KV, driven by `appliance.engine.step`. mlx-lm's model classes
  call `update_and_fetch(keys, values)`, `make_mask(N)` and read `offset` (per row, an
  array: the RoPE position of each row's next token) while running a batched forward pass.

Contract of a layout (every scheme's layouts pass one parametrized test suite):
- rows are left-aligned to one shared physical write cursor; each row's logical length
  (`offset`) is kept apart from that cursor, so filtering, extending or rolling back one
  row never moves another row's KV or the position where new tokens are written;
- `extend(other)` admits rows, `filter(keep)` keeps rows (in that order),
  `extract(i)` returns row i as a row cache holding exactly its tokens,
  `rollback(i, n)` drops row i's last n tokens (a sliding window only until it first
  wraps, else NotImplementedError; a recurrent layer returns row i to its last
  `checkpoint()`, and the caller feeds again what it keeps), `nbytes` counts what it holds;
- `prepare(lengths=, right_padding=)` / `finalize()` bracket a right-padded prefill chunk.
"""

from __future__ import annotations

from typing import Protocol


class Layout(Protocol):
    offset: object  # mx.array (rows,): each row's logical length

    def update_and_fetch(self, keys, values): ...
    def make_mask(self, N: int, return_array: bool = False, **kwargs): ...
    def prepare(self, *, left_padding=None, lengths=None, right_padding=None) -> None: ...
    def finalize(self) -> None: ...
    def extend(self, other: Layout) -> None: ...
    def filter(self, keep: list[int]) -> None: ...
    def extract(self, i: int): ...
    def rollback(self, i: int, n: int) -> None: ...

    @property
    def nbytes(self) -> int: ...
