"""Speculative decoding inside the continuous batch: proposers, acceptance, adaptive control.

Each decoding row proposes its own 0..k draft tokens (`Drafter.propose`); `BatchStep`
verifies every row's proposals in one forward pass (right-padded, then rolled back per
row), and each row keeps its own accepted prefix. Rows without proposals decode in the
same pass. The rule that keeps it lossless at any temperature is in `accept`.

`Control` decides how many tokens a row may propose: k shrinks with the row's measured
acceptance, a row whose drafts keep failing pauses, and the batch stops speculating at
a batch size where speculative steps measured slower than plain ones, so speculation is
never the slower choice for long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mlx.core as mx


@dataclass
class DraftCounts:
    """Tokens proposed and accepted, for /stats and one request's usage."""

    proposed: int = 0
    accepted: int = 0

    def add(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted

    @property
    def rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


class LookupDrafter:
    """Prompt lookup: the row's latest n-gram (n from `hi` down to `lo`) that occurred
    before in its own prompt or output proposes the tokens that followed it there.

    Proposals are deterministic, so a draft is accepted exactly when the target's own
    sample equals it. Each row keeps an index of where every n-gram last ended, grown as
    tokens are accepted (a row's accepted tokens never shrink), so a step costs O(k)."""

    method = "lookup"

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi
        self._index: dict[int, tuple[int, list[dict]]] = {}  # uid -> (indexed up to, maps)

    def propose(self, uids: list[int], contexts: list[list[int]], ks: list[int]) -> list[list[int]]:
        return [self._one(uid, ctx, k) if k > 0 else [] for uid, ctx, k in
                zip(uids, contexts, ks, strict=True)]

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


@dataclass
class _Row:
    accept: float = 0.6  # moving average of accepted / proposed
    paused: int = 0  # steps left before the row proposes again


@dataclass
class Control:
    """How many tokens each row may propose this step, and whether the batch speculates.

    Per row: k follows the expected run of accepted tokens, a/(1-a) for acceptance a
    (capped at `k`); below `pause_below` the row pauses for `pause_steps` steps, then
    probes again with one token. Per batch size: the tokens per second of speculative and
    plain decode steps are both measured (each is re-measured now and then), and the
    slower mode is not used. `adaptive=False` always proposes k."""

    k: int
    adaptive: bool = True
    pause_below: float = 0.2
    pause_steps: int = 16
    explore_every: int = 64
    _rows: dict[int, _Row] = field(default_factory=dict)
    _rate: dict[tuple[int, bool], float] = field(default_factory=dict)  # (B, spec) -> tok/s
    _ticks: dict[int, int] = field(default_factory=dict)

    def budget(self, uid: int) -> int:
        if not self.adaptive:
            return self.k
        r = self._rows.setdefault(uid, _Row())
        if r.paused:
            r.paused -= 1
            return 1 if not r.paused else 0  # the last paused step probes with one token
        run = r.accept / max(1e-6, 1 - r.accept)
        return max(1, min(self.k, math.ceil(run)))

    def record(self, uid: int, proposed: int, accepted: int) -> None:
        if not self.adaptive or not proposed:
            return
        r = self._rows.setdefault(uid, _Row())
        r.accept = 0.7 * r.accept + 0.3 * accepted / proposed
        if r.accept < self.pause_below:
            r.paused, r.accept = self.pause_steps, self.pause_below + 0.1

    def speculate(self, rows: int) -> bool:
        """Whether a batch of `rows` rows should speculate this step."""
        if not self.adaptive:
            return True
        n = self._ticks[rows] = self._ticks.get(rows, 0) + 1
        spec, plain = self._rate.get((rows, True)), self._rate.get((rows, False))
        if spec is None or plain is None:  # measure both first: spec, then plain
            return spec is None or n % 2 == 0
        better = spec >= plain
        return better if n % self.explore_every >= 4 else not better

    def timed(self, rows: int, spec: bool, seconds: float, tokens: int) -> None:
        if seconds <= 0:
            return
        key = (rows, spec)
        rate = tokens / seconds
        old = self._rate.get(key)
        self._rate[key] = rate if old is None else 0.8 * old + 0.2 * rate

    def forget(self, uid: int) -> None:
        self._rows.pop(uid, None)


def accept_deterministic(samples: list[int], draft: list[int]) -> int:
    """How many draft tokens to keep when the draft is deterministic (lookup, argmax):
    each is kept exactly when the target's own sample at its position equals it, so every
    kept and every next token is a sample of the target's processed distribution."""
    a = 0
    while a < len(draft) and samples[a] == draft[a]:
        a += 1
    return a


def accept_sampled(p: mx.array, q: mx.array, draft: list[int], key: mx.array | None
                   ) -> tuple[int, int]:
    """Speculative sampling for drafts sampled from a model's distribution.

    p: [m+1, V] the target's processed probabilities at the m draft positions and the
    one after; q: [m, V] the draft's, processed identically. Draft token j is kept with
    probability min(1, p_j(d)/q_j(d)); at the first rejection the next token is drawn
    from normalize(max(0, p_j - q_j)); when all are kept, from p_m. Returns (kept, next
    token). `key`: the row's own random key (seeded rows), else the global stream."""
    m = len(draft)
    idx = mx.array(draft)
    pj = p[mx.arange(m), idx]
    qj = q[mx.arange(m), idx]
    k1, k2 = mx.random.split(key) if key is not None else (None, None)
    u = mx.random.uniform(shape=(m,), key=k1)
    ok = (u * qj <= pj).tolist()  # u < p/q without dividing by a zero q
    a = 0
    while a < m and ok[a]:
        a += 1
    if a < m:
        resid = mx.maximum(p[a] - q[a], 0)
        total = resid.sum()
        dist = mx.where(total > 0, resid / mx.maximum(total, 1e-30), p[a])
    else:
        dist = p[m]
    nxt = mx.random.categorical(mx.log(dist), key=k2)
    return a, int(nxt.item())
