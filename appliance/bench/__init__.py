"""mode=bench: measure the plan's engine on a labelled workload, against mlx-lm's own.

    appliance mode=bench                              fleet against this plan (in-process server)
    appliance mode=bench bench.target=mlx_lm          the same fleet against mlx_lm.server
    appliance mode=bench bench.target=http://host:port   ... against a running server
    appliance mode=bench bench=decode [bench.target=mlx_lm]   B=1 decode speed
    appliance mode=bench bench=kv kv=k8v4              a KV scheme against kv=native
    appliance mode=bench bench=spec draft=lookup       speculative decoding against draft=none
    appliance mode=bench bench=agents                 multi-turn agents: this plan, then
                                                      mlx_lm.server, in one run (ratios)
    appliance -m mode=bench batch.max_rows=1,4,8      one bench.json per sweep cell, and one
                                                      comparison (sweep.md/csv/png, sweep.py)

`run()` prints a table and one `BENCH ...` line, and writes `<outdir>/bench.json`
(results + label). Modules: prompts (corpus text sized in model tokens), client
(streamed requests, the fleet), targets (servers), agents, decode, prefix, kv, spec, stats,
report, progress (bars on stderr), sweep (the multirun report), tune (mode=tune).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from appliance.plan import ExecutionPlan, PlanError

WORKLOADS = ("fleet", "decode", "prefix", "kv", "spec", "agents")


def _target_kind(target: str) -> str:
    if target in ("self", "mlx_lm"):
        return target
    return "url" if target.startswith(("http://", "https://")) else ""


# (field, smallest valid value): below it a run measures nothing or cannot be timed.
_MINIMUMS = (("clients", 1), ("requests_per_client", 1), ("system_tokens", 0),
             ("user_tokens", 1), ("max_tokens", 1), ("warmup", 0), ("stagger_s", 0),
             ("jitter_s", 0), ("decode_tokens", 2), ("repeats", 1), ("kv_context", 1),
             ("kv_short_context", 1), ("agents", 1), ("turns", 1), ("tool_tokens", 1),
             ("think_s", 0))
_LIST_MINIMUMS = (("kv_batches", 1), ("kv_capacity_contexts", 1), ("spec_batches", 1))


# The bench fields each workload reads (besides the target's: workload, target,
# mlx_lm_args, progress, keep_ssd). A field set on the command line that the chosen
# workload does not read is refused: never accepted and ignored.
_TARGET = ("workload", "target", "mlx_lm_args", "progress", "keep_ssd")
READS = {
    "fleet": ("clients", "requests_per_client", "system_tokens", "user_tokens", "max_tokens",
              "stagger_s", "jitter_s", "seed", "warmup"),
    "decode": ("decode_tokens", "repeats"),
    "prefix": ("prefix_tokens", "user_tokens"),
    "kv": ("kv_budget", "kv_capacity_contexts", "kv_batches", "kv_context", "kv_short_context",
           "decode_tokens", "repeats", "seed"),
    "spec": ("spec_workloads", "spec_batches", "spec_context", "spec_verify_cost",
             "spec_control", "decode_tokens", "repeats"),
    "agents": ("agents", "turns", "system_tokens", "user_tokens", "tool_tokens", "max_tokens",
               "think_s", "stagger_s", "jitter_s", "seed", "warmup", "anchor"),
}


def unread(workload: str, overrides) -> list[str]:
    """The command line's `bench.<field>=...` settings that `workload` does not read."""
    reads = set(_TARGET) | set(READS.get(workload, ()))
    out = []
    for o in overrides:
        key = str(o).lstrip("+~").split("=", 1)[0]
        if key.startswith("bench.") and key.split(".")[1] not in reads:
            out.append(str(o))
    return out


# Plan settings a bench does not pass on (`key` exact, `key.*` its fields), by why: set on the
# command line, each is refused with the reason, never dropped.
_SERVED = ("server.host", "server.port", "server.log_level", "server.api_key",
           "server.allow_unauthenticated", "server.default_max_tokens",
           "server.default_temperature", "server.default_top_p")
_ENGINE_ONLY = ("batch", "batch.max_rows", "batch.prefill_rows", "batch.max_queue", "cache",
                "cache.*", "server.*")
