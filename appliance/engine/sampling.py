"""Per-row samplers: mlx-lm's sampling chain, with a private random stream per seeded row.

mlx-lm seeds the *global* generator (`mx.random.seed`), so in a batch a seed
would be consumed by siblings too. A seeded row here owns its key and splits
it exactly as MLX's global key sequence does (`key, sub = split(key)`), so a
seeded row gives the same tokens as mlx-lm's serial `mx.random.seed(s)` run,
whatever else is in the batch.
"""

from __future__ import annotations

import functools

import mlx.core as mx
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    greedy_sampler,
    make_logits_processors,
)
from mlx_lm.sample_utils import make_sampler as mlx_make_sampler

from appliance.engine.types import SamplingParams


class SeededSampler:
    """temperature / top_p / min_p / top_k sampling from this row's own key."""

    def __init__(self, s: SamplingParams):
        self.s = s
        self.key = mx.random.key(s.seed)

    def __call__(self, logprobs: mx.array) -> mx.array:
        s = self.s
        if 0 < s.top_p < 1.0:  # same order as mlx_lm.sample_utils.make_sampler
            logprobs = apply_top_p(logprobs, s.top_p)
        if s.min_p != 0.0:
            logprobs = apply_min_p(logprobs, s.min_p, 1)
        if s.top_k > 0:
            logprobs = apply_top_k(logprobs, s.top_k)
        self.key, sub = mx.random.split(self.key)
        return mx.random.categorical(logprobs * (1.0 / s.temperature), key=sub)


MAX_SEED = 2**64 - 1  # MLX random keys are unsigned 64-bit


def check(s: SamplingParams, vocab: int) -> tuple[str, str] | None:
    """(field, problem) for a setting MLX would fail on, or None. Checked before a request
    reaches the engine thread: mlx-lm's top-k is compiled over the global random state, and
    a call that raises there leaves that state broken for every later unseeded row."""
    if not isinstance(s.top_k, int) or not 0 <= s.top_k < vocab:
        return "top_k", f"{s.top_k} is out of range [0, {vocab})"
    if s.seed is not None and (not isinstance(s.seed, int) or not 0 <= s.seed <= MAX_SEED):
        return "seed", f"{s.seed} is out of range [0, {MAX_SEED}]"
    if not s.temperature >= 0:
        return "temperature", f"{s.temperature} must be >= 0"
    return None


def repair_random_state() -> None:
    """After a failed step: if the global random state was left unusable (a compiled
    sampler that raised mid-trace), reseed it so unseeded rows can sample again."""
    import os

    try:
        mx.eval(mx.random.state)
    except Exception:
        mx.random.seed(int.from_bytes(os.urandom(8), "little"))


def distribution(s: SamplingParams, logprobs: mx.array) -> mx.array:
    """The probabilities a sampled row draws from: its top_p / min_p / top_k filters, in
    the samplers' order, then its temperature (speculative sampling compares these)."""
    if 0 < s.top_p < 1.0:
        logprobs = apply_top_p(logprobs, s.top_p)
    if s.min_p != 0.0:
        logprobs = apply_min_p(logprobs, s.min_p, 1)
    if s.top_k > 0:
        logprobs = apply_top_k(logprobs, s.top_k)
    return mx.softmax(logprobs * (1.0 / s.temperature), axis=-1)


def row_key(sampler) -> mx.array | None:
    """A fresh key from a seeded row's own stream (None: the global one)."""
    if isinstance(sampler, SeededSampler):
        sampler.key, sub = mx.random.split(sampler.key)
        return sub
    return None


def seeded(s: SamplingParams) -> bool:
    """Whether a row draws from its own key (`SeededSampler`): never speculated."""
    return s.temperature != 0 and s.seed is not None


def make_sampler(s: SamplingParams):
    """Greedy rows share mlx-lm's greedy sampler, and unseeded rows alike one sampler (so
    such a batch samples in one call)."""
    if s.temperature == 0:
        return greedy_sampler
    if seeded(s):
        return SeededSampler(s)
    return _unseeded(s.temperature, s.top_p, s.min_p, s.top_k)


@functools.lru_cache(maxsize=256)
def _unseeded(temperature: float, top_p: float, min_p: float, top_k: int):
    """Unseeded rows with the same settings share one sampler (it draws from the global
    stream and holds no state), so a batch of them samples in one call, not one a row."""
    return mlx_make_sampler(temp=temperature, top_p=top_p, min_p=min_p, top_k=top_k)


class LogitBias:
    """mlx-lm's logit-bias processor (the same add), kept as data: a batch adds every row's
    bias in one scatter (`BiasTable`) rather than one pass per row. It reads no history
    (`context_free`), so a speculative step applies it to all of a row's positions at once."""

    context_free = True

    def __init__(self, bias: dict[int, float]):
        self.tokens = list(bias)
        self.indices, self.values = mx.array(self.tokens), mx.array(list(bias.values()))

    def __call__(self, _, logits: mx.array) -> mx.array:
        return logits.at[:, self.indices].add(self.values)


def reads_history(procs) -> bool:
    """Whether any of a row's processors reads its token history."""
    return any(not getattr(p, "context_free", False) for p in procs)


def after_bias(procs) -> tuple:
    """A row's processors past its logit bias (which `BiasTable` applies for the batch)."""
    return tuple(procs[1:]) if procs and isinstance(procs[0], LogitBias) else tuple(procs)


class BiasTable:
    """Each row's LogitBias (always its first processor) over a batch's logits, as one
    scatter: per element the same add as row by row, without a pass per row (16 rows on
    an H200 launched 16 small passes a step). Rebuilt when the rows' biases change."""

    def __init__(self):
        self._of: tuple = ()
        self._arrays = None

    def add(self, logits: mx.array, processors: list) -> mx.array:
        """`logits` [B, V] or [B, L, V] (every position of a row gets its bias)."""
        of = tuple(p[0] if p and isinstance(p[0], LogitBias) else None for p in processors)
        if len(of) != len(self._of) or any(a is not b for a, b in zip(of, self._of, strict=True)):
            rows, toks, vals = [], [], []
            for i, b in enumerate(of):
                if b is not None:
                    rows += [i] * len(b.tokens)
                    toks += b.tokens
                    vals.append(b.values)
            self._of = of  # (holding them: an id is not reused while compared)
            self._arrays = (mx.array(rows), mx.array(toks), mx.concatenate(vals)) \
                if rows else None
        if self._arrays is None:
            return logits
        r, t, v = self._arrays
        return logits.at[r, t].add(v) if logits.ndim == 2 else logits.at[r, :, t].add(v[:, None])


def make_processors(s: SamplingParams) -> list:
    """mlx-lm's processors, in its order (the logit bias first, as `LogitBias`)."""
    procs: list = [LogitBias(s.logit_bias)] if s.logit_bias else []
    procs += make_logits_processors(
        repetition_penalty=s.repetition_penalty, presence_penalty=s.presence_penalty,
        frequency_penalty=s.frequency_penalty)
    if s.constraint is not None:  # last: no bias or penalty can reopen a masked token
        procs.append(s.constraint.make_processor())
    return procs


def top_logprobs(logprobs: mx.array, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens of one row's log-probabilities, best first."""
    if k <= 0:
        return []
    idx = mx.argpartition(-logprobs, k - 1)[:k]
    vals = logprobs[idx]
    order = mx.argsort(-vals)
    return list(zip(idx[order].tolist(), vals[order].tolist(), strict=True))
