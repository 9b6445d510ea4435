"""The model runner: loads the plan's model through mlx_lm.load and runs forward passes.

Only the engine thread may call into it (MLX streams are thread-local).
"""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx

from appliance.engine.kv import Scheme
from appliance.engine.kv.passes import prefilling
from appliance.engine.sampling import make_processors, make_sampler
from appliance.engine.types import SamplingParams

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def load(path: str, dtype: str, revision: str | None = None, dequantize: bool = False):
    """(model, tokenizer) exactly as mlx_lm.load gives them, cast to the plan's dtype;
    with `dequantize`, quantized layers held dense in it (appliance.models.dense)."""
    from mlx_lm import load as mlx_load

    model, tokenizer = mlx_load(path, lazy=True, revision=revision)
    model.set_dtype(DTYPES[dtype])  # floating parameters only; quantized blocks stay packed
    mx.eval(model.parameters())
    if dequantize:
        from appliance.models.dense import dequantize as dense

        dense(model, DTYPES[dtype])
    return model, tokenizer


class Decoder:
    """One row decoded alone, exactly as mlx_lm.generate.generate_step does it.

    Same prefill chunking (all but the last prompt token, `prefill_chunk` at a
    time), same sampler and processor calls in the same order, and the same
    one-step pipelining (step t+1 is queued before token t is read), so the
    tokens equal mlx-lm's for the same settings and seed (a seeded row's private
    key stream equals mlx-lm's `mx.random.seed` stream). Its state (`cache`, the
    sampled-but-unread `pending` token, `history`) can be handed to a batch.
    """

    def __init__(self, model, prompt: list[int], sampling: SamplingParams, prefill_chunk: int,
                 cache: list | None = None, cached: int = 0, checkpoints: tuple[int, ...] = (),
                 on_checkpoint=None, scheme: Scheme | None = None, eager: bool = True):
        """`cache` already holds prompt[:cached] (a prefix-cache hit). Prefill pauses at
        every checkpoint in `checkpoints` and at len(prompt) - 1 when `on_checkpoint` is
        given, calling on_checkpoint(tokens, cache) there (the callee copies). `scheme`:
        the KV scheme; its quantized layers convert after each forward pass once they hold
        `kv.start` tokens, as generate_step's `kv_bits` does. Not `eager`: the caller runs
        the prefill a chunk at a time (`prefill`), so a long prompt can be cancelled or
        stopped between its chunks."""
        self.model, self.scheme = model, scheme or Scheme()
        self.sampler, self.processors = make_sampler(sampling), make_processors(sampling)
        self.cache = cache if cache is not None else self.scheme.make_cache(model)
        self.history = list(prompt)  # every token fed to the cache so far, in order
        self._seen = mx.array(prompt[:cached]) if self.processors and cached else None
        self.emitted = 0
        self._chunks = self._prefill(prompt, cached, checkpoints, on_checkpoint, prefill_chunk)
        while eager and not self.prefill():
            pass

    @property
    def prefilled(self) -> bool:
        """Whether the prompt is in and its first token queued (`pending`)."""
        return self._chunks is None

    def prefill(self) -> bool:
        """Run the next prefill chunk; True once the prompt is in (then nothing more to run)."""
        if self._chunks is None:
            return True
        try:
            next(self._chunks)
            return False
        except StopIteration:
            self._chunks = None
            return True

    def _prefill(self, prompt, cached, checkpoints, on_checkpoint, prefill_chunk):
        stops = sorted({c for c in checkpoints if cached < c < len(prompt) - 1}
                       | {len(prompt) - 1}) if on_checkpoint else []
        pos, rest = cached, mx.array(prompt[cached:])
        while rest.size > 1:
            n = min(prefill_chunk, rest.size - 1)
            if stops and stops[0] > pos:
                n = min(n, stops[0] - pos)
            with prefilling(self.cache):  # (a one-token chunk too: quantized._Stored)
                self.model(rest[:n][None], cache=self.cache)
            self.scheme.maybe_quantize(self.cache)
            mx.eval([c.state for c in self.cache])
            if self.processors:
                self._seen = rest[:n] if self._seen is None else mx.concat([self._seen, rest[:n]])
            rest, pos = rest[n:], pos + n
            if stops and pos == stops[0]:
                stops.pop(0)
                on_checkpoint(prompt[:pos], self.cache)
            if n == prefill_chunk:  # free a long prefill's activations, as generate_step does;
                mx.clear_cache()  # not a short suffix's (a cache hit): on CUDA it syncs the device
            yield
        self.pending, self.pending_logprobs = self._step(rest)
        mx.async_eval(self.pending, self.pending_logprobs)

    @classmethod
    def resume(cls, model, cache: list, history: list[int], pending: mx.array,
               pending_logprobs: mx.array, sampler, scheme: Scheme | None = None) -> Decoder:
        """A row taken out of a batch (one without logits processors): `cache` holds
        `history`, and `pending` ([1], sampled, not yet fed) comes next."""
        d = cls.__new__(cls)
        d.model, d.scheme = model, scheme or Scheme()
        d.sampler, d.processors, d._seen = sampler, [], None
        d.cache, d.history = cache, list(history)
        d.pending, d.pending_logprobs, d.emitted = pending, pending_logprobs, 0
        d._chunks = None
        return d

    def _step(self, inp: mx.array):
        logits = self.model(inp[None], cache=self.cache)[:, -1, :]
        self.scheme.maybe_quantize(self.cache)
        if self.processors:
            self._seen = inp if self._seen is None else mx.concat([self._seen, inp])
            for p in self.processors:
                logits = p(self._seen, logits)
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        return self.sampler(logprobs), logprobs.squeeze(0)

    def next(self, last: bool = False) -> tuple[int, mx.array]:
        """Read the pending token; unless it is the `last`, queue the step after it first."""
        y, logprobs = self.pending, self.pending_logprobs
        if not last:
            self.pending, self.pending_logprobs = self._step(y)
            mx.async_eval(self.pending, self.pending_logprobs)
        tok = y.item()
        if not last:
            self.history.append(tok)  # fed to the cache by the step just queued
        if self.emitted and self.emitted % 256 == 0:  # not before the first token is out
            mx.clear_cache()
        self.emitted += 1
        return tok, logprobs


def generate(model, prompt: list[int], max_tokens: int, sampling: SamplingParams,
             prefill_chunk: int, scheme: Scheme | None = None) -> Iterator[tuple[int, mx.array]]:
    """(token id, log-probabilities) for one request, as mlx_lm's generate_step yields them."""
    d = Decoder(model, prompt, sampling, prefill_chunk, scheme=scheme)
    for n in range(max_tokens):
        yield d.next(last=n + 1 == max_tokens)
