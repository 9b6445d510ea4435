"""The label every number carries, the printed tables, and bench.json.

"A number without its label is not a number": machine, backend, model shape,
date, versions, plan fingerprint, batch settings and the bench settings
themselves travel with every result.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from appliance import _mlx_env
from appliance.plan import ExecutionPlan


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def bench_settings(cfg) -> dict:
    """BenchConfig (a dataclass from the CLI) or a plain mapping, as a dict."""
    if dataclasses.is_dataclass(cfg):
        return dataclasses.asdict(cfg)
    return dict(cfg)


def label(plan: ExecutionPlan, cfg) -> dict:
    m, mach, b = plan.model, plan.machine, plan.batch
    now = datetime.datetime.now().astimezone()
    return {
        "date": now.isoformat(timespec="seconds"),
        "machine": {"name": mach.name, "chip": mach.chip, "backend": mach.backend,
                    "memory_bytes": mach.memory_bytes, "blas": mach.blas,
                    "cpus": os.cpu_count(), "platform": platform.platform()},
        "model": {"id": m.id, "architecture": m.architecture, "dtype": m.dtype,
                  "checkpoint_dtype": m.checkpoint_dtype, "parameters": m.parameters,
                  "quantization": m.quantization, "layers": len(m.layer_kinds),
                  "hidden_size": m.hidden_size, "vocab_size": m.vocab_size},
        "versions": {"mlx": _version("mlx"), "mlx-lm": _version("mlx-lm"),
                     "appliance": _version("appliance"), "python": platform.python_version()},
        # MLX's and its BLAS's settings from the environment (appliance/_mlx_env.py sets
        # some MLX ones, which a peer server started by the bench runs without; _blas.py
        # sets OpenBLAS's, which it shares)
        "mlx_env": {**{k: v for k, v in sorted(os.environ.items())
                       if k.startswith(("MLX_", "OPENBLAS_", "GOTO_"))},
                    "jit_front": _mlx_env.FLAGS if _mlx_env.JIT else None},
        "fingerprint": plan.fingerprint,
        "batch": {"mode": b.mode, "max_rows": b.max_rows, "prefill_chunk": b.prefill_chunk},
        "kv": plan.kv.scheme, "draft": plan.draft.kind, "cache": plan.cache.kind,
        "profiles": list(plan.profiles),
        "bench": bench_settings(cfg),
    }


def write(outdir: Path, doc: dict) -> Path:
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "bench.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def _fmt(x, nd: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:  # first column left-aligned, numbers right-aligned
        return "  ".join(c.rjust(w) if i else c.ljust(w)
                         for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _batch(doc: dict) -> dict:
    """The batch settings that served the run: a remote appliance's own, else the plan's."""
    return (doc["target"].get("remote_plan") or {}).get("batch") or doc["label"]["batch"]


def _heading(doc: dict) -> str:
    lb = doc["label"]
    m, mach, b = lb["model"], lb["machine"], _batch(doc)
    return (f"# bench {doc['workload']} -> {doc['target']['kind']} | {m['id']} "
            f"({m['architecture']}, {m['parameters']:,} params, {m['dtype']}) | "
            f"{mach['chip']} {mach['backend']} | batch {b['mode']} rows={b['max_rows']} "
            f"chunk={b['prefill_chunk']} | {lb['fingerprint']} | mlx {lb['versions']['mlx']} "
            f"mlx-lm {lb['versions']['mlx-lm']} | {lb['date']}")


def fleet_text(doc: dict) -> str:
    s, c = doc["summary"], doc["label"]["bench"]
    settings = (f"clients={c['clients']}x{c['requests_per_client']} system={c['system_tokens']} "
                f"user={c['user_tokens']} max_tokens={c['max_tokens']} "
                f"stagger={c['stagger_s']}s jitter={c['jitter_s']}s warmup={c['warmup']}")
    header = ["target", "requests", "errors", "TTFT p50 ms", "TTFT p95 ms", "agg tok/s",
              "req decode tok/s", "admitted rows", "prompt tok (cached)", "wall s"]
    row = [doc["target"]["kind"], _fmt(s["requests"]), _fmt(s["errors"]),
           _fmt(s["ttft_ms_p50"]), _fmt(s["ttft_ms_p95"]), _fmt(s["aggregate_tok_s"]),
           _fmt(s["request_decode_tok_s_median"]), _fmt(s["admitted_rows"]),
           f"{_fmt(s['prompt_tokens_mean'], 0)} ({_fmt(s['cached_tokens_mean'], 0)})",
           _fmt(s["wall_s"], 2)]
    return "\n".join([_heading(doc), f"# {settings}", _table(header, [row])])


def fleet_line(doc: dict, path: Path) -> str:
    """One grep-able line per run: compares sweep cells at a glance."""
    s, b = doc["summary"], _batch(doc)
    return (f"BENCH fleet target={doc['target']['kind']} batch={b['mode']} "
            f"rows={b['max_rows']} chunk={b['prefill_chunk']} "
            f"dtype={doc['label']['model']['dtype']} | ttft_p50={_fmt(s['ttft_ms_p50'])}ms "
            f"ttft_p95={_fmt(s['ttft_ms_p95'])}ms "
            f"agg={_fmt(s['aggregate_tok_s'])}tok/s "
            f"req_decode={_fmt(s['request_decode_tok_s_median'])}tok/s "
            f"admitted={_fmt(s['admitted_rows'])} errors={s['errors']}/{s['requests']} | {path}")


def decode_text(doc: dict) -> str:
    r = doc["result"]
    header = ["contender", "tok/s (median)", "runs", "ratio to mlx-lm"]
    rows = [[c["name"], _fmt(c["tok_s_median"]), " ".join(_fmt(x) for x in c["runs"]),
             f"{c['ratio_to_mlx_lm']:.3f}"] for c in r["contenders"]]
    settings = (f"# B=1, prompt {r['prompt_tokens']} tokens, {r['decode_tokens']} tokens x "
                f"{r['repeats']} runs (+1 warm-up), EOS banned; tok/s = n/(t_end-t_start)")
    return "\n".join([_heading(doc), settings, _table(header, rows)])


def decode_line(doc: dict, path: Path) -> str:
    b = doc["label"]["batch"]
    parts = " ".join(f"{c['name'].replace(' ', '_')}={_fmt(c['tok_s_median'])}tok/s"
                     f"(x{c['ratio_to_mlx_lm']:.2f})" for c in doc["result"]["contenders"])
    return (f"BENCH decode target={doc['target']['kind']} batch={b['mode']} "
            f"dtype={doc['label']['model']['dtype']} | {parts} | {path}")


def _mib(x) -> str:
    return "-" if x is None else f"{x / 2**20:.1f}"


def kv_text(doc: dict) -> str:
    r = doc["result"]
    cap_contexts = sorted({c["context"] for c in r["capacity"]})
    bpt = {s["name"]: s["bytes_per_token"] for s in r["schemes"]}
    header = ["scheme", "bytes/token"]
    for c in cap_contexts:
        header += [f"rows @{c}", "x native"]
    rows = []
    for s in r["schemes"]:
        row = [s["name"], str(bpt[s["name"]])]
        for c in cap_contexts:
            cell = next(x for x in r["capacity"] if x["scheme"] == s["name"] and x["context"] == c)
            row += [str(cell["rows"]), _fmt(cell["ratio_to_native"], 3)]
        rows.append(row)
    cap = _table(header, rows)
    header = ["scheme", "B", "context", "tok/s (median)", "runs", "x native", "KV plan MiB",
              "KV held MiB", "active MiB", "cache MiB", "peak MiB", "prefill s"]
    dec = _table(header, [[x["scheme"], str(x["batch"]), str(x["context"]),
                           _fmt(x["tok_s_median"]), " ".join(_fmt(v) for v in x["runs"]),
                           _fmt(x["ratio_to_native"], 3),
                           _mib(x["memory"]["kv_bytes_predicted"]),
                           _mib(x["memory"]["kv_bytes_held"]),
                           _mib(x["memory"]["active_bytes"]), _mib(x["memory"]["cache_bytes"]),
                           _mib(x["memory"]["peak_bytes"]), _fmt(x["prefill_s"], 2)]
                          for x in r["decode"]])
    header = ["scheme", "path", "context", "tok/s (median)", "runs", "x native"]
    sh = _table(header, [[x["scheme"], x["path"], str(x["context"]), _fmt(x["tok_s_median"]),
                          " ".join(_fmt(v) for v in x["runs"]), _fmt(x["ratio_to_native"], 3)]
                         for x in r["short"]])
    return "\n".join([
        _heading(doc),
        f"# kv={r['scheme']} against kv={r['anchor']}, same run | capacity at a fixed budget "
        f"of {r['kv_budget_bytes']:,} bytes (Budget.try_admit, rows of c tokens)", cap,
        f"# decode: B rows, {r['decode_tokens']} ticks x {r['repeats']} spans after prefill and "
        f"{r['warmup_ticks']} warm-up ticks; tok/s = B*ticks/s; memory after prefill", dec,
        "# short rows: B=1 (solo: runner.Decoder, a lone request's path; batched: BatchStep)",
        sh])


def kv_line(doc: dict, path: Path) -> str:
    from appliance.bench.report import _fmt

    r, name = doc["result"], doc["result"]["scheme"]
    mine = [x for x in r["capacity"] if x["scheme"] == name]
    cap = " ".join(f"rows@{x['context']}={x['rows']}(x{_fmt(x['ratio_to_native'], 2)})"
                   for x in mine)  # no ratio where native fits no row
    dec = " ".join(f"B{x['batch']}={_fmt(x['tok_s_median'])}tok/s(x{x['ratio_to_native']:.2f})"
                   for x in r["decode"] if x["scheme"] == name)
    sh = " ".join(f"short_{x['path']}={_fmt(x['tok_s_median'])}tok/s"
                  f"(x{x['ratio_to_native']:.2f})" for x in r["short"] if x["scheme"] == name)
    return (f"BENCH kv scheme={name} anchor={r['anchor']} "
            f"dtype={doc['label']['model']['dtype']} context={doc['label']['bench']['kv_context']}"
            f" | {cap} | {dec} | {sh} | {path}")