_MLX_LM = ("kv", "kv.*", "draft", "draft.*", "cache", "cache.*", "batch", "batch.kv_budget",
           "batch.prefill_rows", "batch.max_queue", "batch.attention_threads",
           "batch.compile_step", "server.*")
_ALL_BUT_MODEL = ("kv", "kv.*", "draft", "draft.*", "cache", "cache.*", "batch", "batch.*",
                  "server.*")


def _not_passed_on(workload: str, kind: str) -> list[tuple[tuple[str, ...], str]]:
    rules = [(_SERVED, "a bench serves on a free loopback port of its own, with no key, and "
                       "its requests set their own generation settings")]
    if workload == "kv":
        rules.append(((*_ENGINE_ONLY, "draft", "draft.*"), "bench=kv runs the engine "
                      "in-process: rows from bench.kv_batches, no prefix cache, drafter or "
                      "server"))
    if workload == "spec":
        rules.append((_ENGINE_ONLY, "bench=spec runs the engine in-process: rows from "
                                    "bench.spec_batches, no prefix cache or server"))
    if workload == "prefix":
        rules.append((("cache", "cache.ssd.path", "server.max_context"), "bench=prefix sets "
                      "them itself, a tiered cache in a fresh directory and a context per length"))
    if kind == "mlx_lm" and workload == "decode":
        rules.append((_ALL_BUT_MODEL, "bench=decode with mlx_lm runs mlx-lm's own generation "
                                      "in-process: the model alone"))
    elif kind == "mlx_lm":
        extra = ("batch.prefill_chunk",) if workload == "agents" else ()
        passed = "batch.max_rows" + ("" if extra else " and batch.prefill_chunk")
        rules.append(((*_MLX_LM, *extra), f"mlx_lm.server gets the model and {passed} only"))
    if kind == "url":
        rules.append((_ALL_BUT_MODEL, "a server at a URL runs its own configuration"))
    return rules


def unpassed(cfg, overrides) -> list[str]:
    """A problem for each plan setting on the command line that this bench does not pass on
    to what it measures (each named once, with the first reason that holds)."""
    problems, named = [], set()
    for keys, why in _not_passed_on(cfg.workload, _target_kind(str(cfg.target))):
        given = [o for o in map(str, overrides) if o not in named
                 and _matches(o.lstrip("+~").split("=", 1)[0], keys)]
        named.update(given)
        if given:
            problems.append(f"{' '.join(given)}: not used with bench={cfg.workload} "
                            f"bench.target={cfg.target}: {why}; drop "
                            f"{'it' if len(given) == 1 else 'them'}")
    return problems


def _matches(key: str, keys: tuple[str, ...]) -> bool:
    return any(k == key or (k.endswith(".*") and key.startswith(k[:-1])) for k in keys)


def keep_ssd_problems(cfg, plan: ExecutionPlan, overrides) -> list[str]:
    """bench.keep_ssd where this bench makes no SSD directory to keep (bench=prefix makes its
    own; a served plan with an SSD tier one per run)."""
    given = [str(o) for o in overrides if str(o).split("=", 1)[0] == "bench.keep_ssd"]
    makes = cfg.workload == "prefix" or (
        cfg.workload in ("fleet", "agents") and _target_kind(str(cfg.target)) == "self"
        and plan.cache.ssd_bytes > 0)
    return [] if not given or makes else [
        f"{given[0]}: bench={cfg.workload} bench.target={cfg.target} makes no SSD directory to "
        "keep (the plan has no SSD tier served by this bench: cache=ssd or cache=tiered)"]


