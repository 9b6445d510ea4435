"""The MTP proposer: a multi-token-prediction head drafting from the target's own hidden
states (`Tapped` keeps them), over the sampling and KV handling it shares with the draft
model (`drafters`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import mlx.core as mx

from appliance.engine.kv.native import drop_tails
from appliance.engine.kv.passes import whole_buffers
from appliance.engine.speculate.drafters import LAG_MAX, Sampled, feed_width, restart_rows
from appliance.engine.speculate.shapes import WHOLE_BUFFER


class Tapped:
    """The target called as its hidden states, then its output head (the same arithmetic
    as calling it), keeping the last call's hidden states for an MTP head."""

    def __init__(self, model):
        from appliance.models.mtp import hidden_states, logits_from_hidden

        self.model, self.hidden = model, None
        self._h, self._out = hidden_states, logits_from_hidden

    def __call__(self, x, cache=None):
        logits, self.hidden = self.tapped(x, cache)
        return logits

    def tapped(self, x, cache=None):
        """(logits, hidden states), keeping nothing (a compiled pass returns both)."""
        hidden = self._h(self.model, x, cache)
        return self._out(self.model, hidden), hidden

    def __getattr__(self, name):  # layers, make_cache, ... as the model's
        return getattr(self.model, name)


@dataclass
class _Pairs:
    """One row's (hidden at position i, token at i + 1) pairs the MTP head has not seen.
    Their hidden states are kept as references into the passes' outputs, (array [B, L, H],
    row, start, stop), and sliced only when the head runs: a plain decode step costs a row
    no MLX op. Slicing and trimming them every step (`concatenate(...)[-LAG_MAX:]`) chained
    one lazy op a step per row, which a probe's first step then evaluated whole."""

    spans: list = field(default_factory=list)  # references, or arrays [n, H]
    tokens: list[int] = field(default_factory=list)
    carry: tuple | None = None  # (array, row, position): the row's last fed position's hidden
    restart: bool = False  # pairs were dropped (LAG_MAX): the head's KV restarts from these
    seen: int = 0  # the last plain step logged (MTPDrafter._n) applied to these pairs

    def add(self, toks: list[int], hidden: mx.array, row: int, skip_first: bool) -> None:
        """Row `row` of `hidden` holds the states of `toks`, from its position 0."""
        if self.carry is not None and not skip_first:
            h, i, at = self.carry
            self.spans.append((h, i, at, at + 1))
            self.tokens.append(toks[0])
        if len(toks) > 1:
            self.spans.append((hidden, row, 0, len(toks) - 1))
            self.tokens.extend(toks[1:])
        self.carry = (hidden, row, len(toks) - 1)

    def trim(self, keep: int) -> None:
        """Keep only the last `keep` pairs (whole spans are dropped; `hidden` cuts the
        rest)."""
        if len(self.tokens) <= keep:
            return
        self.tokens, self.restart = self.tokens[-keep:], True
        held = sum(_span_len(x) for x in self.spans)
        while held - _span_len(self.spans[0]) >= keep:
            held -= _span_len(self.spans.pop(0))

    def drop(self) -> None:
        """Every waiting pair goes, and the carried state: the head restarts from the next."""
        self.spans, self.tokens, self.carry, self.restart = [], [], None, True

    def hidden(self) -> mx.array | None:
        """The waiting pairs' hidden states [n, H], one slice per span."""
        if not self.tokens:
            return None
        parts = [x if isinstance(x, mx.array) else x[0][x[1], x[2]:x[3]] for x in self.spans]
        return mx.concatenate(parts)[-len(self.tokens):]

    def carried(self) -> mx.array:
        h, i, at = self.carry
        return h[i, at]


def _span_len(x) -> int:
    return x.shape[0] if isinstance(x, mx.array) else x[3] - x[2]


