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


class Shadow:
    """What a speculative step would have emitted for a row while the batch decodes plainly.

    A lookup proposal is deterministic and costs no model pass: at each plain step, a
    watched row proposes as a speculative step there would have (`propose_ahead`: its
    first token guesses the pending one), and the tokens the following steps emit settle
    it, at the first mismatch or once all match. The control's per-row yield so stays fresh
    while no speculative step runs, and speculation resumes as soon as the rows the batch
    waits on reach text they can copy (`Control.ends`; without it, only at the next probe:
    a replay of an H200 B=16 edit run's yields read 0.99-1.02x draft=none, 1.00-1.09x
    with it)."""

    def __init__(self, drafter: LookupDrafter, k: int):
        self.drafter, self.k = drafter, k
        self._open: dict[int, list[tuple[int, list[int]]]] = {}  # uid -> (at, proposal)

    def step(self, uids: list, tokens: list[list[int]], watch: list[int]) -> list[tuple]:
        """After a plain step, given each row's tokens in KV (None uids: held rows): the
        proposals settled now, as (uid, where it proposed, tokens it would have emitted).
        Only watched rows and rows with proposals open are visited (a plain step on CUDA is
        ~2 ms of host time: visiting all 16 rows cost 2% of it)."""
        settled = []
        need = self._open.keys() | set(watch)
        for i, uid in enumerate(uids):
            if uid is None or uid not in need:
                continue
            toks, still = tokens[i], []
            for at, guess in self._open.pop(uid, ()):
                got = toks[at:at + len(guess)]
                n = 0
                while n < len(got) and got[n] == guess[n]:
                    n += 1
                if n < len(got) or n == len(guess):  # a mismatch, or all of it kept
                    settled.append((uid, at, max(1, n)))  # (its first guessed the pending
                else:  # token: n matched emit n)
                    still.append((at, guess))
            if uid in watch:
                guess = self.drafter._one(uid, toks, self.k + 1)
                if guess:
                    still.append((len(toks), guess))
                else:
                    settled.append((uid, len(toks), 1))
            if still:
                self._open[uid] = still
        return settled

    def forget(self, uid: int) -> None:
        self._open.pop(uid, None)