def check(cfg, overrides=()) -> list[str]:
    """Every problem with these bench settings, one sentence each (empty: runnable);
    `overrides`: the command line, whose bench fields the workload must read."""
    problems = unpassed(cfg, overrides)
    if cfg.workload in READS and (bad := unread(cfg.workload, overrides)):
        problems.append(f"{' '.join(bad)}: bench={cfg.workload} does not read "
                        f"{'it' if len(bad) == 1 else 'them'}; it reads "
                        f"{', '.join(READS[cfg.workload])} (and the target's: "
                        f"{', '.join(_TARGET[1:])})")
    if cfg.workload not in WORKLOADS:
        problems.append(f"bench.workload={cfg.workload!r} is not supported; valid choices: "
                        f"{', '.join(WORKLOADS)}")
    kind = _target_kind(str(cfg.target))
    args = [str(o) for o in overrides if str(o).split("=", 1)[0] == "bench.mlx_lm_args"]
    if args and not ((kind == "mlx_lm" and cfg.workload in ("fleet", "agents"))
                     or (cfg.workload == "agents" and cfg.anchor == "mlx_lm")):
        problems.append(f"{args[0]}: no mlx_lm.server runs in bench={cfg.workload} "
                        f"bench.target={cfg.target}" + (" bench.anchor=none" if
                                                        cfg.workload == "agents" else ""))
    if not kind:
        problems.append(f"bench.target={cfg.target!r} is not supported; valid choices: self, "
                        "mlx_lm, or a server URL (http://host:port)")
    if cfg.workload == "prefix" and kind != "self":
        problems.append("bench=prefix restarts the appliance itself: bench.target must be self")
    if cfg.workload == "decode" and kind == "url":
        problems.append("bench=decode runs in-process: bench.target must be self or mlx_lm")
    if cfg.workload == "kv" and kind != "self":
        problems.append("bench=kv runs the plan's engine in-process: bench.target must be self")
    if cfg.workload == "spec" and kind != "self":
        problems.append("bench=spec runs the plan's engine in-process: bench.target must be "
                        "self")
    bad = [w for w in cfg.spec_workloads if w not in ("edit", "free")]
    if bad or not cfg.spec_workloads:
        problems.append(f"bench.spec_workloads={list(cfg.spec_workloads)}: valid choices are "
                        "edit, free (one or both)")
    for name, least in _MINIMUMS:
        if getattr(cfg, name) < least:
            problems.append(f"bench.{name}={getattr(cfg, name)} must be >= {least}")
    for name, least in _LIST_MINIMUMS:
        values = list(getattr(cfg, name))
        if not values or any(not isinstance(v, int) or v < least for v in values):
            problems.append(f"bench.{name}={values} must be a non-empty list of integers "
                            f">= {least}")
    if cfg.anchor not in ("mlx_lm", "none"):
        problems.append(f"bench.anchor={cfg.anchor!r} is not supported; valid choices: "
                        "mlx_lm, none")
    if str(cfg.kv_budget) != "auto":
        from appliance.plan.sizes import parse_size

        try:
            if parse_size(cfg.kv_budget) <= 0:
                problems.append(f"bench.kv_budget={cfg.kv_budget} must be more than 0 bytes")
        except ValueError as e:
            problems.append(f"bench.kv_budget: {e}, or auto (the plan's batch.kv_budget_bytes)")
    return problems


def run(plan: ExecutionPlan, cfg, outdir: Path, overrides: tuple[str, ...] = ()) -> dict:
    """Run the workload `cfg` (a BenchConfig) describes; print it; write outdir/bench.json.

    `overrides` are the command line's: target=self serves the plan they make in its
    own process (checked by fingerprint).

    Raises PlanError (every problem listed) before starting anything if `check(cfg)` fails.
    """
    # httpx logs every request at INFO: hundreds of lines around the one table that matters.
    httpx_log = logging.getLogger("httpx")
    level = httpx_log.level
    httpx_log.setLevel(logging.WARNING)
    # SIGTERM stops a bench as Ctrl-C does: through the `finally`s that stop its servers
    # (by default it would end this process at once and leave them running)
    on_term = _interrupt_on_sigterm()
    try:
        return _run(plan, cfg, Path(outdir), list(overrides))
    finally:
        httpx_log.setLevel(level)
        on_term()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C is (the same `finally`s run); the process then exits 143."""


def _interrupt_on_sigterm():
    """Make SIGTERM raise Terminated; returns the undo (a no-op off the main thread)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum, frame):
        raise Terminated

    old = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, old)