class MTPDrafter(Sampled):
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
        # Plain decode steps, logged whole and applied to a row's pairs only when the row is
        # read (`_row`): a plain step costs one append, not a Python loop over the rows (at
        # B=16 that loop was ~90 us of a 3-5 ms step on an H200, which is launch-bound).
        self._n = 0  # plain steps logged so far
        self._log: deque = deque()  # (n, hidden [B, 1, H], uids, tokens), the last LAG_MAX + 1
        self._lost: set[int] = set()  # rows in a step that fell off the log

    def make_cache(self) -> list:
        return [self.head.make_cache()]

    def _row(self, uid: int) -> _Pairs:
        """Row `uid`'s pairs, with the plain steps logged since it was last read applied
        (the same `add` and `trim` those steps would have made)."""
        r = self._rows.get(uid)
        if r is None:
            r = self._rows[uid] = _Pairs()
        if r.seen < self._n:
            if uid in self._lost:  # it missed a step: only the logged ones' pairs count
                # (it was in every one, so `trim` would have kept only those anyway)
                self._lost.discard(uid)
                r.drop()
            for n, hidden, uids, toks in self._log:
                if n > r.seen and uid in uids:
                    i = uids.index(uid)
                    r.add(toks[i], hidden, i, skip_first=False)
                    r.trim(LAG_MAX)
            r.seen = self._n
        return r

    def observe(self, uids: list[int], fed: list[list[int]], hidden: mx.array,
                decoding: bool = False, step: bool = False) -> None:
        """The target fed `fed[i]` to row uids[i] and computed `hidden` [B, L, H]. A
        decoding row keeps at most LAG_MAX pairs waiting (a prompt's all go to the head
        as it prefills). `step`: a plain step of every decoding row, logged (so each
        decoding row is in every logged step from its first to its last)."""
        if step:
            rows = self._rows
            for uid in uids:
                if uid not in rows and uid is not None:  # (None: held, finished)
                    rows[uid] = _Pairs()
            self._n += 1
            self._log.append((self._n, hidden, tuple(uids), fed))
            while len(self._log) > LAG_MAX + 1:  # rows that had not read it missed it
                n, _, gone, _ = self._log.popleft()
                self._lost.update([u for u in gone if u in rows and rows[u].seen < n])
            return
        for i, (uid, toks) in enumerate(zip(uids, fed, strict=True)):
            r = self._row(uid)
            r.add(toks, hidden, i, skip_first=False)
            if decoding:
                r.trim(LAG_MAX)

    def skip(self, uids: list[int]) -> None:
        """A plain step ran untapped for these rows (the control rests: `Control.resting`):
        their waiting pairs go, and the head restarts from the tapped steps after it, as
        when more than LAG_MAX pairs wait. The log goes too: its steps end before the gap."""
        self._n += 1
        self._log.clear()
        self._lost.update(u for u in uids if u is not None)

    def drop(self, uids: list[int]) -> None:
        """The model prefilled these rows untapped (the control rests): their pairs go, and
        the head restarts from their next ones."""
        for uid in uids:
            self._row(uid).drop()

    def prefill(self, batch, chunks: list[list[int]]) -> None:
        """The model prefilled `chunks` (observed already): the head takes their pairs now,
        as the model's prefill runs, so a row's first proposal does not pay for them."""
        rows = [self._row(u) for u in batch.uids]
        feeds = []
        for r in rows:
            n = min(len(r.tokens), self.chunk)
            h = r.hidden()
            feeds.append((h[:n] if n else None, r.tokens[:n]))
            r.spans, r.tokens = ([h[n:]] if n < len(r.tokens) else []), r.tokens[n:]
        if any(t for _, t in feeds):
            self._run(batch, [(h, t, False) for h, t in feeds])
            mx.eval(batch.extra[0].state)

    def _run(self, batch, feeds) -> mx.array:
        """The head over each row's pairs, right-padded; its output at each row's last."""
        from appliance.models.mtp import embed

        lengths = [len(t) for _, t, _ in feeds]
        width = feed_width(max(lengths))
        like = next(h for h, t, _ in feeds if t)
        hid = mx.stack([mx.pad(h, [(0, width - len(t)), (0, 0)]) if t else
                        mx.zeros((width, like.shape[-1]), like.dtype) for h, t, _ in feeds])
        tok = mx.array([t + [0] * (width - len(t)) for _, t, _ in feeds])
        layer, pad = batch.extra[0], [width - n for n in lengths]
        if max(pad):
            layer.prepare(lengths=lengths, right_padding=pad)
        with whole_buffers([layer], width, WHOLE_BUFFER and width > 1, dense=True):
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
        rows = [self._row(u) if u is not None else None for u in batch.uids]
        restart_rows(batch.extra, [i for i, r in enumerate(rows) if r is not None and r.restart])
        feeds = []
        for r, p in zip(rows, pend, strict=True):
            if r is None:  # held (finished): the head is fed nothing for it
                feeds.append((None, [], False))
                continue
            r.restart = False
            feeds.append(self._take(r, p))
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
        h, t = r.hidden(), r.tokens
        if r.carry is not None and len(t) < self.chunk:
            r.spans, r.tokens = [], []
            c = r.carried()[None]
            return (c if h is None else mx.concatenate([h, c]), [*t, pend], True)
        n = min(len(t), self.chunk)
        r.spans, r.tokens = ([h[n:]] if n < len(t) else []), t[n:]
        return (h[:n] if n else None), t[:n], False

    def settle(self, batch) -> None:
        """After the verify: drop the chained entries, queue the pairs the kept tokens
        make (the pending token's pair is in already where the row proposed)."""
        if self.fed and self._steps > 1:  # every row wrote them at the shared cursor
            drop_tails(batch.extra[0], [self._steps - 1] * len(batch.uids))
        for i, (uid, kept) in enumerate(zip(batch.uids, batch.last_kept, strict=True)):
            if uid is None:
                continue  # held (finished)
            ok = self.fed and self._ready[i]
            self._row(uid).add(kept, batch.last_hidden, i, skip_first=ok)

    def forget(self, uid: int) -> None:
        self._rows.pop(uid, None)
        self._lost.discard(uid)
