"""Prompt lookup: drafts copied from the row's own history, at no model cost."""

from __future__ import annotations


class LookupDrafter:
    """Prompt lookup: the row's latest n-gram (n from `hi` down to `lo`) that occurred
    before in its own prompt or output proposes the tokens that followed it there.

    Proposals are deterministic, so a draft is accepted exactly when the target's own
    sample equals it. Each row keeps an index of where every n-gram last ended, grown as
    tokens are accepted (a row's accepted tokens never shrink), so a step costs O(k)."""

    method = "lookup"
    fed = False  # keeps no layers of its own

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi
        self._index: dict[int, tuple[int, list[dict]]] = {}  # uid -> (indexed up to, maps)

    def make_cache(self) -> list:
        return []

    def propose(self, batch, pend: list[int], ks: list[int]) -> tuple[list[list[int]], None]:
        """Per row of `batch` (its uids and token lists), up to ks[i] tokens."""
        return [self._one(uid, [*toks, p], k) if k > 0 else [] for uid, toks, p, k in
                zip(batch.uids, batch.tokens, pend, ks, strict=True)], None

    def propose_ahead(self, batch, ks: list[int]) -> list[list[int]]:
        """Per row, up to ks[i] + 1 tokens following its latest n-gram that ends at its last
        token in KV, before its pending token is read: the first guesses the pending token
        (step.BatchStep: asking then costs no wait for the device)."""
        return [self._one(uid, list(toks), k + 1) if k > 0 else [] for uid, toks, k in
                zip(batch.uids, batch.tokens, ks, strict=True)]

    def settle(self, batch) -> None:
        pass

    def _one(self, uid: int, ctx: list[int], k: int) -> list[int]:
        done, maps = self._index.get(uid) or (0, [{} for _ in range(self.lo, self.hi + 1)])
        end = len(ctx) - 1  # n-grams ending before the suffix itself (which is the query)
        for e in range(max(done, self.lo), end + 1):
            for n, m in zip(range(self.lo, self.hi + 1), maps, strict=True):
                if e >= n:
                    m[tuple(ctx[e - n:e])] = e  # the latest occurrence wins
        self._index[uid] = (max(done, end + 1), maps)
        for n in range(self.hi, self.lo - 1, -1):
            if len(ctx) < n:
                continue
            e = maps[n - self.lo].get(tuple(ctx[-n:]))
            if e is not None:
                return ctx[e:e + k]
        return []

    def forget(self, uid: int) -> None:
        self._index.pop(uid, None)
