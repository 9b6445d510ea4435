"""One pass that verifies every row's drafts, accepts per row, rolls back.

With a drafter (`appliance/engine/speculate/`), a decode step of `BatchStep` becomes a verify
step when rows have proposals: each row feeds its pending token plus its own 0..k draft
tokens in one forward pass (right-padded), keeps its accepted prefix (`speculate.accept`)
and rolls the rest of its KV back (recurrent layers: back to a snapshot, then the kept
tokens are fed again). Rows without proposals decode in the same pass.
"""

from __future__ import annotations

import mlx.core as mx

from appliance.engine.compiled import compilable
from appliance.engine.kv.native import FullLayout, RecurrentLayout, drop_tails
from appliance.engine.kv.passes import flagged, whole_buffers
from appliance.engine.sampling import SeededSampler, distribution, reads_history, row_key
from appliance.engine.speculate import WHOLE_BUFFER, accept_deterministic, accept_sampled

# Rows that keep fewer tokens than the batch's longest run leave masked slots behind
# (FullLayout holes): every later step attends over them. Past this share of the slots the
# rows are gathered right-aligned again (one gather per layer, as a roll costs).
COMPACT_AT = 0.25


class Verifying:
    """The verify pass of the running rows (`rows._Decoding` mixes it in, beside its plain
    decode step): it reads and advances the rows' layers, tokens, samplers, processors,
    params, logits-processor context and pending token, as that step does."""

    def verify(self, model, pend: list[int] | None, drafts: list[list[int]],
               qs: list | None = None, width: int = 0, compiled=None,
               guesses: list | None = None) -> list[tuple[list[int], list[mx.array]]]:
        """Feed every row its pending token and its drafts in one pass; keep, per row, the
        drafts its own samples confirm (`accept_deterministic`), or for a sampled row
        whose drafts came with the draft's distributions `qs[i]`, the ones speculative
        sampling keeps (`accept_sampled`). Returns per row the tokens now emitted (the
        pending one first) with their log-probabilities; the token sampled after them
        becomes the row's pending token. `width`: the least tokens per row the pass feeds
        (padding), so a backend that compiles per shape sees one shape per batch size.
        `compiled`: a CompiledDecode that runs the pass where the layers allow it.

        `pend` None: the pending tokens are not read yet (a plain step's, still on the
        device) and are fed from there, so proposing cost no wait for the device; each row's
        drafts then assume its pending token is `guesses[i]`, and a row whose pending token
        turns out otherwise keeps none of them (rows sampling alike, no processors)."""
        ahead = pend is None
        fed = [[0 if ahead else p, *d] for p, d in zip(pend or drafts, drafts, strict=True)]
        recurrent = [c for c in self.layers if isinstance(c, RecurrentLayout)]
        for c in recurrent:
            c.checkpoint()
        logits = self._forward(model, fed, finalize=False, width=width,  # _roll_back finalizes
                               compiled=compiled, first=self.next_tokens if ahead else None)
        self.last_hidden = getattr(model, "hidden", None)  # an MTP head drafts from them
        logprobs, samples = self._sample_all(logits, fed)
        if ahead:  # read now, with the pass's results
            pend = self.next_tokens.tolist()
            for f, p in zip(fed, pend, strict=True):
                f[0] = p
            drafts = [d if g == p else [] for d, g, p in zip(drafts, guesses, pend, strict=True)]
        out, kept, new_pend, new_lp = [], [], [], []
        for i, d in enumerate(drafts):
            q, params = (qs[i] if qs else None), self.params[i]
            if q is None or not d or params is None or params.temperature == 0:
                a = accept_deterministic(samples[i], d)
                nxt = samples[i][a]
            else:
                p = distribution(params, logprobs[i])
                a, nxt = accept_sampled(p, q, d, row_key(self.samplers[i]))
            toks = fed[i][:a + 1]
            out.append((toks, [self.next_logprobs[i], *[logprobs[i][j] for j in range(a)]]))
            kept.append(toks)
            new_pend.append(nxt)
            new_lp.append(logprobs[i][a])
        self._roll_back(model, max(width, *map(len, fed)), fed, kept, recurrent)
        self.last_fed, self.last_kept = fed, kept  # for the drafter's own rollback
        for i, toks in enumerate(kept):
            self.tokens[i].extend(toks)  # now in the row's KV
            if reads_history(self.processors[i]):
                self.context[i].update_and_fetch(mx.array(toks))
        self.next_tokens, self.next_logprobs = mx.array(new_pend), new_lp
        self.known_pend = new_pend
        return out

    def _forward(self, model, rows: list[list[int]], finalize: bool = True,
                 width: int = 0, compiled=None, first: mx.array | None = None) -> mx.array:
        """One forward pass over each row's tokens (right-padded to the longest, or to
        `width`), with the padding rolled away afterwards (`finalize`) as a prefill chunk's
        is; quantized layers attend as that many decode steps would (`decode_like`).
        Logits [B, L, V]."""
        lengths = [len(r) for r in rows]
        width = max(*lengths, width)
        pad = [width - n for n in lengths]
        x = mx.array([r + [0] * p for r, p in zip(rows, pad, strict=True)])
        if first is not None:  # each row's first token, from the device
            x = mx.concatenate([first[:, None].astype(x.dtype), x[:, 1:]], axis=1)
        if compiled is not None and not finalize and compilable(model, self.layers):
            return compiled.forward(x, self.layers)  # (its padding stays for the rollback)
        if max(pad):
            for c in self.layers:
                c.prepare(lengths=lengths, right_padding=pad)
        with flagged(self.layers, "decode_like"), \
                whole_buffers(self.layers, width, WHOLE_BUFFER, dense=True):
            logits = model(x, cache=self.layers)
        if max(pad) and finalize:
            for c in self.layers:
                c.finalize()
        return logits

    def shared_sampling(self) -> bool:
        """Every row samples with one sampler, no logits processors, no per-row key (a
        seeded row draws one key per token): one sampling call serves all positions."""
        return not any(self.processors) and self._one_sampler()

    def _one_sampler(self) -> bool:
        return all(s is self.samplers[0] for s in self.samplers) \
            and not isinstance(self.samplers[0], SeededSampler)

    def _sample_all(self, logits: mx.array, fed: list[list[int]]):
        """Per row, log-probabilities [n_i, V] at each fed position (logits processors
        applied with the history up to that position) and each position's sample."""
        if not any(map(reads_history, self.processors)) and self._one_sampler():
            logits = self.biases.add(logits, self.processors)  # (every row's bias at once)
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            B, L, V = lp.shape
            sampled = self.samplers[0](lp.reshape(B * L, V)).reshape(B, L)
            mx.eval(sampled, lp)
            s = sampled.tolist()
            return [lp[i, :len(f)] for i, f in enumerate(fed)], \
                [s[i][:len(f)] for i, f in enumerate(fed)]
        lps, outs = [], []
        for i, f in enumerate(fed):
            rows = logits[i, :len(f)]
            procs = self.processors[i]
            if procs and all(getattr(p, "context_free", False) for p in procs):
                for p in procs:  # (in order, all positions at once)
                    rows = p(None, rows)
            elif procs:
                base = self.context[i].tokens
                done = []
                for j in range(len(f)):
                    ctx = mx.concatenate([base, mx.array(f[:j + 1], dtype=base.dtype)])
                    r = rows[j:j + 1]
                    for p in procs:
                        r = p(ctx, r)
                    done.append(r)
                rows = mx.concatenate(done, axis=0)
            lp = rows - mx.logsumexp(rows, axis=-1, keepdims=True)
            lps.append(lp)
            outs.append(self.samplers[i](lp))
        mx.eval(outs, lps)
        return lps, [o.tolist() for o in outs]

    def _roll_back(self, model, width: int, fed: list[list[int]], kept: list[list[int]],
                   recurrent: list) -> None:
        """Drop each row's padding and rejected tokens from its KV (the pass fed `width`
        tokens per row): one roll per layer, as a right-padded chunk's padding is rolled
        away. Recurrent state cannot drop tokens: then every row goes back to before the
        pass and feeds again what it keeps."""
        if recurrent and any(len(k) < len(f) for k, f in zip(kept, fed, strict=True)):
            for c in self.layers:
                if c in recurrent:
                    c.restore()
                else:
                    drop_tails(c, [width] * len(fed))
            self._forward(model, kept)
            return
        holes = not any(hasattr(c, "decode_like") for c in self.layers)  # all native
        for c in self.layers:
            drop_tails(c, [width - len(k) for k in kept], holes)
        full = [c for c in self.layers if isinstance(c, FullLayout) and c._holes is not None]
        if full and full[0].holes_share() > COMPACT_AT:
            plan = full[0].compaction()
            for c in full:
                c.compact(plan)
