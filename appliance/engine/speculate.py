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

from appliance.engine.kv.affine import on_cuda
from appliance.engine.kv.native import whole_buffers

# Multi-token passes attend over whole KV buffers where MLX compiles per key length (CUDA).
WHOLE_BUFFER = on_cuda()


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


WARM = 2  # measured steps of each kind before the batch picks the faster one
PROBE = WARM + 1  # steps of a probe of the slower mode (its first one is not a measurement)


def _bucket(rows: int) -> int:
    """Batch sizes share measurements by power of two (rows finish one by one)."""
    return 1 << max(0, rows - 1).bit_length()


@dataclass
class _Row:
    accept: float = 0.6  # moving average of accepted / proposed
    paused: int = 0  # steps left before the row proposes again


@dataclass
class _Mode:
    """One batch size's choice between speculative and plain steps."""

    probe_at: int = 0  # the step at which the slower mode is probed again (0: not planned)
    gap: int = 0  # steps between probes: doubles while the winner holds
    winner: bool | None = None  # the mode before the current probe


@dataclass
class Control:
    """How many tokens each row may propose this step, and whether the batch speculates.

    Per row: k follows the expected run of accepted tokens, a/(1-a) for acceptance a,
    plus one (capped at `k`); below `pause_below` the row pauses for `pause_steps` steps, then
    probes again with one token. Per batch size (by power of two): the time of speculative
    and plain steps and the tokens a speculative step yields per row are measured, and the
    faster mode runs. The slower one is
    probed again for a few steps after `explore_every` steps, then after twice as many each
    time it loses again (up to 16x), so probing costs a small share of a long run and
    speculation is never the slower choice for long. A batch size not measured yet takes the
    decision of its neighbours: speculation that lost at B rows loses at more; one that won
    at B wins at fewer. `adaptive=False` always proposes k."""

    k: int
    adaptive: bool = True
    pause_below: float = 0.1
    pause_steps: int = 4
    explore_every: int = 32
    _rows: dict[int, _Row] = field(default_factory=dict)
    _secs: dict[tuple[int, bool], float] = field(default_factory=dict)  # (B, spec) -> s/step
    _gain: dict[int, float] = field(default_factory=dict)  # B -> tokens per row per spec step
    _ticks: dict[int, int] = field(default_factory=dict)
    _seen: dict[tuple[int, bool], int] = field(default_factory=dict)
    _odd: dict[tuple[int, bool], int] = field(default_factory=dict)  # outliers in a row
    _modes: dict[int, _Mode] = field(default_factory=dict)

    def budget(self, uid: int) -> int:
        if not self.adaptive:
            return self.k
        r = self._rows.setdefault(uid, _Row())
        if r.paused:
            r.paused -= 1
            return 1 if not r.paused else 0  # the last paused step probes with one token
        run = r.accept / max(1e-6, 1 - r.accept)  # expected accepted run, plus the one
        return max(1, min(self.k, math.ceil(run) + 1))  # that would end it

    def record(self, uid: int, proposed: int, accepted: int) -> None:
        if not self.adaptive or not proposed:
            return
        r = self._rows.setdefault(uid, _Row())
        r.accept = 0.7 * r.accept + 0.3 * accepted / proposed
        if r.accept < self.pause_below:
            r.paused, r.accept = self.pause_steps, self.pause_below + 0.1

    def _measured(self, b: int) -> bool | None:
        """Whether speculation is faster at bucket `b`, once both modes are measured there:
        the tokens a speculative step yields per row against what its time would decode."""
        if min(self._seen.get((b, True), 0), self._seen.get((b, False), 0)) < WARM:
            return None
        return self._gain[b] * self._secs[(b, False)] >= self._secs[(b, True)]

    def _winner(self, b: int) -> bool | None:
        own = self._measured(b)
        if own is not None:
            return own
        for other in sorted(self._gain, key=lambda o: abs(o - b)):
            won = self._measured(other)
            if won is not None and (other <= b and not won or other >= b and won):
                return won
        return None

    def speculate(self, rows: int) -> bool:
        """Whether a batch of `rows` rows should speculate this step."""
        if not self.adaptive:
            return True
        b = _bucket(rows)
        n = self._ticks[b] = self._ticks.get(b, 0) + 1
        winner = self._winner(b)
        if winner is None:
            return n % 4 < 2  # measuring both, two steps of each in turn
        m = self._modes.setdefault(b, _Mode())
        if not m.probe_at:
            m.probe_at, m.gap, m.winner = n + self.explore_every, self.explore_every, winner
        if n < m.probe_at:
            if winner != m.winner:  # the running mode fell below the other's last rate
                m.winner, m.gap, m.probe_at = winner, self.explore_every, n + self.explore_every
            return m.winner
        if n < m.probe_at + PROBE:
            return not m.winner
        held = winner == m.winner  # the probe is over: back off while the winner holds
        m.gap = min(2 * m.gap, 16 * self.explore_every) if held else self.explore_every
        m.probe_at, m.winner = n + m.gap, winner
        return winner

    def timed(self, rows: int, spec: bool, seconds: float, tokens: int) -> None:
        """One step's time and the tokens it emitted. Step times move fast (0.3 per step);
        the yield of speculative steps is smoothed harder (0.15), since acceptance varies
        from step to step far more than the time a step takes."""
        if seconds <= 0:
            return
        b = _bucket(rows)
        seen = self._seen[(b, spec)] = self._seen.get((b, spec), 0) + 1
        if seen == 1:
            return  # a first step at a batch size pays one-off costs; not a measurement
        old = self._secs.get((b, spec))
        if old is not None and seconds > 3 * old and self._odd.get((b, spec), 0) < 2:
            self._odd[(b, spec)] = self._odd.get((b, spec), 0) + 1
            return  # a one-off (a new shape compiled); two in a row, and the third counts
        self._odd[(b, spec)] = 0
        fast = old is None or seconds < old  # a faster step is believed at once: one-offs
        w = 0.7 if fast else 0.3  # (compiles) only ever make a step slower
        self._secs[(b, spec)] = seconds if old is None else (1 - w) * old + w * seconds
        if spec:
            old = self._gain.get(b)
            self._gain[b] = tokens / rows if old is None else 0.85 * old + 0.15 * tokens / rows

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


