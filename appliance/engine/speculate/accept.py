"""Which draft tokens a row keeps: the rule that keeps speculation lossless at any
temperature (every kept and every next token is a sample of the target's own processed
distribution)."""

from __future__ import annotations

import mlx.core as mx


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