def _run(plan: ExecutionPlan, cfg, outdir: Path, overrides: list[str]) -> dict:
    from appliance.bench import report
    from appliance.bench.prompts import load_tokenizer, model_dir

    if problems := check(cfg):
        raise PlanError(problems)
    kind = _target_kind(cfg.target)
    path = model_dir(plan)
    # the command line travels with the result: a sweep's report reads the swept knobs there
    doc = {"label": report.label(plan, cfg), "workload": cfg.workload, "overrides": overrides}
    if cfg.workload == "kv":  # random token ids: no tokenizer
        from appliance.bench.kv import run_kv
        from appliance.bench.report import kv_line, kv_text

        doc["target"] = {"kind": kind, "model": str(path)}
        doc["result"] = run_kv(plan, cfg, path, overrides)
        out = report.write(outdir, doc)
        print(kv_text(doc))
        print(kv_line(doc, out), flush=True)
        return doc
    tokenizer = load_tokenizer(path)
    if cfg.workload == "spec":
        from appliance.bench.spec import run_spec, spec_text

        doc["target"] = {"kind": kind, "model": str(path)}
        doc["result"] = run_spec(plan, cfg, path, tokenizer)
        out = report.write(outdir, doc)
        print(spec_text(doc))
        print(f"BENCH spec draft={plan.draft.kind} | {out}", flush=True)
        return doc
    if cfg.workload == "prefix":
        from appliance.bench.prefix import prefix_text, run_prefix

        doc["target"] = {"kind": kind, "model": str(path)}
        doc["result"] = run_prefix(plan, cfg, tokenizer, overrides, outdir)
        out = report.write(outdir, doc)
        print(prefix_text(doc))
        print(f"BENCH prefix | {out}", flush=True)
        return doc
    if cfg.workload == "agents":
        from appliance.bench.agents import AnchorFailed, agents_line, agents_text, run_bench

        try:
            doc.update(run_bench(plan, cfg, kind, path, tokenizer, outdir, overrides))
        except AnchorFailed as e:  # the target's figures are kept; the bench still failed
            doc.update(e.partial)
            out = report.write(outdir, doc)
            print(agents_text(doc), flush=True)
            raise RuntimeError(f"{e}; the target's own figures are in {out}") from e.__cause__
        except KeyboardInterrupt as e:
            if partial := getattr(e, "partial", None):
                doc.update(partial)
                print(f"appliance: the target's own figures are in {report.write(outdir, doc)}",
                      file=sys.stderr)
            raise
        out = report.write(outdir, doc)
        print(agents_text(doc))
        print(agents_line(doc, out), flush=True)
        return doc
    if cfg.workload == "decode":
        from appliance.bench.decode import run_decode

        doc["target"] = {"kind": kind, "model": str(path)}
        doc["result"] = run_decode(plan, cfg, path, tokenizer, kind, overrides, outdir)
        text, line = report.decode_text, report.decode_line
    else:
        doc.update(_fleet(plan, cfg, kind, path, tokenizer, outdir, overrides))
        text, line = report.fleet_text, report.fleet_line
    out = report.write(outdir, doc)
    print(text(doc))
    print(line(doc, out), flush=True)
    return doc


def _fleet(plan: ExecutionPlan, cfg, kind: str, path: Path, tokenizer, outdir: Path,
           overrides: list[str]) -> dict:
    """Start the target, run the fleet against it, stop the target."""
    from appliance.bench import targets
    from appliance.bench.client import FleetSpec, run_fleet
    from appliance.bench.progress import bar
    from appliance.bench.prompts import eos_bias, fleet_prompts
    from appliance.bench.stats import request_record, summarize_fleet

    spec = FleetSpec(cfg.clients, cfg.requests_per_client, cfg.max_tokens, cfg.stagger_s,
                     cfg.jitter_s, cfg.seed, cfg.warmup)
    prompts = fleet_prompts(tokenizer, cfg.system_tokens, cfg.user_tokens,
                            cfg.warmup + cfg.clients * cfg.requests_per_client)
    with targets.started(kind, plan, cfg, path, outdir, overrides, eos_bias(tokenizer)) as (
            info, ep):
        with bar(f"fleet -> {kind}", spec.clients * spec.requests_per_client,
                 cfg.progress) as advance:
            results, admitted, t0 = run_fleet(ep, spec, prompts.system, prompts.users, advance)
    return {"target": info, "summary": summarize_fleet(results, admitted),
            "requests": [request_record(r, t0) for r in results]}


__all__ = ["check", "run"]