def _feed(model, layers: list, rows: list[list[int]]) -> mx.array:
    """One forward of `model` over each row's tokens, right-padded to the longest and
    rolled back to left padding after, on its own layouts. Logits [B, L, V]."""
    lengths = [len(r) for r in rows]
    width = max(lengths)
    pad = [width - n for n in lengths]
    x = mx.array([r + [0] * p for r, p in zip(rows, pad, strict=True)])
    if max(pad):
        for c in layers:
            c.prepare(lengths=lengths, right_padding=pad)
    with whole_buffers(layers, width, WHOLE_BUFFER and width > 1):
        logits = model(x, cache=layers)
    if max(pad):
        for c in layers:
            c.finalize()
    return logits


class _Sampled:
    """What the draft-model and MTP proposers share: drawing each row's next draft token
    from draft logits, processed exactly as the target's are (logits processors with the
    row's history, then its sampler's filters and temperature; temperature 0: argmax)."""

    def _draw(self, batch, logits: mx.array, pend: list[int], drafts: list[list[int]],
              qs: list[list], ks: list[int], ready: list[bool], j: int) -> list[int]:
        from appliance.engine.sampling import distribution, row_key

        greedy = [p is None or p.temperature == 0 for p in batch.params]
        if all(greedy) and not any(batch.processors):
            toks = mx.argmax(logits, axis=-1).tolist()
        else:  # per row, lazily; one read for the whole batch
            picks = []
            for i in range(len(ks)):
                row = logits[i:i + 1]
                if batch.processors[i]:
                    ctx = mx.concatenate([batch.context[i].tokens,
                                          mx.array([pend[i], *drafts[i]], mx.int32)])
                    for proc in batch.processors[i]:
                        row = proc(ctx, row)
                lp = row - mx.logsumexp(row, axis=-1, keepdims=True)
                if greedy[i]:
                    picks.append(mx.argmax(lp, axis=-1))
                    continue
                q = distribution(batch.params[i], lp)[0]
                picks.append(mx.random.categorical(mx.log(q), key=row_key(batch.samplers[i]))
                             .reshape(1))
                if ready[i] and j < ks[i]:
                    qs[i].append(q)
            toks = mx.concatenate(picks).tolist()
        for i, t in enumerate(toks):
            if ready[i] and j < ks[i]:
                drafts[i].append(t)
        return toks

    @staticmethod
    def _qs(batch, qs: list[list]) -> list:
        return [mx.stack(q) if q else None for q in qs]


