"""KV admission: each row's worst-case bytes must fit the budget with the running rows.

Worst case = (prompt + max_tokens) tokens on growing (full-attention) layers,
at most the window on sliding layers, and a constant for recurrent state.
Rows share one left-padded buffer per layer, so what the batch really holds is
rows x the longest row, not the sum of the rows: admission counts that.
Pure bookkeeping (no MLX): exact, unit-tested.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.plan.kv import full_row_bytes, prefill_extra

# Admission counts tokens exactly. mlx-lm's buffers grow 256 tokens at a time past the last
# write, so a row may hold a little more: the plan counts that beside the budget
# (GROWTH_TOKENS per row, appliance/plan/derive.py).


@dataclass(frozen=True)
class KVShape:
    """Bytes one row's KV costs, by layer kind."""

    full_per_token: int  # as stored (a quantized scheme's true bytes)
    sliding_per_token: int
    window: int  # tokens a sliding layer keeps (0: no sliding layers)
    recurrent: int  # constant state bytes per row
    native_per_token: int = 0  # full layers before quantization starts (kv.start)
    start: int = 0  # tokens a row holds native before its KV is quantized
    spec: int = 0  # slots a verify pass writes past `start` (drafts stop short of it; its
    #                right padding, to the longest row's or on CUDA to k + 1, rolls back)
    chunk: int = 0  # a prefill chunk (it may carry a row past `start` natively)
    prefilling: int = 1  # rows prefilled together (batch.prefill_rows)

    def row_bytes(self, tokens: int) -> int:
        """A row's most bytes (its full layers: `plan.kv.full_row_bytes`)."""
        return (full_row_bytes(tokens, self.full_per_token, self.native_per_token, self.start,
                               self.spec)
                + self.sliding_per_token * min(tokens, self.window) + self.recurrent)

    @classmethod
    def for_plan(cls, plan, recurrent: int = 0) -> KVShape:
        """The shape admission uses for an ExecutionPlan (recurrent bytes are measured on
        the loaded model, so the caller passes them)."""
        kv, draft = plan.kv, plan.draft.kv_bytes_per_token  # a draft's KV grows per token
        return cls(full_per_token=kv.bytes_per_token + draft,
                   sliding_per_token=kv.sliding_bytes_per_token,
                   window=plan.model.sliding_window or 0, recurrent=recurrent,
                   native_per_token=kv.native_bytes_per_token + draft, start=kv.start,
                   spec=plan.draft.k, chunk=plan.batch.prefill_chunk,
                   prefilling=plan.batch.prefill_rows)

    @property
    def prefill_extra(self) -> int:
        """What the rows being prefilled may hold beyond `row_bytes` at once
        (`plan.kv.prefill_extra`, for each of them)."""
        return self.prefilling * prefill_extra(self.full_per_token, self.native_per_token,
                                               self.start, self.spec, self.chunk)


class Budget:
    """Admitted rows and the bytes reserved for them."""

    def __init__(self, budget_bytes: int, shape: KVShape):
        self.budget = budget_bytes
        self.shape = shape
        self._held: dict[int, int] = {}  # row -> its worst-case tokens

    def _padded(self, tokens: list[int]) -> int:
        """Bytes of rows left-padded to the longest: len(rows) x the longest row's buffer."""
        if not tokens:
            return 0
        return len(tokens) * self.shape.row_bytes(max(tokens))

    @property
    def reserved(self) -> int:
        return self._padded(list(self._held.values()))

    def reserved_with(self, prompt_tokens: int, max_tokens: int) -> int:
        """What `reserved` would be with one more row of this size."""
        return self._padded([*self._held.values(), prompt_tokens + max_tokens])

    def cost(self, prompt_tokens: int, max_tokens: int) -> int:
        """One row's bytes alone (what `fits_alone` compares with the room)."""
        return self._padded([prompt_tokens + max_tokens])

    @property
    def room(self) -> int:
        """The budget less what rows being prefilled may hold natively (see KVShape)."""
        return self.budget - self.shape.prefill_extra

    def fits_alone(self, prompt_tokens: int, max_tokens: int) -> bool:
        return self._padded([prompt_tokens + max_tokens]) <= self.room

    def fits_now(self, prompt_tokens: int, max_tokens: int) -> bool:
        return self.reserved_with(prompt_tokens, max_tokens) <= self.room

    def fitting(self, sizes: list[int], dropping: frozenset[int] = frozenset()) -> int:
        """How many of `sizes` (rows' prompt + max_tokens tokens, first come first) would be
        admitted now beside the rows held, less `dropping` (rows that give their KV back on
        demand)."""
        held = [t for r, t in self._held.items() if r not in dropping]
        for n, tokens in enumerate(sizes):
            held.append(tokens)
            if self._padded(held) > self.room:
                return n
        return len(sizes)

    def try_admit(self, rid: int, prompt_tokens: int, max_tokens: int) -> bool:
        if not self.fits_now(prompt_tokens, max_tokens):
            return False
        self._held[rid] = prompt_tokens + max_tokens
        return True

    def release(self, rid: int) -> None:
        self._held.pop(rid, None)

    def check_integrity(self) -> None:
        assert all(v > 0 for v in self._held.values()), "a row holds no bytes"
        assert self.reserved <= self.room, "reservations exceed the budget"
