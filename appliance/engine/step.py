"""The engine's own batched step: decode every running row, then prefill one chunk.

One `tick()` runs, in this order, what mlx-lm's `BatchGenerator.next()` runs (that class
stays the oracle, in appliance/oracle.py and the tests, and a native row here is token-exact
with it at the same B):

1. one decode step for the running rows: a forward pass over each row's pending token,
   logits processors per row, log-softmax, sampling (one call when the rows share a
   sampler), pipelined: step t+1 is queued before step t's tokens are read;
2. rows whose prompt is down to its last token start decoding: that token's first
   forward runs over their own cache, which then joins the running rows;
3. one chunk of at most `prefill_chunk` prompt tokens for the rows being prefilled
   (`prefill_rows` prompts together; how chunks are cut and fed: `appliance/engine/prefill.py`).

With a drafter (`appliance/engine/speculate/`), step 1 becomes a verify step when rows
have proposals (`appliance/engine/verify.py`): each row feeds its pending token plus its own
0..k draft tokens in one forward pass (right-padded), keeps its accepted prefix and rolls the
rest of its KV back (recurrent layers: back to a snapshot, then the kept tokens are fed again).

The rows themselves, and the decode step's arithmetic, are in `appliance/engine/rows.py`.

What the engine owns beyond it: the KV layouts (`appliance/engine/kv`: native, affine,
TurboQuant; one per layer, each row's logical length kept apart from the write position),
the row caches they are built from (`make_cache`), and per-row rollback (`rollback`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import TokenBuffer

from appliance.engine.compiled import CompiledDecode
from appliance.engine.kv import Scheme, native_cuda
from appliance.engine.prefill import Prefill, PromptEvent, observe
from appliance.engine.rows import _Decoding
from appliance.engine.sampling import SeededSampler
from appliance.engine.speculate import WHOLE_BUFFER, Control, DraftCounts, LookupDrafter, Tapped
from appliance.engine.speculate.drafters import LAG_MAX
from appliance.engine.speculate.lookup import Shadow

# Propose before reading the pending tokens where reading them stalls a pipeline that pays:
# a launch-bound device (CUDA) rather than a compute-bound CPU (docs/speculation.md).
AHEAD = WHOLE_BUFFER
SETTLE = 3  # a step is timed from the third at an unchanged batch size (see _decode_step)
# Finished rows stay in the batch until rows join (or all have finished), decoding tokens
# nobody reads, rather than being filtered out at once: on CUDA every filter re-forms the
# KV buffers, and the next step matched no cached CUDA graph (8B, H200: the step after a row
# left took 2-3 steady steps of host time, 21st session). A held row's KV stays counted
# against the budget until it goes (`dropped`). With a drafter too: a held row proposes
# nothing and its drafter keeps nothing for it (an H200 at B=16, mtp whose control never
# speculated: plain steps 0.91x draft=none's with only draft=none holding, 0.98x with
# neither, 24th session). Elsewhere (a CPU) a finished row is held only while a row is
# prefilling or waiting to, whose join then takes its slot in place (`_Decoding.reuse`);
# held longer, its wasted decode would cost more than the filter it saves.
HOLD = WHOLE_BUFFER


@dataclass
class TokenEvent:
    uid: int
    token: int
    logprobs: mx.array
    finish_reason: str | None  # None | "stop" (an EOS id) | "length"
    cache: list | None = None  # the row's cache, on finish (for the prefix cache)
    tokens: list[int] | None = None  # the tokens in that cache
    held: bool = False  # on finish: its KV stays in the batch until `dropped` names it


@dataclass
class _Seq:
    """A row not yet being prefilled."""

    uid: int
    segments: list[list[int]]
    max_tokens: int
    cache: list
    tokens: list[int]
    sampler: object
    processors: tuple
    params: object = None  # the SamplingParams (speculative sampling needs them)


class BatchStep:
    """Rows waiting, being prefilled and decoding; `tick()` advances them all by one step.

    Only the engine thread may call it. `uid`s are its own (returned by `insert`)."""

    def __init__(self, model, stop_tokens: set[int], max_rows: int, prefill_chunk: int,
                 scheme: Scheme | None = None, prefill_rows: int = 1, drafter=None,
                 control: Control | None = None, compiled: CompiledDecode | None = None,
                 compile_verify: bool = False, keep_finished: bool = True):
        """`scheme`: the plan's KV scheme (native when None). `drafter`: proposes draft
        tokens per row (None: no speculation); `control`: how many, and when. `compiled`:
        plain decode steps as a compiled graph; `compile_verify`: verify passes too.
        `keep_finished`: a finishing row's event carries a copy of its KV (for a prefix
        cache; without one nobody reads it, and copying a row with holes reads them on the
        host, which waits for the device mid-pipeline)."""
        native_cuda.install()  # masked decode attention on CUDA (a no-op elsewhere)
        self.model, self.stop_tokens = model, set(stop_tokens)
        self.max_rows, self.prefill_chunk, self.prefill_rows = max_rows, prefill_chunk, \
            prefill_rows
        self.scheme = scheme or Scheme()
        self._uids = 0
        self._waiting: deque[_Seq] = deque()
        self._decode = _Decoding()
        self._steps = 0
        self.drafter, self.control = drafter, control
        self._compiled = compiled
        self.model_layers = len(self.scheme.make_cache(model))  # a row cache's model layers
        self._bare = None  # the untapped model, for plain steps while the control rests
        if getattr(drafter, "needs_hidden", False):
            self.model, self._bare = Tapped(model), model  # the same arithmetic, keeping
            self._compiled = None  # the hidden states (the traced step has none)
        self._verify_compiled = CompiledDecode(self.model) \
            if compile_verify and drafter is not None else None
        self._prefill = Prefill(self.model, self.scheme, prefill_chunk, drafter)
        # (a lookup row's yield is known through plain steps too, for the control's `ends`)
        self._shadow = Shadow(drafter, control.k) if isinstance(drafter, LookupDrafter) \
            and control is not None and control.by_rows else None
        self.drafts: dict[int, DraftCounts] = {}  # per row; the scheduler pops them at finish
        self.spec_ticks = 0  # decode steps that verified proposals
        self._before: bool | None = None  # the last decode step: speculative, plain, or
        # (None) one that asked for drafts and found none
        self._last_end, self._quiet = 0.0, False  # the last decode step's end; no prefill since
        self._asked = False  # this step read the pending tokens for drafts and found none
        self._ended = False  # rows finished in the last decode step
        self._rows_were, self._same = 0, 0  # the last step's rows; steps since they changed
        self.hold, self.keep_finished = HOLD, keep_finished
        self.dropped: list[int] = []  # held rows whose KV went since the scheduler last took

    def _observe(self, uids: list[int], fed: list[list[int]], step: bool = False) -> None:
        """`step`: a plain step of every decoding row (an MTP drafter logs it whole)."""
        observe(self.model, self.drafter, uids, fed, decoding=True, step=step)

    # -- rows in --------------------------------------------------------------------
    def insert(self, segments: list[list[int]], max_tokens: int, sampler, processors=(),
               cache: list | None = None, tokens: list[int] | None = None,
               params=None) -> int:
        """Queue a row: its prompt as `segments` (prefill pauses at each segment's end) over
        `cache`, which already holds `tokens` (a prefix-cache hit, or a solo row's history;
        with a drafter that keeps layers, those follow the model's, or are made here). The
        last prompt token is fed by the row's first decode step. `params`: its SamplingParams."""
        seq = [s for s in segments if s]
        if not seq:
            raise ValueError("the prompt is empty")
        if max_tokens <= 0:
            raise ValueError("max_tokens must be > 0")
        if len(seq[-1]) != 1:
            seq.append(seq[-1][-1:])
            seq[-2] = seq[-2][:-1]
        uid, self._uids = self._uids, self._uids + 1
        if cache is None:
            cache = self.scheme.make_cache(self.model)
            if self.drafter is not None:
                cache += self.drafter.make_cache()
        elif self.drafter is not None and len(cache) == self.model_layers:
            # built without the drafter (a solo row, or a prefix entry one stored): the
            # drafter starts empty and catches up on the row's last tokens (LAG_MAX)
            cache = cache + self.drafter.make_cache()
        self._waiting.append(_Seq(uid, seq, max_tokens, cache, list(tokens or []), sampler,
                                  tuple(processors or ()), params))
        return uid

    def prefill_free(self) -> bool:
        """Whether a row inserted now starts prefilling at the next tick."""
        return len(self._prefill) + len(self._waiting) < self.prefill_rows

    # -- the step -------------------------------------------------------------------
    def tick(self) -> tuple[list[PromptEvent], list[TokenEvent]]:
        events: list[TokenEvent] = []
        if len(self._decode):
            events = self._decode_step()
            self._steps += 1
            if self._steps % 512 == 0:
                mx.clear_cache()
        if self._decode.live >= self.max_rows:
            self._quiet = True
            return [], events
        n = min(self.prefill_rows - len(self._prefill), self.max_rows - self._decode.live,
                len(self._waiting))
        if n > 0:
            self._prefill.admit([self._waiting.popleft() for _ in range(n)], self.model_layers)
        prompt_events: list[PromptEvent] = []
        ready = self._prefill.ready()
        if ready:
            prompt_events += [PromptEvent(u, True, True) for u in self._start_decoding(ready)]
        chunks, cut = self._prefill.cut()
        prompt_events += cut
        # (a drafter would drop these rows' prompt before it next speculates: LAG_MAX)
        self._prefill.run(chunks, rest=self.drafter is not None and self.control.resting(
            self._decode.live + len(self._prefill), LAG_MAX + 1))
        self._quiet = not (n > 0 or ready or any(chunks))  # the next step's time is its own
        return prompt_events, events

    def _start_decoding(self, ready: list[int]) -> list[int]:
        """Rows whose prompt is down to its last token: feed it, then join the running rows
        (into held rows' slots where they fit: `_Decoding.reuse`). Returns their uids."""
        rows, last = self._prefill.take(ready)
        rows.next_tokens = mx.array(last)
        rows.context = [TokenBuffer(t) for t in rows.tokens]
        rows.generated = [0] * len(ready)
        rows.step(self.model, self._compiled)  # the last prompt token, over these rows alone
        self._observe(rows.uids, [[t] for t in last])
        joined = list(rows.uids)
        gone, placed = self._decode.reuse(rows)
        self.dropped += gone
        if len(placed) < len(joined):
            if placed:
                rows.filter([j for j in range(len(joined)) if j not in placed])
            self.drop_retired()  # (one re-forming for rows leaving and joining)
            self._decode.extend(rows)
        elif self._decode.retired and not self._holding():
            self.drop_retired()  # (held for joins that have all come: see HOLD)
        return joined

    def _holding(self) -> bool:
        """Whether finished rows stay in the batch (see HOLD): on CUDA always, elsewhere
        while a row is prefilling or waiting to, whose join can take a slot."""
        return self.hold or bool(len(self._prefill) or self._waiting)

    def drop_retired(self) -> list[int]:
        """Filter the held rows out now (their uids also go to `dropped`)."""
        gone = self._decode.drop_retired()
        self.dropped += gone
        return gone

    def _decode_step(self) -> list[TokenEvent]:
        d, rows = self._decode, len(self._decode)
        self._asked = False
        emitted = self._speculate() if self.drafter is not None else None
        spec = emitted is not None
        if not spec:
            rest = self._bare is not None and self.control.resting(rows, LAG_MAX + 1)
            toks, logprobs = d.step(self._bare if rest else self.model, self._compiled)
            if rest:
                self.drafter.skip(d.uids)
            else:
                self._observe(d.uids, [[t] for t in toks], step=True)
            if self._shadow is not None:
                for uid, _, n in self._shadow.step(d.uids, d.tokens, self.control.waits_on):
                    self.control.emitted(uid, n)
            emitted = [([t], [lp]) for t, lp in zip(toks, logprobs, strict=True)]
        keep, events, done = [], [], []
        for i, uid in enumerate(d.uids):
            if uid is None:
                continue  # retired: its tokens are nobody's
            reason = None
            for tok, lp in zip(*emitted[i], strict=True):
                d.generated[i] += 1
                reason = "length" if d.generated[i] >= d.max_tokens[i] else None
                if tok in self.stop_tokens:
                    reason = "stop"
                if reason is not None:
                    kv = d.extract(i, self.model_layers) if self.keep_finished else None
                    events.append(TokenEvent(uid, tok, lp, reason, kv, d.tokens[i]))
                    break
                events.append(TokenEvent(uid, tok, lp, None))
            if reason is None:
                keep.append(i)
            else:
                done.append(i)
                if self.drafter is not None:
                    self._forget(uid)
        if done and keep and self._holding():
            for i in done:
                d.retire(i)
            for e in events:
                e.held = e.finish_reason is not None
        elif done:  # (the last live rows finished: the held ones go with them)
            self.dropped += d.drop_retired(also=tuple(done))
        # The control compares modes by the wall time from one decode step's end to the
        # next (what the rows see), where no prefill ran between, and only a step after
        # one of its own kind: a plain step right after a speculative one restarts the
        # pipeline, and a speculative one right after a plain one first waits for that
        # one's queued pass. A step that asked for drafts and found none (it read the
        # pending tokens first) is neither. Nor is a step at a batch size new within
        # SETTLE steps: a new size pays one-off costs (on an H200 the two steps after a
        # row left took 18-30 ms against 3-5, its CUDA graphs built anew), which times
        # taken while rows leave one by one would make the common case. Nor is a step in
        # which rows finished, or the next: the finished rows' KV is copied out in it (and
        # a prefix cache stores it before the next), work that either mode pays alike (an
        # H200, B=16: the plain steps as a bench's rows finished took 6-8 ms against 3.5,
        # and a speculation that lost by 1.7x looked the faster, 26th session).
        now = time.perf_counter()
        self._same = self._same + 1 if rows == len(d) == self._rows_were else 0
        self._rows_were = len(d)
        if self.drafter is not None:
            if self._quiet and self._last_end:
                self.control.spent(rows, spec, now - self._last_end)
            kind = None if self._asked else spec
            if self._quiet and self._last_end and kind is not None and kind == self._before \
                    and self._same >= SETTLE and not done and not self._ended:
                # (no row finished in it, so d.uids are still this step's; held rows: None)
                live = [i for i, uid in enumerate(d.uids) if uid is not None]
                self.control.timed(rows, spec, now - self._last_end,
                                   sum(len(emitted[i][0]) for i in live), len(live))
            self._before = kind
        self._last_end, self._ended = now, bool(done)
        return events

    def _forget(self, uid: int) -> None:
        self.drafter.forget(uid)
        self.control.forget(uid)
        if self._shadow is not None:
            self._shadow.forget(uid)

    def _speculate(self) -> list | None:
        """A verify step for the running rows, or None when no row proposes anything (or
        the control measured plain steps faster at this batch size): then a plain step."""
        d, ctl = self._decode, self.control
        rows = len(d)
        left = {uid: d.max_tokens[i] - d.generated[i] for i, uid in enumerate(d.uids)
                if uid is not None} if ctl.by_rows else None
        if not ctl.speculate(rows, settled=self._quiet and self._same >= SETTLE - 1,
                             left=left):
            return None
        # Right after a plain step the pending tokens are still being computed: a drafter
        # that can propose from the tokens before them does, so asking waits for nothing
        ahead = AHEAD and d.known_pend is None and hasattr(self.drafter, "propose_ahead") \
            and d.shared_sampling()
        pend = None if ahead else (d.known_pend if d.known_pend is not None
                                   else d.next_tokens.tolist())
        ks, start = [], self.scheme.start if self.scheme.quantized else 0
        for i, uid in enumerate(d.uids):
            room = d.max_tokens[i] - d.generated[i] - 1  # the pending token is emitted too
            if len(d.tokens[i]) < start:  # a row below kv.start drafts short of it: past it
                # a plain step attends over codes, not over the pass's fresh float KV
                room = min(room, start - 1 - len(d.tokens[i]))
            # A seeded sampled row proposes nothing: it then draws from its own key one
            # token a step, as without a draft, whatever the (timed) control decides and
            # whichever rows run beside it, so its text is reproducible.
            seeded = isinstance(d.samplers[i], SeededSampler)
            stop = pend is not None and pend[i] in self.stop_tokens
            held = uid is None  # (finished, held in the batch: HOLD)
            ks.append(0 if stop or room <= 0 or seeded or held else min(room, ctl.budget(uid)))
        guesses = None
        if ahead:
            conts = [c[:1] if c and c[0] in self.stop_tokens else c  # (nothing past a stop)
                     for c in self.drafter.propose_ahead(d, ks)]
            if not any(len(c) > 1 for c in conts):
                return None  # nothing read, so nothing lost: a plain (pipelined) step
            drafts, qs = [c[1:] for c in conts], None
            guesses = [c[0] if c else None for c in conts]
            ctl.found(rows, True)
        else:
            drafts, qs = self.drafter.propose(d, pend, ks)
            ctl.found(rows, any(drafts))
            if not any(drafts) and not self.drafter.fed:
                self._asked = True  # a plain step, but after reading the pending tokens
                return None  # nothing proposed, nothing fed to a draft: a plain step
        out = d.verify(self.model, pend, drafts, qs, width=ctl.k + 1 if WHOLE_BUFFER else 0,
                       compiled=self._verify_compiled, guesses=guesses)
        self.drafter.settle(d)
        mx.eval([c.state for c in d.layers + d.extra])  # its rollback too, in this step
        self.spec_ticks += 1
        for uid, dr, (toks, _) in zip(d.uids, drafts, out, strict=True):
            if uid is not None and ctl.by_rows:  # (only a by-rows control reads it)
                ctl.emitted(uid, len(toks))
            if dr:
                self.drafts.setdefault(uid, DraftCounts()).add(len(dr), len(toks) - 1)
                ctl.record(uid, len(dr), len(toks) - 1)
        return out

    # -- rows out -------------------------------------------------------------------
    def _where(self, uid: int) -> tuple[str, int]:
        for stage, batch in (("decode", self._decode), ("prefill", self._prefill.batch)):
            if uid in batch.uids:
                return stage, batch.uids.index(uid)
        for i, s in enumerate(self._waiting):
            if s.uid == uid:
                return "waiting", i
        raise KeyError(uid)

    def extract(self, uid: int, upto: int | None = None) -> tuple[list, list[int]]:
        """A copy of one row's model layers and the tokens in them (for the prefix cache);
        `upto`: its first `upto` tokens only (a checkpoint its last prefill pass ran past).
        A drafter's layers stay out: a draft model's KV lags while its row decodes plainly
        and an MTP head's holds a pair a token, so an entry with them was never a delta over
        its parent (a CPU agents run stored 1.1 GB whole with either, against 0.17 GB as
        deltas without), and a hit on one starts the drafter empty, catching up on the
        row's last tokens (LAG_MAX), as a hit on a solo row's entry always did."""
        stage, i = self._where(uid)
        if stage == "waiting":
            s = self._waiting[i]
            return s.cache[:self.model_layers], s.tokens
        batch = self._decode if stage == "decode" else self._prefill.batch
        if upto is None or upto == len(batch.tokens[i]):
            return batch.extract(i, self.model_layers), batch.tokens[i]
        return [c.extract(i, upto) for c in batch.layers], batch.tokens[i][:upto]

    def take_alone(self) -> tuple | None:
        """The one row decoding, out of the batch, for the solo path: (uid, its model layers'
        cache, the tokens in it, its pending token [1] and log-probabilities, its sampler).
        None unless it is the only row here and reads neither logits processors nor a seed
        (a solo row keeps neither the batch's history buffers nor, on CUDA, a seeded row's
        bits: it runs solo only if it started so)."""
        d = self._decode
        if self._waiting or len(self._prefill) or d.live != 1:
            return None
        i = next(j for j, u in enumerate(d.uids) if u is not None)
        if d.processors[i] or isinstance(d.samplers[i], SeededSampler):
            return None
        uid = d.uids[i]
        taken = (uid, [c.extract(i) for c in d.layers], list(d.tokens[i]),
                 d.next_tokens[i:i + 1], d.next_logprobs[i], d.samplers[i])
        self.remove(uid)  # (held rows go too)
        return taken

    def remove(self, uid: int) -> None:
        stage, i = self._where(uid)
        if stage == "waiting":
            del self._waiting[i]
            return
        if self.drafter is not None:
            self._forget(uid)
        if stage == "prefill":
            self._prefill.remove(i)
        else:
            self.dropped += self._decode.drop_retired(also=(i,))

    def rollback(self, uid: int, n: int) -> None:
        """Drop the last `n` tokens of a decoding row from its KV (rejected draft tokens)."""
        stage, i = self._where(uid)
        if stage != "decode":
            raise ValueError(f"row {uid} is not decoding")
        for c in self._decode.layers:
            c.rollback(i, n)
        del self._decode.tokens[i][-n:]

    @property
    def nbytes(self) -> int:
        """KV bytes held by every row (waiting rows' caches included)."""
        return (sum(c.nbytes for s in self._waiting for c in s.cache)
                + self._prefill.batch.nbytes + self._decode.nbytes)

    def __len__(self) -> int:
        return len(self._waiting) + len(self._prefill) + self._decode.live
