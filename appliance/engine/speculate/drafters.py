"""Model proposers: a small draft model here, an MTP head in `mtp_drafter`.

Both draw each draft token as the target would sample it (`Sampled`), keep their own KV
in each row's cache after the model's layers (`extra`), and take back, after the verify,
what the model did not keep (`settle`).
"""

from __future__ import annotations

import mlx.core as mx

from appliance.engine.kv.native import drop_tails, empty
from appliance.engine.kv.passes import whole_buffers
from appliance.engine.speculate.shapes import WHOLE_BUFFER, pass_width

# Most tokens a drafter catches up on at a proposal. A row that decoded plainly for longer
# (the control chose plain steps: speculation lost there) restarts its drafter's KV from its
# last LAG_MAX tokens: the drafter's positions are relative, so it drafts as from a shorter
# context. Catching up on every token instead cost a probe's first step 150-440 ms against
# a 15 ms plain step at B=16 on a 2-core CPU, a cost that grew with the gap between probes.
LAG_MAX = 31


def restart_rows(layers: list, rows: list[int]) -> None:
    """Empty these rows of a drafter's own layers (their slots become padding), all in one
    roll a layer. After a long plain stretch every row restarts at once: then full-attention
    layers start a fresh buffer instead, so the catch-up pass meets the same shapes at every
    probe (its buffer otherwise kept the padding of every earlier restart, and grew)."""
    if not rows:
        return
    held = layers[0].offset.tolist()
    drops = [n if i in rows else 0 for i, n in enumerate(held)]
    for c in layers:
        if len(rows) == len(held) and empty(c):
            continue
        drop_tails(c, drops)


def feed_width(n: int) -> int:
    """A drafter's pass feeds each row the tokens it has not seen, as many as the plain
    steps since its last one: on CUDA padded to `pass_width` (an H200 spent 70-155 ms in
    each catch-up of a new width, against 5-20 at a known one)."""
    return pass_width(n) if WHOLE_BUFFER and n > 1 else n


def _feed(model, layers: list, rows: list[list[int]]) -> mx.array:
    """One forward of `model` over each row's tokens, right-padded to the longest and
    rolled back to left padding after, on its own layouts. Logits [B, L, V]."""
    lengths = [len(r) for r in rows]
    width = feed_width(max(lengths))
    pad = [width - n for n in lengths]
    x = mx.array([r + [0] * p for r, p in zip(rows, pad, strict=True)])
    if max(pad):
        for c in layers:
            c.prepare(lengths=lengths, right_padding=pad)
    with whole_buffers(layers, width, WHOLE_BUFFER and width > 1, dense=True):
        logits = model(x, cache=layers)
    if max(pad):
        for c in layers:
            c.finalize()
    return logits


class Sampled:
    """What the draft-model and MTP proposers share: drawing each row's next draft token
    from draft logits, processed exactly as the target's are (logits processors with the
    row's history, then its sampler's filters and temperature; temperature 0: argmax)."""

    def _draw(self, batch, logits: mx.array, pend: list[int], drafts: list[list[int]],
              qs: list[list], ks: list[int], ready: list[bool], j: int) -> list[int]:
        from appliance.engine.sampling import distribution, reads_history, row_key

        greedy = [p is None or p.temperature == 0 for p in batch.params]
        if all(greedy) and not any(batch.processors):
            toks = mx.argmax(logits, axis=-1).tolist()
        elif all(greedy) and not any(map(reads_history, batch.processors)):
            logits = batch.biases.add(logits, batch.processors)  # every row's bias at once
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            toks = mx.argmax(lp, axis=-1).tolist()
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
                if greedy[i] or not (ready[i] and j < ks[i]):  # (not a draft: no key spent)
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


class ModelDrafter(Sampled):
    """A small draft model with the target's tokenizer proposes k tokens per row, one
    batched forward each. Its KV lives in each row's cache after the model's layers
    (`extra`): it lags while a row does not speculate and catches up, at most `chunk`
    tokens a step, when it does, so a running row stalls at most a chunk for it."""

    method = "model"

    def __init__(self, draft, chunk: int):
        self.draft, self.chunk = draft, chunk
        self.fed = False  # whether the last propose() fed the draft (then settle() runs)
        self._base: dict[int, int] = {}  # uid -> the row position of the draft's first token

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
        held = batch.extra[0].offset.tolist()  # tokens the draft holds per row
        have, lagging = [], []  # per row: up to which of its tokens the draft has seen
        for i, (uid, toks) in enumerate(zip(batch.uids, batch.tokens, strict=True)):
            if uid is None:  # held (finished): fed its pending token only, drafts nothing
                have.append(len(toks) + 1)
                continue
            seen = self._base.get(uid, 0) + held[i]
            if len(toks) - seen > LAG_MAX:
                lagging.append(i)
                seen = self._base[uid] = len(toks) - LAG_MAX
            have.append(seen)
        restart_rows(batch.extra, lagging)
        feeds = [[*toks[have[i]:], p][:self.chunk] if uid is not None else [p]
                 for i, (uid, toks, p) in enumerate(zip(batch.uids, batch.tokens, pend,
                                                        strict=True))]
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
        drops = [chained - (min(len(kept) - 1, chained) if ok else 0)
                 for kept, ok in zip(batch.last_kept, self._ready, strict=True)]
        if any(drops):  # one roll a layer (`rollback` a row at a time copied the buffers)
            for c in batch.extra:
                drop_tails(c, drops)

    def forget(self, uid: int) -> None:
        self._base.pop(uid, None)
