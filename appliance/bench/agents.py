"""bench=agents: N coding agents, each a growing conversation, against this plan and mlx_lm.server.

Every agent shares one long system prompt. Turn 0 sends its task; each later turn, after a
seeded think time, appends the assistant's streamed reply and a tool output (held-out
stdlib source, as a file read or a test run returns) and sends the whole conversation
again. So later turns are mostly a prefix the server has seen: the case a prefix cache is
for. Tool outputs go as user messages, so no chat template needs a tool role. The target
and the anchor (mlx_lm.server by default) run the same conversations one after the other in
the same run; the ratios are target / anchor, and there are none where either side failed a
request (`unequal`).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from appliance.bench.client import (
    TIMEOUT,
    Endpoint,
    arrival_offsets,
    engine_seconds,
    messages_body,
    poll_active_rows,
    stream_request,
)
from appliance.bench.stats import RequestResult
from appliance.plan import ExecutionPlan

ANCHORS = ("mlx_lm", "none")


@dataclass(frozen=True)
class Conversations:
    """The text every contender gets (the replies are each server's own)."""

    system: str  # shared by every agent
    warm_system: str  # as long, sharing nothing with `system`: warm-up primes no prefix
    tasks: list[str]  # warm-up tasks first, then one per agent
    tools: list[list[str]]  # [agent][turn - 1]: the tool output appended before turn t
    think_s: list[list[float]]  # [agent][turn - 1]: the pause before turn t


def conversations(tokenizer, cfg) -> Conversations:
    """Deterministic in cfg.seed: corpus slices for prompts, held-out source for tools."""
    from appliance.bench.prompts import corpus_tokens, heldout_tokens

    n_tasks = cfg.warmup + cfg.agents
    ids = corpus_tokens(tokenizer, 2 * cfg.system_tokens + n_tasks * cfg.user_tokens)
    s = cfg.system_tokens
    tasks = [f"Task {k}: find and fix the bug in this code.\n"
             + tokenizer.decode(ids[2 * s + k * cfg.user_tokens:2 * s + (k + 1) * cfg.user_tokens])
             for k in range(n_tasks)]
    later = cfg.turns - 1
    tool_ids = heldout_tokens(tokenizer, cfg.agents * later * cfg.tool_tokens)
    n = cfg.tool_tokens
    tools = [[f"[tool output, step {t + 1}]\n"
              + tokenizer.decode(tool_ids[(a * later + t) * n:(a * later + t + 1) * n])
              for t in range(later)] for a in range(cfg.agents)]
    # one generator per agent: its pauses do not depend on how fast the others went
    rngs = [random.Random(f"{cfg.seed}:{a}") for a in range(cfg.agents)]
    think = [[rngs[a].uniform(0.0, 2.0 * cfg.think_s) for _ in range(later)]
             for a in range(cfg.agents)]
    return Conversations("You are a coding agent in a team of agents. Project notes follow.\n"
                         + tokenizer.decode(ids[:s]), tokenizer.decode(ids[s:2 * s]),
                         tasks, tools, think)


async def _agents(ep: Endpoint, conv: Conversations, cfg, advance):
    limits = httpx.Limits(max_connections=cfg.agents + 4)
    path = "/v1/chat/completions"
    async with httpx.AsyncClient(base_url=ep.url, timeout=TIMEOUT, limits=limits) as http:
        for k in range(cfg.warmup):  # untimed, one after another (JIT, first allocations)
            msgs = [{"role": "system", "content": conv.warm_system},
                    {"role": "user", "content": conv.tasks[k]}]
            w = await stream_request(http, path, messages_body(ep, msgs, cfg.max_tokens),
                                     RequestResult(-1, k, 0.0))
            if w.error:
                raise RuntimeError(f"warm-up request failed: {w.error}")
        if cfg.warmup:
            await _burst(http, path, ep, conv, cfg)
        offsets = arrival_offsets(cfg.agents, cfg.stagger_s, cfg.jitter_s, cfg.seed)
        stop = asyncio.Event()
        poller = asyncio.ensure_future(poll_active_rows(http, stop) if ep.poll_stats
                                       else asyncio.sleep(0, result="n/a"))
        abandoned = 0

        async def agent(a: int, t_start: float) -> list[RequestResult]:
            nonlocal abandoned
            await asyncio.sleep(max(0.0, t_start - time.perf_counter()))
            msgs = [{"role": "system", "content": conv.system},
                    {"role": "user", "content": conv.tasks[cfg.warmup + a]}]
            out: list[RequestResult] = []
            for t in range(cfg.turns):
                if t:
                    await asyncio.sleep(conv.think_s[a][t - 1])
                    msgs += [{"role": "assistant", "content": out[-1].text},
                             {"role": "user", "content": conv.tools[a][t - 1]}]
                r = await stream_request(http, path, messages_body(ep, msgs, cfg.max_tokens),
                                         RequestResult(a, t, 0.0))
                out.append(r)
                advance()
                if not r.ok:  # its reply is unknown: the conversation cannot go on
                    abandoned += cfg.turns - t - 1
                    for _ in range(cfg.turns - t - 1):
                        advance()
                    break
            return out

        t0 = time.perf_counter()
        per_agent = await asyncio.gather(*(agent(a, t0 + off) for a, off in enumerate(offsets)))
        stop.set()
        admitted = await poller
        engine = await engine_seconds(http) if ep.poll_stats else None
    return [r for rs in per_agent for r in rs], admitted, t0, abandoned, engine


def burst_tokens(agents: int) -> int:
    """Decode steps of a warm-up burst request: its row keeps decoding while the other
    agents' requests prefill (a chunk, ~a step, each) and join, so the batch reaches its
    full size; 8 tokens did not (rows left before the last joined), and the first timed
    batch of 8+ rows then paid the compile."""
    return 8 + 2 * agents


def burst_messages(conv: Conversations, i: int) -> list[dict]:
    """Agent i's warm-up request: a first turn's length, sharing no prefix with the others'."""
    return [{"role": "system", "content": f"Warm-up agent {i}.\n" + conv.warm_system},
            {"role": "user", "content": conv.tasks[0]}]


async def _burst(http: httpx.AsyncClient, path: str, ep: Endpoint, conv: Conversations,
                 cfg) -> None:
    """Untimed: one request per agent, all at once, each as long as a first turn, so that
    what the run will meet (a full batch prefilling long prompts, then decoding) is
    compiled before it. On a fresh H200 the first such batch of a 4-bit 8B model stalled
    36-45 s once (a one-off compile a second process did not pay; a burst of short prompts
    did not cover it); without this the contender measured first paid it and the other did
    not. Each system prompt opens with its own line, so no agent's burst request primes
    another's prefix, nor the timed run's (`warm_system` shares nothing with `system`)."""
    async def one(i: int) -> RequestResult:
        return await stream_request(http, path,
                                    messages_body(ep, burst_messages(conv, i),
                                                  burst_tokens(cfg.agents)),
                                    RequestResult(-1, i, 0.0))

    for w in await asyncio.gather(*(one(i) for i in range(cfg.agents))):
        if w.error:
            raise RuntimeError(f"warm-up request failed: {w.error}")


def run_agents(ep: Endpoint, conv: Conversations, cfg, advance=lambda: None):
    """Warm up, then every agent's conversation; (results, admitted rows, t0, abandoned,
    the engine's own prefill/decode seconds where the target reports them)."""
    return asyncio.run(_agents(ep, conv, cfg, advance))


def _contender(kind: str, plan: ExecutionPlan, cfg, path: Path, conv: Conversations,
               bias: dict, outdir: Path, overrides: list[str]) -> dict:
    from appliance.bench import targets
    from appliance.bench.progress import bar
    from appliance.bench.stats import request_record, summarize_agents

    with targets.started(kind, plan, cfg, path, outdir, overrides, bias) as (info, ep):
        with bar(f"agents -> {kind}", cfg.agents * cfg.turns, cfg.progress) as advance:
            results, admitted, t0, abandoned, engine = run_agents(ep, conv, cfg, advance)
    return {"target": info, "summary": summarize_agents(results, admitted, abandoned),
            "engine": engine, "requests": [request_record(r, t0) for r in results]}


RATIO_KEYS = ("aggregate_tok_s", "ttft_ms_p50", "ttft_ms_p95", "ttft_ms_first_p95",
              "ttft_ms_later_p95")


def ratios(mine: dict, anchor: dict) -> dict:
    """target / anchor for each headline number (None where either is missing or zero)."""
    return {k: round(mine[k] / anchor[k], 3) if mine.get(k) and anchor.get(k) else None
            for k in RATIO_KEYS}


def unequal(parts: list[tuple[str, dict]]) -> str | None:
    """Why the contenders' numbers do not compare, or None: a side that failed requests did
    less work (on the H100 mlx_lm.server's generation thread died at an agent's last turn and
    answered the rest at once: 1.75x over 16 failures of 80 read as a figure)."""
    failed = [f"{name} failed {s['errors']} of {s['requests']} requests"
              + (f" ({s['abandoned']} later turns not sent)" if s.get("abandoned") else "")
              for name, s in parts if s["errors"] or s.get("abandoned")]
    return "; ".join(failed) or None


def context_problems(plan: ExecutionPlan, cfg) -> list[str]:
    """The workload's longest request (an agent's last turn, its replies max_tokens long:
    EOS is banned) must fit the plan's context, else its last turns fail with 400s and a
    tune trial measures nothing."""
    from appliance.bench.prompts import load_tokenizer, model_dir

    tok = load_tokenizer(model_dir(plan))
    conv = conversations(tok, cfg)
    reply = tok.decode(tok.encode(conv.system, add_special_tokens=False)[:cfg.max_tokens])
    longest = 0
    for a in range(cfg.agents):
        msgs = [{"role": "system", "content": conv.system},
                {"role": "user", "content": conv.tasks[cfg.warmup + a]}]
        for t in range(cfg.turns - 1):
            msgs += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": conv.tools[a][t]}]
        longest = max(longest, len(tok.apply_chat_template(msgs, add_generation_prompt=True)))
    limit = plan.server.max_context
    if longest + cfg.max_tokens <= limit:
        return []
    return [f"bench=agents: an agent's last turn is ~{longest} prompt tokens + bench.max_tokens="
            f"{cfg.max_tokens}, past server.max_context={limit}; lower bench.turns, "
            "bench.tool_tokens or bench.system_tokens, or raise server.max_context"]


class AnchorFailed(RuntimeError):
    """The anchor failed after the target was measured; `partial` holds the target's part."""

    def __init__(self, partial: dict):
        super().__init__(partial["void"])
        self.partial = partial


def run_bench(plan: ExecutionPlan, cfg, kind: str, path: Path, tokenizer, outdir: Path,
              overrides: list[str]) -> dict:
    """The target, then the anchor (unless none or the target itself), on one workload."""
    from appliance.bench.prompts import eos_bias

    conv = conversations(tokenizer, cfg)
    bias = eos_bias(tokenizer)
    out = _contender(kind, plan, cfg, path, conv, bias, outdir, overrides)
    out["anchor"], out["ratios"], out["void"] = None, None, None
    if cfg.anchor != "none" and cfg.anchor != kind:
        try:
            out["anchor"] = _contender(cfg.anchor, plan, cfg, path, conv, bias, outdir,
                                       overrides)
        except Exception as e:  # (not Ctrl-C) the target's figures are still worth keeping
            out["void"] = f"the anchor ({cfg.anchor}) failed: {type(e).__name__}: {e}"
            raise AnchorFailed(out) from e
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: kept too, and the bench stops
            out["void"] = f"interrupted while the anchor ({cfg.anchor}) ran"
            e.partial = out
            raise
        out["void"] = unequal([(kind, out["summary"]), (cfg.anchor, out["anchor"]["summary"])])
        if not out["void"]:
            out["ratios"] = ratios(out["summary"], out["anchor"]["summary"])
    return out


def _ms_pair(s: dict, which: str) -> str:
    from appliance.bench.report import _fmt

    return f"{_fmt(s[f'ttft_ms_{which}_p50'], 0)} / {_fmt(s[f'ttft_ms_{which}_p95'], 0)}"


def agents_text(doc: dict) -> str:
    from appliance.bench.report import _fmt, _heading, _table

    c = doc["label"]["bench"]
    settings = (f"agents={c['agents']} turns={c['turns']} system={c['system_tokens']} "
                f"task={c['user_tokens']} tool={c['tool_tokens']} max_tokens={c['max_tokens']} "
                f"think~U(0,{2 * c['think_s']:g})s stagger={c['stagger_s']}s "
                f"warmup={c['warmup']} seed={c['seed']}")
    header = ["contender", "requests", "errors", "agg tok/s", "TTFT p50 ms", "TTFT p95 ms",
              "first turn p50/p95 ms", "later turns p50/p95 ms", "cache hit", "admitted rows",
              "wall s"]
    rows = []
    for part in filter(None, [doc, doc.get("anchor")]):
        s = part["summary"]
        rows.append([part["target"]["kind"], _fmt(s["requests"]), _fmt(s["errors"]),
                     _fmt(s["aggregate_tok_s"]), _fmt(s["ttft_ms_p50"], 0),
                     _fmt(s["ttft_ms_p95"], 0), _ms_pair(s, "first"), _ms_pair(s, "later"),
                     _fmt(s["cache_hit_ratio"], 3), _fmt(s["admitted_rows"]),
                     _fmt(s["wall_s"], 2)])
    if r := doc.get("ratios"):
        def x(k: str) -> str:
            return "-" if r[k] is None else f"{r[k]:.2f}x"

        rows.append([f"{doc['target']['kind']} / {doc['anchor']['target']['kind']}", "", "",
                     x("aggregate_tok_s"), x("ttft_ms_p50"), x("ttft_ms_p95"),
                     f"p95 {x('ttft_ms_first_p95')}", f"p95 {x('ttft_ms_later_p95')}", "", "",
                     ""])
    errors = [e for part in filter(None, [doc, doc.get("anchor")])
              for e in part["summary"]["error_samples"]]
    lines = [_heading(doc), f"# {settings}", _table(header, rows)]
    if doc.get("void"):
        lines.append(f"# no ratios: {doc['void']}" + ("; the contenders did unequal work"
                                                        if doc.get("anchor") else ""))
    if m := (doc.get("engine") or {}).get("memory"):
        gib = {k: f"{m[k] / 2**30:.1f}" for k in ("active_bytes", "cache_bytes", "peak_bytes",
                                                   "limit_bytes") if m.get(k) is not None}
        lines.append(f"# memory GiB (MLX, after the run): active {gib.get('active_bytes')} "
                     f"cache {gib.get('cache_bytes')} peak {gib.get('peak_bytes')} limit "
                     f"{gib.get('limit_bytes')}; failed allocations "
                     f"{m.get('allocation_failures')}")
    return "\n".join(lines + [f"# error: {e}" for e in errors])


def agents_line(doc: dict, path: Path) -> str:
    from appliance.bench.report import _batch, _fmt

    s, b = doc["summary"], _batch(doc)
    line = (f"BENCH agents target={doc['target']['kind']} batch={b['mode']} "
            f"rows={b['max_rows']} chunk={b['prefill_chunk']} cache={doc['label']['cache']} "
            f"dtype={doc['label']['model']['dtype']} | agg={_fmt(s['aggregate_tok_s'])}tok/s "
            f"ttft_p50={_fmt(s['ttft_ms_p50'])}ms ttft_p95={_fmt(s['ttft_ms_p95'])}ms "
            f"first_p95={_fmt(s['ttft_ms_first_p95'])}ms "
            f"later_p95={_fmt(s['ttft_ms_later_p95'])}ms hit={_fmt(s['cache_hit_ratio'], 3)} "
            f"errors={s['errors']}/{s['requests']}")
    if r := doc.get("ratios"):
        line += (f" | vs {doc['anchor']['target']['kind']}: agg x{_fmt(r['aggregate_tok_s'], 2)}"
                 f" ttft_p95 x{_fmt(r['ttft_ms_p95'], 2)}")
    elif doc.get("void"):
        line += f" | vs {doc['anchor']['target']['kind']}: void ({doc['void']})"
    return f"{line} | {path}"
