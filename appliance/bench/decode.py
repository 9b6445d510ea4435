"""B=1 decode speed: mlx-lm's stream_generate (the anchor), the engine, the engine over HTTP.

Every contender decodes the same short prompt for exactly `decode_tokens`
tokens (EOS banned) and is timed the same way: n / (t_end - t_start), from
just before the request to its last token. Per-token arrival times are not
used: across threads (engine -> event loop) and sockets tokens arrive in
bursts, and text chunks lag tokens whose bytes are not yet valid UTF-8, which
made (n - 1) / (t_last - t_first) read up to 2x high. The 12-token prefill
is inside the span for every contender alike. mlx-lm's own `generation_tps`
is recorded as reported.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from appliance.bench.client import TIMEOUT, stream_request
from appliance.bench.prompts import DECODE_PROMPT, eos_bias
from appliance.bench.stats import RequestResult, median
from appliance.bench.targets import appliance_process
from appliance.plan import ExecutionPlan


def _tps(n: int, t_start: float | None, t_end: float | None) -> float:
    if n < 1 or t_start is None or t_end is None or t_end <= t_start:
        raise RuntimeError(f"cannot time {n} tokens between {t_start} and {t_end}")
    return n / (t_end - t_start)


def _mlx_lm_runs(path: Path, dtype: str, prompt: list[int], n: int, repeats: int,
                 dequantize: bool, advance: Callable[[], None]) -> dict:
    """(a) mlx_lm.generate.stream_generate in this process, warm-up run first."""
    import mlx.core as mx
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    from appliance.oracle import load

    model, tokenizer = load(str(path), dtype, dequantize)
    procs = make_logits_processors(logit_bias={i: -100.0 for i in tokenizer.eos_token_ids})
    runs, reported = [], []
    for k in range(repeats + 1):
        stamps, responses, t0 = [], [], time.perf_counter()
        for resp in stream_generate(model, tokenizer, mx.array(prompt), max_tokens=n,
                                    logits_processors=procs):
            stamps.append(time.perf_counter())
            responses.append(resp)
        last = responses[-1]
        if last.generation_tokens != n:
            raise RuntimeError(f"mlx-lm generated {last.generation_tokens} of {n} tokens")
        if k:  # run 0 is the warm-up
            runs.append(_tps(n, t0, stamps[-1]))
            reported.append(last.generation_tps)
        advance()
    del model, tokenizer  # free the weights before the engine loads its own copy
    gc.collect()
    mx.clear_cache()
    return {"name": "mlx_lm stream_generate", "runs": runs,
            "mlx_lm_generation_tps": [round(x, 2) for x in reported]}


def _engine_runs(engine, prompt: list[int], n: int, repeats: int,
                 advance: Callable[[], None]) -> dict:
    """(b) Engine.submit in-process: token events as the engine delivers them."""
    from appliance.engine import Finished, GenerationRequest, SamplingParams

    bias = {i: -100.0 for i in engine.eos_ids}
    req = GenerationRequest(prompt, n, SamplingParams(temperature=0.0, logit_bias=bias))

    async def one() -> float:
        stamps, fin, t0 = [], None, time.perf_counter()
        async for ev in engine.submit(req):
            if isinstance(ev, Finished):
                fin = ev
            else:
                stamps.append(time.perf_counter())
        if fin.error or len(stamps) != n:
            raise RuntimeError(f"engine: {len(stamps)} of {n} tokens ({fin.error})")
        advance()
        return _tps(n, t0, stamps[-1])

    runs = [asyncio.run(one()) for _ in range(repeats + 1)][1:]
    return {"name": "appliance engine", "runs": runs}


def _http_runs(url: str, model_id: str, tokenizer, n: int, repeats: int,
               advance: Callable[[], None]) -> dict:
    """(c) the appliance over HTTP: /v1/completions streamed, same prompt text."""
    body = {"model": model_id, "prompt": DECODE_PROMPT, "max_tokens": n, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True},
            "logit_bias": eos_bias(tokenizer)}

    async def one(http: httpx.AsyncClient) -> float:
        r = await stream_request(http, "/v1/completions", body, RequestResult(0, 0, 0.0))
        if r.error or r.completion_tokens != n:
            raise RuntimeError(f"http: {r.completion_tokens} of {n} tokens ({r.error})")
        advance()
        return _tps(n, r.start, r.end)

    async def all_runs() -> list[float]:
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as http:
            return [await one(http) for _ in range(repeats + 1)][1:]

    return {"name": "appliance http", "runs": asyncio.run(all_runs())}


def run_decode(plan: ExecutionPlan, cfg, path: Path, tokenizer, target: str,
               overrides: list[str], outdir: Path) -> dict:
    """All contenders the target allows; each with its median and its ratio to mlx-lm."""
    from appliance.bench.progress import bar

    prompt = list(tokenizer.encode(DECODE_PROMPT))  # as /v1/completions tokenizes it
    n, repeats = cfg.decode_tokens, max(1, cfg.repeats)
    runs = (repeats + 1) * (3 if target == "self" else 1)  # each contender warms up first
    names = "mlx_lm, engine, http" if target == "self" else "mlx_lm"
    with bar(f"decode: {names}", runs, cfg.progress) as advance:
        contenders = [_mlx_lm_runs(path, plan.model.dtype, prompt, n, repeats,
                                   plan.model.dequantized, advance)]
        if target == "self":
            from appliance.engine import build_engine

            engine = build_engine(plan)
            try:
                contenders.append(_engine_runs(engine, prompt, n, repeats, advance))
            finally:
                engine.stop()
            # over HTTP the server runs in its own process, as a deployed appliance does: an
            # in-process client would share the GIL with the engine thread
            with appliance_process(plan, overrides, outdir / "appliance.log") as url:
                contenders.append(_http_runs(url, plan.model.id, tokenizer, n, repeats,
                                             advance))
    anchor = median(contenders[0]["runs"])
    for c in contenders:
        c["tok_s_median"] = round(median(c["runs"]), 2)
        c["ratio_to_mlx_lm"] = round(median(c["runs"]) / anchor, 3)
        c["runs"] = [round(x, 2) for x in c["runs"]]
    return {"prompt_tokens": len(prompt), "decode_tokens": n, "repeats": repeats,
            "contenders": contenders}
