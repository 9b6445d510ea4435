"""bench=prefix: TTFT for a long shared prefix, cold vs RAM hit vs SSD restore after a restart.

For each prefix length the appliance runs in its own process with
cache=tiered on a fresh SSD directory: three distinct prefixes are sent
cold, then again with another user turn (RAM hits), then the server is
stopped (pending SSD writes finish) and started again on the same directory
and each prefix is sent a third time (SSD restores). Medians of the three.
Each process is first warmed up with another prefix of the same length, sent
twice (a miss, then a hit), so kernel compilation is not in any timed request.
Each timed request starts once the SSD writer has nothing pending, so every TTFT
is that request's alone (as after an agent's tool call; the fleet workload is
where writes and requests overlap).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from appliance.bench.client import TIMEOUT, Endpoint, chat_body, stream_request
from appliance.bench.prompts import eos_bias, fleet_prompts
from appliance.bench.stats import RequestResult
from appliance.bench.targets import appliance_process
from appliance.plan import ExecutionPlan

N_PREFIXES = 3
_WARM = 2  # warm-up requests per process: a miss, then a hit
_OURS = ("cache", "cache.ssd.path", "server.max_context")  # set here; cache.*.bytes pass through


def _ttfts(url: str, ep: Endpoint, prompts: list[tuple[str, str]],
           advance: Callable[[], None]) -> list[RequestResult]:
    async def go() -> list[RequestResult]:
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as http:
            out = []
            for system, user in prompts:  # one at a time: TTFT alone, not under load
                await _writes_done(http)
                body = chat_body(ep, system, user, 2)
                out.append(await stream_request(http, "/v1/chat/completions", body,
                                                RequestResult(0, 0, 0.0)))
                advance()
            return out

    results = asyncio.run(go())
    if bad := [r.error for r in results if r.error]:
        raise RuntimeError(f"prefix bench request failed: {bad[0]}")
    return results


async def _writes_done(http: httpx.AsyncClient, timeout_s: float = 600.0) -> None:
    """Wait until the SSD writer has nothing pending (the last request's entries are queued
    right after its final step, hence the short pause first)."""
    await asyncio.sleep(0.2)
    deadline = time.monotonic() + timeout_s
    while (await http.get("/stats")).json()["cache"]["ssd"]["write_backlog"]:
        if time.monotonic() > deadline:
            raise RuntimeError("the SSD writer did not drain its queue")
        await asyncio.sleep(0.05)


def _summary(results: list[RequestResult]) -> dict:
    ms = [1000 * (r.first_token - r.start) for r in results]
    return {"ttft_ms_median": round(statistics.median(ms), 1), "ttft_ms": [round(x, 1) for x in ms],
            "cached_tokens": [r.cached_tokens for r in results],
            "prompt_tokens": [r.prompt_tokens for r in results]}


def run_prefix(plan: ExecutionPlan, cfg, tokenizer, overrides: list[str], outdir: Path) -> dict:
    from appliance.bench.progress import bar

    keep = [o for o in overrides
            if o.lstrip("+~").split("=", 1)[0] not in _OURS]
    requests = (2 * _WARM + 3 * N_PREFIXES) * len(cfg.prefix_tokens)  # warm-ups twice a size
    with bar("prefix: cold, RAM hit, SSD restore", requests, cfg.progress) as advance:
        rows = [_one_size(plan, cfg, tokenizer, keep, outdir, size, advance)
                for size in cfg.prefix_tokens]
    return {"rows": rows}


def _one_size(plan: ExecutionPlan, cfg, tokenizer, keep: list[str], outdir: Path, size: int,
              advance: Callable[[], None]) -> dict:
    text = fleet_prompts(tokenizer, size, cfg.user_tokens, 3 * N_PREFIXES + _WARM)
    systems = [f"Agent {i}.\n{text.system}" for i in range(N_PREFIXES)]
    warm = [(f"Warm-up.\n{text.system}", u) for u in text.users[:_WARM]]
    users = text.users[_WARM:]
    ep = Endpoint("", plan.model.id, eos_bias(tokenizer), poll_stats=False)
    ssd = outdir / f"ssd-{size}"
    ov = ["cache=tiered", f"cache.ssd.path={ssd}",
          f"server.max_context={size + 4 * cfg.user_tokens + 64}", *keep]
    try:
        with appliance_process(plan, ov, outdir / f"appliance-{size}.log") as url:
            _ttfts(url, ep, warm, advance)
            cold = _ttfts(url, ep, [(s, users[i]) for i, s in enumerate(systems)], advance)
            ram = _ttfts(url, ep, [(s, users[N_PREFIXES + i]) for i, s in enumerate(systems)],
                         advance)
        with appliance_process(plan, ov, outdir / f"appliance-{size}-restart.log") as url:
            _ttfts(url, ep, warm, advance)
            restored = _ttfts(url, ep, [(s, users[2 * N_PREFIXES + i])
                                        for i, s in enumerate(systems)], advance)
    finally:  # a bench leaves no gigabytes behind unless asked (bench.keep_ssd)
        if not cfg.keep_ssd:
            shutil.rmtree(ssd, ignore_errors=True)
    row = {"prefix_tokens": size, "cold": _summary(cold), "ram_hit": _summary(ram),
           "ssd_restore": _summary(restored)}
    base = row["cold"]["ttft_ms_median"]
    for k in ("ram_hit", "ssd_restore"):
        row[k]["ratio_to_cold"] = round(row[k]["ttft_ms_median"] / base, 3)
    return row


def prefix_text(doc: dict) -> str:
    lines = ["prefix tok  cold ms  RAM hit ms (x cold)  SSD restore ms (x cold)  cached (RAM/SSD)"]
    for r in doc["result"]["rows"]:
        c, h, s = r["cold"], r["ram_hit"], r["ssd_restore"]
        lines.append(f"{r['prefix_tokens']:>10}  {c['ttft_ms_median']:>7}  "
                     f"{h['ttft_ms_median']:>9} ({h['ratio_to_cold']:.3f})  "
                     f"{s['ttft_ms_median']:>13} ({s['ratio_to_cold']:.3f})  "
                     f"{h['cached_tokens'][0]}/{s['cached_tokens'][0]}")
    return "\n".join(lines)
