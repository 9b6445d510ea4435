"""The rows a `BatchStep` is prefilling, and the passes that feed them their prompts.

Each tick, `cut()` takes one chunk of at most `prefill_chunk` prompt tokens per row. A chunk
stops at each checkpoint (where the prefix cache takes the row's KV), except a lone native
row's, which runs on and has each checkpoint sliced from its cache afterwards. `run()` feeds
the chunks in one pass (right-padded when uneven, then rolled back to left padding); on CUDA
a lone native row's pass starts on a grid, so its shapes recur (`_grid_pass`). A row whose
prompt is down to its last token leaves with `take()`: that token is its first decode step's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import mlx.core as mx

from appliance.engine.kv import Scheme
from appliance.engine.kv.native import FullLayout
from appliance.engine.kv.passes import causal, fusable, prefilling, whole_buffers
from appliance.engine.rows import ROW_LISTS, _Batch, _Decoding
from appliance.engine.speculate import WHOLE_BUFFER, Tapped
from appliance.engine.speculate.shapes import pass_width
from appliance.plan.derive import GRID  # a lone row's fused pass starts on it (CUDA)


def prefill_width(n: int) -> int:
    """The tokens per row a prefill pass of n feeds on CUDA (right-padded): `pass_width`,
    at least 16. With keys spanning whole buffers (a multiple of 256 slots) few shapes
    recur, and every prefix hit's tail no longer builds graphs of its own."""
    return max(16, pass_width(n))


@dataclass
class PromptEvent:
    """A prefill chunk ran for `uid`; `end_of_segment`: it ended one of its segments (a
    checkpoint: the prefix cache may take the row's first `at` tokens now)."""

    uid: int
    end_of_segment: bool
    end_of_prompt: bool
    at: int = 0  # the tokens in the row's KV at this event


def observe(model, drafter, uids: list[int], fed: list[list[int]],
            decoding: bool = False, step: bool = False) -> None:
    """Tell an MTP drafter what the model just fed each row, with its hidden states."""
    if isinstance(model, Tapped):
        drafter.observe(uids, fed, model.hidden, decoding, step)


def hidden(model) -> list:
    return [model.hidden] if isinstance(model, Tapped) else []


