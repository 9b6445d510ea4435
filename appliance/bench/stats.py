"""Pure aggregation of measured requests: percentiles, medians, the fleet summary.

No I/O and no MLX here, so the arithmetic is tested on fixed numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class RequestResult:
    """One streamed request as the client saw it (times in seconds, perf_counter based)."""

    client: int
    turn: int
    start: float  # just before the request was sent
    first_token: float | None = None  # first SSE chunk carrying non-empty content
    last_token: float | None = None  # last SSE chunk carrying non-empty content
    end: float | None = None  # [DONE] (or the end of the stream)
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens the server took from its prefix cache
    usage_reported: bool = False  # False: completion_tokens counts content chunks
    error: str | None = None
    text: str = ""  # the streamed content (an agent sends it back as the assistant's turn)

    @property
    def ok(self) -> bool:
        return self.error is None and self.first_token is not None and self.end is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    def decode_tps(self) -> float | None:
        """(tokens - 1) / (end - first token): the first token belongs to prefill."""
        if not self.ok or self.completion_tokens < 2 or self.end <= self.first_token:
            return None
        return (self.completion_tokens - 1) / (self.end - self.first_token)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def aggregate_tps(results: Sequence[RequestResult]) -> float:
    """Wall-clock aggregate: all completion tokens / (last end - first start)."""
    ok = [r for r in results if r.ok]
    if not ok:
        return math.nan
    span = max(r.end for r in ok) - min(r.start for r in ok)
    return sum(r.completion_tokens for r in ok) / span if span > 0 else math.nan


def _r(x: float, nd: int = 2) -> float | None:
    return None if x is None or math.isnan(x) else round(x, nd)


def summarize_fleet(results: Sequence[RequestResult], admitted_rows: int | str) -> dict:
    """The numbers a fleet run is judged by (JSON-ready; NaN becomes None)."""
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft * 1e3 for r in ok]
    decode = [t for r in ok if (t := r.decode_tps()) is not None]
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    wall = (max(r.end for r in ok) - min(r.start for r in ok)) if ok else math.nan
    return {
        "requests": len(results),
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "ttft_ms_p50": _r(percentile(ttfts, 50)),
        "ttft_ms_p95": _r(percentile(ttfts, 95)),
        "aggregate_tok_s": _r(aggregate_tps(results)),
        "request_decode_tok_s_median": _r(median(decode)),
        "admitted_rows": admitted_rows,
        "completion_tokens": sum(r.completion_tokens for r in ok),
        "prompt_tokens_mean": _r(sum(prompts) / len(prompts), 1) if prompts else None,
        "cached_tokens_mean": _r(sum(cached) / len(cached), 1) if cached else None,
        "wall_s": _r(wall, 3),
    }


def summarize_agents(results: Sequence[RequestResult], admitted_rows: int | str,
                     abandoned: int = 0) -> dict:
    """The fleet's numbers, plus TTFT for first turns (cold but for the system prompt) and
    later turns (mostly a seen prefix) apart, the share of prompt tokens the server took
    from its prefix cache (usage.prompt_tokens_details), and what went wrong."""
    s = summarize_fleet(results, admitted_rows)
    ok = [r for r in results if r.ok]
    for name, keep in (("first", lambda r: r.turn == 0), ("later", lambda r: r.turn > 0)):
        ms = [r.ttft * 1e3 for r in ok if keep(r)]
        s[f"ttft_ms_{name}_p50"] = _r(percentile(ms, 50))
        s[f"ttft_ms_{name}_p95"] = _r(percentile(ms, 95))
    told = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    prompt = sum(r.prompt_tokens for r in told)
    s["cache_hit_ratio"] = _r(sum(r.cached_tokens for r in told) / prompt, 3) if prompt else None
    s["abandoned"] = abandoned  # later turns never sent: their conversation's turn failed
    s["error_samples"] = sorted({r.error for r in results if r.error})[:3]
    return s


def request_record(r: RequestResult, t0: float) -> dict:
    """One request for bench.json, times relative to the run's first start `t0`."""
    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 6)

    return {
        "client": r.client, "turn": r.turn, "start_s": rel(r.start),
        "ttft_ms": None if r.ttft is None else round(r.ttft * 1e3, 3),
        "end_s": rel(r.end), "completion_tokens": r.completion_tokens,
        "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
        "usage_reported": r.usage_reported,
        "decode_tok_s": _r(r.decode_tps() or math.nan), "error": r.error,
    }
