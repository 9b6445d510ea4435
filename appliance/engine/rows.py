"""The rows a `BatchStep` holds together: per-row lists plus one KV layout per layer, and
the running rows' pipelined decode step (the plain one; the verify pass is `verify.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.models.cache import TokenBuffer

from appliance.engine.compiled import compilable
from appliance.engine.kv.native import FullLayout
from appliance.engine.kv.passes import whole_buffers
from appliance.engine.sampling import BiasTable, after_bias
from appliance.engine.speculate import WHOLE_BUFFER
from appliance.engine.verify import Verifying

ROW_LISTS = ("uids", "tokens", "samplers", "processors", "max_tokens", "params")


@dataclass
class _Batch:
    """Rows held together: per-row lists plus one KV layout per layer (`extra`: the
    drafter's own layers, a draft model's or an MTP head's, held the same way)."""

    uids: list[int] = field(default_factory=list)
    layers: list = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)  # the tokens in each row's KV
    samplers: list = field(default_factory=list)
    processors: list[tuple] = field(default_factory=list)
    max_tokens: list[int] = field(default_factory=list)
    params: list = field(default_factory=list)
    extra: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.uids)

    def extend(self, other: _Batch) -> None:
        for name in ("layers", "extra"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if not mine:
                setattr(self, name, theirs)
            elif theirs:
                for a, b in zip(mine, theirs, strict=True):
                    a.extend(b)
        mx.async_eval(_books(self.layers + self.extra))  # (see _books)
        for name in ROW_LISTS:
            getattr(self, name).extend(getattr(other, name))

    def filter(self, keep: list[int]) -> None:
        if not keep:
            self.layers, self.extra = [], []
        else:
            layers = self.layers + self.extra
            mx.eval(_books(layers, offsets=False))  # one wait at most (see _books)
            for c in layers:
                c.filter(keep)
        for name in ROW_LISTS:
            setattr(self, name, [getattr(self, name)[i] for i in keep])

    def extract(self, i: int, layers: int | None = None) -> list:
        """A copy of row `i`'s cache: its first `layers` layers (None: every one)."""
        return [c.extract(i) for c in (self.layers + self.extra)[:layers]]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.layers + self.extra)


def _books(layers: list, offsets: bool = True) -> list[mx.array]:
    """The layers' per-row bookkeeping (left padding, lengths): a filter or extract reads it
    on the host, and reading one lazy array waits for the device, once a layer: on an H200
    (8B shape, 32 layers) a row leaving cost ~45 ms so, against ~5 ms with one wait.
    `offsets=False`: left padding only. A filter never reads lengths, and every forward
    pass adds to them lazily, so evaluating them would wait for the pass queued last."""
    names = ("left_padding", "offset") if offsets else ("left_padding",)
    return [x for c in layers for x in (getattr(c, n, None) for n in names)
            if isinstance(x, mx.array)]