class Prefill:
    """Rows being prefilled: one batch, and what is left of each row's prompt segments."""

    def __init__(self, model, scheme, prefill_chunk: int, drafter=None):
        self.model, self.scheme, self.prefill_chunk = model, scheme, prefill_chunk
        self.drafter = drafter
        self.batch = _Batch()
        self.segments: list[list[list[int]]] = []  # per row: the segments still to feed

    def __len__(self) -> int:
        return len(self.batch)

    def admit(self, seqs: list, model_layers: int) -> None:
        """Rows start prefilling (`step._Seq`s; a cache's layers past `model_layers` are
        the drafter's)."""
        batch = _Batch([s.uid for s in seqs],
                       self.scheme.merge([s.cache[:model_layers] for s in seqs]),
                       [s.tokens for s in seqs], [s.sampler for s in seqs],
                       [s.processors for s in seqs], [s.max_tokens for s in seqs],
                       [s.params for s in seqs],
                       Scheme().merge([s.cache[model_layers:] for s in seqs])
                       if len(seqs[0].cache) > model_layers else [])
        self.batch.extend(batch)
        self.segments += [s.segments for s in seqs]

    def remove(self, i: int) -> None:
        keep = [j for j in range(len(self.batch)) if j != i]
        self.batch.filter(keep)
        self.segments = [self.segments[j] for j in keep]

    def ready(self) -> list[int]:
        """The rows whose prompt is down to its last token."""
        return [i for i, segs in enumerate(self.segments) if len(segs) == 1
                and len(segs[0]) == 1]

    def take(self, ready: list[int]) -> tuple[_Decoding, list[int]]:
        """The `ready` rows leave: as decoding rows over their own caches, with their last
        prompt tokens."""
        rest = [i for i in range(len(self.batch)) if i not in ready]
        last = [self.segments[i][0][0] for i in ready]
        rows = _Decoding()
        for name in ROW_LISTS:
            setattr(rows, name, [getattr(self.batch, name)[i] for i in ready])
        if rest:
            rows.layers = copy.deepcopy(self.batch.layers)
            rows.extra = copy.deepcopy(self.batch.extra)
            self.batch.filter(rest)
        else:
            rows.layers, rows.extra, self.batch = self.batch.layers, self.batch.extra, _Batch()
        for c in rows.layers + rows.extra:
            c.filter(ready)  # also drops the padding the ready rows share, as mlx-lm does
        self.segments = [self.segments[i] for i in rest]
        return rows, last

    def cut(self) -> tuple[list[list[int]], list[PromptEvent]]:
        """This tick's chunk for each row, and the events they end."""
        chunks, events = [], []
        across = self.lone_native()
        for i, segs in enumerate(self.segments):
            uid, start = self.batch.uids[i], len(self.batch.tokens[i])
            room = self.prefill_chunk  # (past kv.start too: the row encodes after it)
            chunk, end = [], False
            # A lone native row's chunk runs on past its checkpoints (each is sliced from
            # its cache afterwards), not up to the last prompt token (the decode step's)
            while room > 0 and (not chunk or (across and len(segs) > 1)):
                take = segs[0][:room]
                chunk += take
                room -= len(take)
                segs[0] = segs[0][len(take):]
                end = not segs[0]
                if not end:
                    break
                segs.pop(0)
                events.append(PromptEvent(uid, True, False, start + len(chunk)))
            if not end:
                events.append(PromptEvent(uid, False, False, start + len(chunk)))
            chunks.append(chunk)
        return chunks, events

    def lone_native(self) -> bool:
        """One row prefilling, every model layer a native full-attention layout without
        holes: its pass may run past checkpoints, each sliced from the model's layers
        afterwards (`BatchStep.extract`: like every entry, the model's layers only)."""
        return len(self.batch) == 1 and all(type(c) is FullLayout and c._holes is None
                                            for c in self.batch.layers)

    def _grid_fits(self) -> bool:
        """A lone native row with nothing beside the model (a drafter's layers or hidden
        states): on CUDA its pass starts on the grid (`_grid_pass`)."""
        return (self.lone_native() and not self.batch.extra
                and not isinstance(self.model, Tapped))

    def run(self, chunks: list[list[int]], rest: bool = False) -> None:
        """Run one chunk per row (right-padded when uneven, then re-aligned). `rest`: the
        drafter rests (its control does, at the row count these rows join): a Tapped model
        runs as the bare model, keeping no hidden states (a pass that keeps only the KV
        never computes the last layer's attention and MLP: on a 2-core CPU a tapped pass
        cost 12-27% more), and the MTP head drops these rows' pairs; a draft model does not
        follow (its KV lags, and restarts from the row's last LAG_MAX tokens at its next
        proposal: under a CPU agents load its prefill beside the model's cost 1.3x)."""
        if not chunks:
            return
        for row, c in zip(self.batch.tokens, chunks, strict=True):
            row += c
        lengths = [len(c) for c in chunks]
        fused = WHOLE_BUFFER and fusable(self.batch.layers, len(self.batch))
        if fused and self._grid_fits():
            self._grid_pass(chunks[0])
        else:
            self._padded_pass(chunks, lengths, fused, rest)
        if max(lengths) >= self.prefill_chunk:
            # Free a whole chunk's activations, as generate_step does; not a short tail's
            # (most chunks under an agent load, after a prefix hit): on CUDA this syncs the
            # device and empties MLX's buffer pool, which the next steps then refill.
            # MLX's cache limit (the plan's buffer_cache_bytes) bounds the pool meanwhile.
            mx.clear_cache()

    def _grid_pass(self, chunk: list[int]) -> None:
        """A lone native row's fused pass on CUDA, in shapes that recur: MLX's CUDA
        attention builds a cuDNN graph for every (query length, key length, buffer) it
        meets, ~40 ms each, and the rest of a pass at a new length costs as much again
        (measured on an H200, 1B shape: ~90 ms a new-shape tail pass against ~9 ms once
        seen; a 16-agent run met ~30 of them). So the pass starts at the multiple of GRID
        below the row's end (the cache steps back, the tokens in between are fed again:
        the same keys), is right-padded to `prefill_width`, over a buffer of whole
        `step`s, and its padding is trimmed after. The padding comes after every real
        token, so causal attention keeps it out of theirs."""
        layers, tokens = self.batch.layers, self.batch.tokens[0]
        start = len(tokens) - len(chunk)
        back = start % GRID
        fed = tokens[start - back:]
        width = prefill_width(len(fed))
        for c in layers:
            c.trim(back)
            c.on_grid(width)
        with causal(layers, True):
            self.model(mx.array([fed + [0] * (width - len(fed))]), cache=layers)
        for c in layers:
            c.trim(width - len(fed))
        # Queued, not waited for: the running rows' next step does not read this row's KV,
        # so the host builds that step (and hands out the tick's events) while the pass
        # runs. MLX allocates as it queues, so a failed allocation still raises here.
        mx.async_eval([c.state for c in layers])

    def _padded_pass(self, chunks: list[list[int]], lengths: list[int], fused: bool,
                     rest: bool = False) -> None:
        untapped = rest and isinstance(self.model, Tapped)
        layers, model = self.batch.layers, self.model.model if untapped else self.model
        width = prefill_width(max(lengths)) if WHOLE_BUFFER and not fused else max(lengths)
        pad = [width - n for n in lengths]
        if max(pad) > 0:
            x = mx.array([c + [0] * p for c, p in zip(chunks, pad, strict=True)])
            for c in layers:
                c.prepare(lengths=lengths, right_padding=pad)
        else:
            x = mx.array(chunks)
        with whole_buffers(layers, width, WHOLE_BUFFER and not fused), \
                causal(layers, fused), prefilling(layers):
            model(x, cache=layers)
        if untapped:
            self.drafter.drop(self.batch.uids)
        else:
            observe(model, self.drafter, self.batch.uids, chunks)
        # Queued where nothing below reads it (see _grid_pass; a 2-core CPU's agents bench:
        # 1.03x paired over 12 pairs); waited for before re-aligning or a drafter's prefill
        done = [c.state for c in layers], hidden(model)
        if max(pad) > 0 or (self.batch.extra and not rest):
            mx.eval(*done)
        else:
            mx.async_eval(*done)
        if self.batch.extra and not rest:  # a draft model or MTP head prefills beside
            self.drafter.prefill(self.batch, chunks)
        if max(pad) > 0:
            for c in layers:
                c.finalize()
            mx.eval([c.state for c in layers])