class ModelDrafter(_Sampled):
    """A small draft model with the target's tokenizer proposes k tokens per row, one
    batched forward each. Its KV lives in each row's cache after the model's layers
    (`extra`): it lags while a row does not speculate and catches up, at most `chunk`
    tokens a step, when it does, so a running row stalls at most a chunk for it."""

    method = "model"

    def __init__(self, draft, chunk: int):
        self.draft, self.chunk = draft, chunk
        self.fed = False  # whether the last propose() fed the draft (then settle() runs)

    def make_cache(self) -> list:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.draft)

    def propose(self, batch, pend: list[int], ks: list[int]):
        """(drafts, qs): per row up to ks[i] tokens and, for a sampled row, their
        processed draft probabilities [k_i, V] (None for greedy rows)."""
        steps = max(ks, default=0)
        self.fed = steps > 0
        if not steps:
            return [[] for _ in ks], None
        have = batch.extra[0].offset.tolist()  # tokens the draft holds per row
        feeds = [[*toks[have[i]:], p][:self.chunk]
                 for i, (toks, p) in enumerate(zip(batch.tokens, pend, strict=True))]
        ready = [len(batch.tokens[i]) + 1 == have[i] + len(f) for i, f in enumerate(feeds)]
        logits = _feed(self.draft, batch.extra, feeds)
        last = mx.stack([logits[i, len(f) - 1] for i, f in enumerate(feeds)])
        drafts: list[list[int]] = [[] for _ in ks]
        qs: list[list] = [[] for _ in ks]
        for j in range(steps):
            toks = self._draw(batch, last, pend, drafts, qs, ks, ready, j)
            if j < steps - 1:
                last = self.draft(mx.array(toks)[:, None], cache=batch.extra)[:, -1]
        self._steps, self._ready = steps, ready
        return drafts, self._qs(batch, qs)

    def prefill(self, batch, chunks: list[list[int]]) -> None:
        """The model prefilled `chunks`: the draft follows (then a row's first proposal
        does not pay for its whole prompt)."""
        _feed(self.draft, batch.extra, chunks)
        mx.eval([c.state for c in batch.extra])

    def settle(self, batch) -> None:
        """After the verify: keep in the draft's KV only tokens the model kept."""
        if not self.fed:
            return
        chained = self._steps - 1  # fed after the pending token: its own drafts
        for i, (kept, ok) in enumerate(zip(batch.last_kept, self._ready, strict=True)):
            drop = chained - (min(len(kept) - 1, chained) if ok else 0)
            if drop:
                for c in batch.extra:
                    c.rollback(i, drop)

    def forget(self, uid: int) -> None:
        pass


class Tapped:
    """The target called as its hidden states, then its output head (the same arithmetic
    as calling it), keeping the last call's hidden states for an MTP head."""

    def __init__(self, model):
        from appliance.models.mtp import hidden_states, logits_from_hidden

        self.model, self.hidden = model, None
        self._h, self._out = hidden_states, logits_from_hidden

    def __call__(self, x, cache=None):
        self.hidden = self._h(self.model, x, cache)
        return self._out(self.model, self.hidden)

    def __getattr__(self, name):  # layers, make_cache, ... as the model's
        return getattr(self.model, name)


@dataclass
class _Pairs:
    """One row's (hidden at position i, token at i + 1) pairs the MTP head has not seen."""

    hidden: list = field(default_factory=list)  # [n, H] arrays
    tokens: list[int] = field(default_factory=list)
    carry: mx.array | None = None  # hidden at the row's last fed position: pairs with the next


