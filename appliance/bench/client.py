"""The fleet's clients: streamed chat completions over httpx, timed at the SSE chunk.

SSE is parsed directly (not through the openai client) so the clock reads the
moment a chunk arrives, with nothing buffered in between, and the same code
measures every server.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from appliance.bench.stats import RequestResult

TIMEOUT = httpx.Timeout(600.0, connect=30.0)  # a slow CPU run is slow, not broken


@dataclass(frozen=True)
class Endpoint:
    """Where requests go and what every request carries."""

    url: str  # base URL, no trailing /v1
    model: str  # the `model` field the server accepts
    logit_bias: dict[str, float]
    poll_stats: bool  # the appliance's GET /stats (active_rows)


def chat_body(ep: Endpoint, system: str, user: str, max_tokens: int) -> dict:
    return messages_body(ep, [{"role": "system", "content": system},
                              {"role": "user", "content": user}], max_tokens)


def messages_body(ep: Endpoint, messages: list[dict], max_tokens: int) -> dict:
    return {
        "model": ep.model, "stream": True, "stream_options": {"include_usage": True},
        "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
        "logit_bias": ep.logit_bias,
    }


async def stream_request(http: httpx.AsyncClient, path: str, body: dict,
                         result: RequestResult) -> RequestResult:
    """Send one streaming request, filling `result` (start is stamped here)."""
    chunks = 0
    result.start = time.perf_counter()
    try:
        async with http.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {text[:300]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                now = time.perf_counter()
                obj = json.loads(payload)
                if "error" in obj:
                    result.error = f"stream error: {json.dumps(obj['error'])[:300]}"
                    return result
                for choice in obj.get("choices") or []:
                    # chat streams a delta, completions a text field
                    text = (choice.get("delta") or {}).get("content") or choice.get("text")
                    if text:
                        chunks += 1
                        result.text += text
                        result.last_token = now
                        if result.first_token is None:
                            result.first_token = now
                if usage := obj.get("usage"):
                    result.completion_tokens = usage.get("completion_tokens", 0)
                    result.prompt_tokens = usage.get("prompt_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    result.cached_tokens = details.get("cached_tokens")
                    result.usage_reported = True
        result.end = time.perf_counter()
        if not result.usage_reported:
            result.completion_tokens = chunks  # one token per content chunk, at best
        if result.first_token is None:
            result.error = "no content was streamed"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
    return result


def arrival_offsets(clients: int, stagger_s: float, jitter_s: float, seed: int) -> list[float]:
    """Client i starts at i * stagger_s + uniform[0, jitter_s), reproducibly."""
    rng = random.Random(seed)
    return [i * stagger_s + rng.uniform(0.0, jitter_s) for i in range(clients)]


async def poll_active_rows(http: httpx.AsyncClient, stop: asyncio.Event) -> int | str:
    """Largest `active_rows` seen on GET /stats every ~50 ms (the rows actually admitted)."""
    best = 0
    while not stop.is_set():
        try:
            r = await http.get("/stats")
            if r.status_code != 200:
                return "n/a"
            best = max(best, int(r.json().get("active_rows", 0)))
        except (httpx.HTTPError, ValueError):
            pass  # a missed poll under load is not an error of the run
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except asyncio.TimeoutError:
            pass
    return best


async def engine_seconds(http: httpx.AsyncClient) -> dict | None:
    """The engine's own account from GET /stats after a run (warm-up included): seconds in
    prefill and in decode steps, tokens generated, the prefix cache's hits, and MLX's memory
    (active, buffer cache, peak, limit, failed allocations)."""
    try:
        s = (await http.get("/stats")).json()
    except (httpx.HTTPError, ValueError):
        return None
    return {k: s.get(k) for k in ("prefill_seconds", "decode_seconds", "tokens_generated",
                                  "cache", "memory")}


@dataclass(frozen=True)
class FleetSpec:
    clients: int
    requests_per_client: int
    max_tokens: int
    stagger_s: float
    jitter_s: float
    seed: int
    warmup: int


async def _fleet(ep: Endpoint, spec: FleetSpec, system: str, users: list[str],
                 advance: Callable[[], None]) -> tuple[list[RequestResult], int | str, float]:
    limits = httpx.Limits(max_connections=spec.clients + 4)
    async with httpx.AsyncClient(base_url=ep.url, timeout=TIMEOUT, limits=limits) as http:
        # Warm-up: untimed, one after another, on turns no timed request uses.
        for k in range(spec.warmup):
            w = await stream_request(http, "/v1/chat/completions",
                                     chat_body(ep, system, users[k], spec.max_tokens),
                                     RequestResult(-1, k, 0.0))
            if w.error:
                raise RuntimeError(f"warm-up request failed: {w.error}")
        timed = users[spec.warmup:]
        offsets = arrival_offsets(spec.clients, spec.stagger_s, spec.jitter_s, spec.seed)
        stop = asyncio.Event()
        poller = asyncio.ensure_future(poll_active_rows(http, stop) if ep.poll_stats
                                       else asyncio.sleep(0, result="n/a"))

        async def agent(i: int, t_start: float) -> list[RequestResult]:
            await asyncio.sleep(max(0.0, t_start - time.perf_counter()))
            out = []
            for j in range(spec.requests_per_client):
                user = timed[i * spec.requests_per_client + j]
                out.append(await stream_request(
                    http, "/v1/chat/completions",
                    chat_body(ep, system, user, spec.max_tokens), RequestResult(i, j, 0.0)))
                advance()
            return out

        t0 = time.perf_counter()
        per_agent = await asyncio.gather(*(agent(i, t0 + off) for i, off in enumerate(offsets)))
        stop.set()
        admitted = await poller
    results = [r for rs in per_agent for r in rs]
    return results, admitted, t0


def run_fleet(ep: Endpoint, spec: FleetSpec, system: str, users: list[str],
              advance: Callable[[], None] = lambda: None,
              ) -> tuple[list[RequestResult], int | str, float]:
    """Warm up, then run every agent; returns (results, max active_rows, t0).
    `advance()` is called as each timed request ends (a progress bar)."""
    need = spec.warmup + spec.clients * spec.requests_per_client
    if len(users) < need:
        raise ValueError(f"{need} user turns are needed, {len(users)} were given")
    return asyncio.run(_fleet(ep, spec, system, users, advance))