class _Decoding(_Batch, Verifying):
    """The running rows, with their pipelined state."""

    def __init__(self):
        super().__init__()
        # Sampled, not yet read. Re-formed when rows join or leave, it is queued at once:
        # left lazy, it would be computed inside the next pass's evaluation, and MLX signals
        # an evaluation's arrays together, so reading it would wait for that whole pass
        # rather than only the one before.
        self.next_tokens: mx.array | None = None
        self.known_pend: list[int] | None = None  # next_tokens as read (after a verify pass)
        self.next_logprobs: list[mx.array] = []
        self.context: list[TokenBuffer] = []  # token history for logits processors
        self.generated: list[int] = []
        self.biases = BiasTable()
        self.retired: list[int] = []  # uids of finished rows still held (`retire`)
        self.slots: list[int] = []  # where each of them is (a filter drops them all)

    @property
    def live(self) -> int:
        """Rows still decoding (the others are retired, held until `drop_retired`)."""
        return len(self.uids) - len(self.retired)

    def retire(self, i: int) -> None:
        """Row i finished, but its slot stays in the batch, decoding tokens nobody reads,
        until the next re-forming (`drop_retired`): on CUDA a batch re-formed by a filter
        matches no cached CUDA graph, and its step cost 2-3 steady ones (8B, H200; see
        BatchStep's HOLD)."""
        self.retired.append(self.uids[i])
        self.slots.append(i)
        self.uids[i], self.processors[i] = None, ()

    def drop_retired(self, also: tuple[int, ...] = ()) -> list[int]:
        """Filter the retired rows out (and the rows at `also`); return the retired uids."""
        gone, self.retired, self.slots = self.retired, [], []
        if gone or also:
            self.filter([i for i, u in enumerate(self.uids) if u is not None and i not in also])
        return gone

    def reuse(self, other: _Decoding) -> tuple[list[int], list[int]]:
        """Rows of `other` (joining) written into held rows' slots, each row's KV
        right-aligned at the batch's cursor (`FullLayout.put`), in place: no other row's
        KV is copied and the batch keeps its shapes. A join by `extend` after a filter
        copies the whole batch twice, in a new buffer of a new size: on a 2-core CPU the
        step after a join took 42-112 ms against 8-19 (2-8 rows), and on CUDA a new batch
        size also meets no built graph. Where every layer is a native full-attention one
        without holes and the row fits under the cursor. Returns the held rows' uids whose
        KV went, and the indices of `other`'s rows placed."""
        if not self.slots or self.extra or other.extra or not all(
                type(c) is FullLayout and c._holes is None and c.keys is not None
                for c in self.layers + other.layers):
            return [], []
        gone, placed = [], []
        pads = other.layers[0].left_padding.tolist()  # (every layer's rows agree)
        for j, pad in enumerate(pads):
            if not self.slots or other.layers[0]._idx - pad > self.layers[0]._idx:
                continue
            i, uid = self.slots.pop(), self.retired.pop()
            for mine, theirs in zip(self.layers, other.layers, strict=True):
                mine.put(i, theirs, j, pad)
            for name in ROW_LISTS:
                getattr(self, name)[i] = getattr(other, name)[j]
            self.next_tokens[i] = other.next_tokens[j]
            self.next_logprobs[i] = other.next_logprobs[j]
            self.context[i], self.generated[i] = other.context[j], other.generated[j]
            gone.append(uid)
            placed.append(j)
        if placed:
            self.known_pend = None
            mx.async_eval(self.next_tokens, _books(self.layers))  # (see __init__)
        return gone, placed

    def extend(self, other: _Decoding) -> None:
        super().extend(other)
        if self.next_tokens is None:
            self.next_tokens = other.next_tokens
        elif other.next_tokens is not None:
            self.next_tokens = mx.concatenate([self.next_tokens, other.next_tokens])
            mx.async_eval(self.next_tokens)  # (see __init__)
        self.next_logprobs.extend(other.next_logprobs)
        self.known_pend = None
        self.context.extend(other.context)
        self.generated.extend(other.generated)

    def filter(self, keep: list[int]) -> None:
        super().filter(keep)
        self.next_tokens = self.next_tokens[mx.array(keep)] if keep else None
        if keep:
            mx.async_eval(self.next_tokens)  # (see __init__)
        if self.known_pend is not None:
            self.known_pend = [self.known_pend[i] for i in keep]
        self.next_logprobs = [self.next_logprobs[i] for i in keep]
        self.context = [self.context[i] for i in keep]
        self.generated = [self.generated[i] for i in keep]

    def step(self, model, compiled=None) -> tuple[list[int], list[mx.array]]:
        """Queue the forward pass over the pending tokens; return the previous step's.
        `compiled`: a CompiledDecode, used where the layers allow it (`compilable`)."""
        inputs, current_logprobs = self.next_tokens, self.next_logprobs
        if compiled is not None and compilable(model, self.layers):
            logits = compiled(inputs, self.layers)
        else:
            # (on CUDA over whole buffers, as verify passes do: a sliced buffer is not
            # contiguous, and attention copied it every step; measured on an H200, the
            # whole buffer was 3-7% faster at B=8/32)
            with whole_buffers(self.layers, 1, WHOLE_BUFFER):
                logits = model(inputs[:, None], cache=self.layers)[:, -1, :]
        context = []
        if any(self.processors):
            logits = self.biases.add(logits, self.processors)  # every row's bias at once
            rest = [after_bias(p) for p in self.processors]
            if any(rest):
                rows = []
                for e, procs in enumerate(rest):
                    row = logits[e:e + 1]
                    if procs:
                        ctx = self.context[e].update_and_fetch(inputs[e:e + 1])
                        context.append(ctx)
                        for p in procs:
                            row = p(ctx, row)
                    rows.append(row)
                logits = mx.concatenate(rows, axis=0)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if all(s is self.samplers[0] for s in self.samplers):
            sampled = self.samplers[0](logprobs)  # one call for rows sharing a sampler
        else:
            sampled = mx.concatenate([s(logprobs[e:e + 1])
                                      for e, s in enumerate(self.samplers)], axis=0)
        self.next_tokens, self.next_logprobs = sampled, list(logprobs)
        self.known_pend = None
        mx.async_eval(self.next_tokens, self.next_logprobs, context)
        mx.eval(inputs, current_logprobs)
        toks = inputs.tolist()
        for row, t in zip(self.tokens, toks, strict=True):
            row.append(t)  # now in the row's KV
        return toks, current_logprobs