class MTPDrafter(_Sampled):
    """A multi-token-prediction head proposes from the target's own hidden states: the
    pair (hidden of the last position, the pending token) gives the first draft, then the
    head chains on its own output. Its one attention layer's KV is the row cache's extra
    layer, holding one entry per pair (hidden at i, token at i + 1) the target has fed;
    pairs the head has not seen wait per row and are fed at its next proposal, at most
    `chunk` at a time. Depth-1 heads are chained for k > 1 (DeepSeek-V3 / Qwen3-Next)."""

    method = "mtp"
    needs_hidden = True

    def __init__(self, head, target, chunk: int):
        self.head, self.target, self.chunk = head, target, chunk
        self.fed = False
        self._rows: dict[int, _Pairs] = {}

    def make_cache(self) -> list:
        return [self.head.make_cache()]

    def observe(self, uids: list[int], fed: list[list[int]], hidden: mx.array) -> None:
        """The target fed `fed[i]` to row uids[i] and computed `hidden` [B, L, H]."""
        for i, (uid, toks) in enumerate(zip(uids, fed, strict=True)):
            self._add(uid, toks, hidden[i, :len(toks)], skip_first=False)

    def _add(self, uid: int, toks: list[int], h: mx.array, skip_first: bool) -> None:
        r = self._rows.setdefault(uid, _Pairs())
        if r.carry is not None and not skip_first:
            r.hidden.append(r.carry[None])
            r.tokens.append(toks[0])
        if len(toks) > 1:
            r.hidden.append(h[:-1])
            r.tokens.extend(toks[1:])
        r.carry = h[-1]

    def prefill(self, batch, chunks: list[list[int]]) -> None:
        """The model prefilled `chunks` (observed already): the head takes their pairs now,
        as the model's prefill runs, so a row's first proposal does not pay for them."""
        rows = [self._rows.setdefault(u, _Pairs()) for u in batch.uids]
        feeds = []
        for r in rows:
            n = min(len(r.tokens), self.chunk)
            h = mx.concatenate(r.hidden) if r.hidden else None
            feeds.append((h[:n] if n else None, r.tokens[:n]))
            r.hidden, r.tokens = ([h[n:]] if n < len(r.tokens) else []), r.tokens[n:]
        if any(t for _, t in feeds):
            self._run(batch, [(h, t, False) for h, t in feeds])
            mx.eval(batch.extra[0].state)

    def _run(self, batch, feeds) -> mx.array:
        """The head over each row's pairs, right-padded; its output at each row's last."""
        from appliance.models.mtp import embed

        lengths = [len(t) for _, t, _ in feeds]
        width = max(lengths)
        like = next(h for h, t, _ in feeds if t)
        hid = mx.stack([mx.pad(h, [(0, width - len(t)), (0, 0)]) if t else
                        mx.zeros((width, like.shape[-1]), like.dtype) for h, t, _ in feeds])
        tok = mx.array([t + [0] * (width - len(t)) for _, t, _ in feeds])
        layer, pad = batch.extra[0], [width - n for n in lengths]
        if max(pad):
            layer.prepare(lengths=lengths, right_padding=pad)
        with whole_buffers([layer], width, WHOLE_BUFFER and width > 1):
            out = self.head(hid, embed(self.target, tok), layer)
        if max(pad):
            layer.finalize()
        return mx.stack([out[i, max(n, 1) - 1] for i, n in enumerate(lengths)])

    def propose(self, batch, pend: list[int], ks: list[int]):
        from appliance.models.mtp import embed, logits_from_hidden

        steps = max(ks, default=0)
        self.fed = False
        if not steps:
            return [[] for _ in ks], None
        rows = [self._rows.setdefault(u, _Pairs()) for u in batch.uids]
        feeds = [self._take(r, p) for r, p in zip(rows, pend, strict=True)]
        self.fed = any(t for _, t, _ in feeds)  # (nothing is taken from a row with none)
        if not self.fed:
            return [[] for _ in ks], None
        ready = [ok for _, _, ok in feeds]
        last, layer = self._run(batch, feeds), batch.extra[0]
        drafts: list[list[int]] = [[] for _ in ks]
        qs: list[list] = [[] for _ in ks]
        for j in range(steps):
            toks = self._draw(batch, logits_from_hidden(self.target, last), pend, drafts, qs,
                              ks, ready, j)
            if j < steps - 1:
                last = self.head(last[:, None], embed(self.target, mx.array(toks)[:, None]),
                                 layer)[:, 0]
        self._steps, self._ready = steps, ready
        return drafts, self._qs(batch, qs)

    def _take(self, r: _Pairs, pend: int) -> tuple[mx.array | None, list[int], bool]:
        """The pairs to feed now (at most `chunk`) and whether the pending token's pair is
        among them (then the row can propose)."""
        h = mx.concatenate(r.hidden) if r.hidden else None
        t = r.tokens
        if r.carry is not None and len(t) < self.chunk:
            r.hidden, r.tokens = [], []
            return (r.carry[None] if h is None else mx.concatenate([h, r.carry[None]]),
                    [*t, pend], True)
        n = min(len(t), self.chunk)
        r.hidden, r.tokens = ([h[n:]] if n < len(t) else []), t[n:]
        return (h[:n] if n else None), t[:n], False

    def settle(self, batch) -> None:
        """After the verify: drop the chained entries, queue the pairs the kept tokens
        make (the pending token's pair is in already where the row proposed)."""
        if self.fed and self._steps > 1:
            for i in range(len(batch.uids)):
                batch.extra[0].rollback(i, self._steps - 1)
        for i, (uid, kept) in enumerate(zip(batch.uids, batch.last_kept, strict=True)):
            ok = self.fed and self._ready[i]
            self._add(uid, kept, batch.last_hidden[i, :len(kept)], skip_first=ok)

    def forget(self, uid: int) -> None:
        self._rows.pop(uid, None)

