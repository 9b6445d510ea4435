"""The model runner: loads the plan's model through mlx_lm.load and runs forward passes.

Only the engine thread may call into it (MLX streams are thread-local).
"""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx

from appliance.engine.sampling import make_processors, make_sampler
from appliance.engine.types import SamplingParams

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def load(path: str, dtype: str, revision: str | None = None):
    """(model, tokenizer) exactly as mlx_lm.load gives them, cast to the plan's dtype."""
    from mlx_lm import load as mlx_load

    model, tokenizer = mlx_load(path, lazy=True, revision=revision)
    model.set_dtype(DTYPES[dtype])  # floating parameters only; quantized blocks stay packed
    mx.eval(model.parameters())
    return model, tokenizer


def generate(model, prompt: list[int], max_tokens: int, sampling: SamplingParams,
             prefill_chunk: int) -> Iterator[tuple[int, mx.array]]:
    """(token id, log-probabilities) for one request, as mlx_lm's generate_step computes them.

    Same prefill chunking (all but the last prompt token, `prefill_chunk` at a
    time), same sampler and processor calls in the same order, and the same
    one-step pipelining (step t+1 is queued before token t is read), so the
    tokens are identical to mlx-lm's for the same settings and seed (a seeded
    row's private key stream equals mlx-lm's `mx.random.seed` stream).
    """
    from mlx_lm.models.cache import make_prompt_cache

    sampler, processors = make_sampler(sampling), make_processors(sampling)
    cache = make_prompt_cache(model)
    seen = None  # tokens the processors look back over

    def step(inp: mx.array):
        nonlocal seen
        logits = model(inp[None], cache=cache)[:, -1, :]
        if processors:
            seen = inp if seen is None else mx.concat([seen, inp])
            for p in processors:
                logits = p(seen, logits)
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        return sampler(logprobs), logprobs.squeeze(0)

    rest = mx.array(prompt)
    while rest.size > 1:
        n = min(prefill_chunk, rest.size - 1)
        model(rest[:n][None], cache=cache)
        mx.eval([c.state for c in cache])
        if processors:
            seen = rest[:n] if seen is None else mx.concat([seen, rest[:n]])
        rest = rest[n:]
        mx.clear_cache()

    y, logprobs = step(rest)
    mx.async_eval(y, logprobs)
    for n in range(max_tokens):
        if n + 1 < max_tokens:  # queue the next step before reading this token
            next_y, next_logprobs = step(y)
            mx.async_eval(next_y, next_logprobs)
        yield y.item(), logprobs
        if n % 256 == 0:
            mx.clear_cache()
        if n + 1 < max_tokens:
            y, logprobs = next_y, next_logprobs
