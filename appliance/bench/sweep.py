"""The multirun report: one comparison of every sweep cell, written when the sweep ends.

`appliance -m mode=bench bench=agents batch.max_rows=4,8 kv=native,k8v4` leaves one
bench.json per cell; this Hydra callback (conf/config.yaml, hydra.callbacks) then writes at
the sweep root:
- sweep.md and sweep.csv: one row per cell, the swept knobs (the overrides that differ
  between cells, read from each bench.json) beside its headline numbers (a fleet's tok/s and
  TTFT; bench=spec, decode, kv and prefix: their own, `_result_columns`);
- sweep-<knob>.png for each swept knob: aggregate tok/s and TTFT p95 against it, one line
  per combination of the other knobs (workloads that measure those).
Under mode=tune it also writes the best trial as a profile (appliance/bench/tune.py).
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

log = logging.getLogger("appliance")

# (column, bench.json summary key or a function of the doc): what a row shows, when present
METRICS: tuple[tuple[str, Any], ...] = (
    ("agg tok/s", "aggregate_tok_s"),
    ("TTFT p50 ms", "ttft_ms_p50"),
    ("TTFT p95 ms", "ttft_ms_p95"),
    ("first turn p95 ms", "ttft_ms_first_p95"),
    ("later turns p95 ms", "ttft_ms_later_p95"),
    ("cache hit", "cache_hit_ratio"),
    ("errors", "errors"),
    ("requests", "requests"),
    ("agg x anchor", lambda d: (d.get("ratios") or {}).get("aggregate_tok_s")),
    ("TTFT p95 x anchor", lambda d: (d.get("ratios") or {}).get("ttft_ms_p95")),
    ("objective", lambda d: (d.get("tune") or {}).get("objective")),
)


def _result_columns(doc: dict) -> dict[str, Any]:
    """The numbers of the benches without a fleet summary, by workload: bench=spec, per
    workload and batch size, the draft's paired ratio to draft=none (None for draft=none
    itself) and the A/A ratio, a second draft=none engine's, which says how far the runs
    spread; bench=decode each contender's tok/s and ratio to mlx-lm; bench=kv each
    scheme's decode tok/s and ratio to native KV per batch and context, and the rows its
    budget holds; bench=prefix the TTFT median cold, on a RAM hit and restored from SSD."""
    result, out = doc.get("result") or {}, {}
    workload = doc.get("workload")
    if workload == "spec":
        for c in result.get("cells", []):
            at = f"{c['workload']} B={c['rows']}"
            out[f"{at} x none"] = c.get("paired_ratio")
            out[f"{at} A/A"] = (c.get("control") or {}).get("paired_ratio")
    elif workload == "decode":
        for c in result.get("contenders", []):
            out[f"{c['name']} tok/s"] = c.get("tok_s_median")
            out[f"{c['name']} x mlx_lm"] = c.get("ratio_to_mlx_lm")
    elif workload == "kv":
        for c in result.get("decode", []):
            at = f"{c['scheme']} B={c['batch']} ctx={c['context']}"
            out[f"{at} tok/s"] = c.get("tok_s_median")
            out[f"{at} x native"] = c.get("ratio_to_native")
        for c in result.get("capacity", []):
            out[f"{c['scheme']} rows at ctx={c['context']}"] = c.get("rows")
    elif workload == "prefix":
        for r in result.get("rows", []):
            for case in ("cold", "ram_hit", "ssd_restore"):
                if case in r:
                    out[f"{r['prefix_tokens']} {case} TTFT ms"] = r[case].get("ttft_ms_median")
    return out


def _knobs(overrides: list[str]) -> dict[str, str]:
    out = {}
    for o in overrides:
        if "=" in o and not o.startswith("hydra"):
            k, v = o.split("=", 1)
            out[k.lstrip("+~")] = v
    return out


Cell = tuple[Path, list[str]]  # a job's output dir and its overrides


def rows(cells: list[Cell]) -> tuple[list[str], list[str], list[dict]]:
    """(swept knobs, metric columns present, one row per cell) from the cells' bench.json."""
    docs = []
    for cell, _ in cells:
        f = cell / "bench.json"
        docs.append((cell, json.loads(f.read_text()) if f.is_file() else None))
    knobs = [_knobs(overrides) for _, overrides in cells]
    keys = list(dict.fromkeys(k for kn in knobs for k in kn))
    swept = [k for k in keys if len({kn.get(k, "-") for kn in knobs}) > 1]
    out = []
    for (cell, doc), kn in zip(docs, knobs, strict=True):
        row: dict[str, Any] = {"cell": cell.name, **{k: kn.get(k, "-") for k in swept}}
        if doc is None:
            err = cell / "error.txt"  # a refused plan, or a bench that failed (cli._failed)
            row["target"] = (f"(failed: {err.read_text().splitlines()[0]})" if err.is_file()
                             else "(failed: no bench.json)")
        else:
            row["target"] = doc.get("target", {}).get("kind", "-")
            for col, key in METRICS:
                row[col] = key(doc) if callable(key) else doc.get("summary", {}).get(key)
            row.update(_result_columns(doc))
        out.append(row)
    named = [c for c, _ in METRICS] + list(dict.fromkeys(
        c for doc in (d for _, d in docs if d) for c in _result_columns(doc)))
    metrics = [c for c in named if any(r.get(c) is not None for r in out)]
    return swept, metrics, out


def _cell(x: Any) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if isinstance(x, float) else str(x)


def markdown(root: Path, swept: list[str], metrics: list[str], table: list[dict],
             first: dict | None) -> str:
    cols = ["cell", *swept, "target", *metrics]
    lines = [f"# Sweep {root}", ""]
    if first:
        lb = first["label"]
        m, mach = lb["model"], lb["machine"]
        lines += [f"- model: {m['id']} ({m['architecture']}, {m['parameters']:,} params, "
                  f"{m['dtype']})",
                  f"- machine: {mach['chip']} ({mach['backend']}, {mach['platform']})",
                  f"- versions: mlx {lb['versions']['mlx']}, mlx-lm {lb['versions']['mlx-lm']}; "
                  f"first cell at {lb['date']}",
                  f"- workload: bench={first['workload']}; fixed: "
                  f"{' '.join(o for o in first['overrides'] if o.split('=')[0] not in swept)}",
                  ""]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in table]
    ok = [r for r in table if r.get("agg tok/s") is not None and not r.get("errors")]
    if ok:
        best = max(ok, key=lambda r: r["agg tok/s"])
        lines += ["", f"Highest aggregate tok/s without errors: cell {best['cell']} "
                      f"({', '.join(f'{k}={best[k]}' for k in swept)})"]
    return "\n".join(lines) + "\n"


def _order(values: list[str]) -> tuple[list[float], list[str]] | None:
    """Numeric positions for knob values (numbers or sizes such as 4GiB); None: categorical."""
    from appliance.plan.sizes import parse_size

    xs = []
    for v in values:
        try:
            xs.append(float(v))
        except ValueError:
            try:
                xs.append(float(parse_size(v)))
            except (ValueError, TypeError):
                return None
    return xs, values


def plot(root: Path, knob: str, swept: list[str], table: list[dict], title: str,
         bound_ms: float | None = None) -> Path:
    """Aggregate tok/s and TTFT p95 against `knob`, a line per combination of the others
    (and mode=tune's TTFT p95 bound, dashed)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server or in CI
    import matplotlib.pyplot as plt

    done = [r for r in table if r.get("agg tok/s") is not None]
    values = sorted({r[knob] for r in done}, key=str)
    numeric = _order(values)
    if numeric:
        pos = dict(zip(values, numeric[0], strict=True))
        values = sorted(values, key=pos.get)
    else:
        pos = {v: float(i) for i, v in enumerate(values)}
    others = [k for k in swept if k != knob]
    groups: dict[str, list[dict]] = {}
    for r in done:
        groups.setdefault(", ".join(f"{k}={r[k]}" for k in others) or knob, []).append(r)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, col in zip(axes, ("agg tok/s", "TTFT p95 ms"), strict=True):
        for name, rs in groups.items():
            pts = sorted((pos[r[knob]], r[col]) for r in rs if r.get(col) is not None)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name)
        ax.set_xticks([pos[v] for v in values], values)
        if numeric and min(pos.values()) > 0 and max(pos.values()) / min(pos.values()) >= 8:
            ax.set_xscale("log", base=2)
            ax.set_xticks([pos[v] for v in values], values)
            ax.minorticks_off()
        ax.set_xlabel(knob)
        ax.set_ylabel(col)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    if bound_ms:
        axes[1].axhline(bound_ms, color="grey", linestyle="--", label="TTFT p95 bound")
        axes[1].set_ylim(top=max(axes[1].get_ylim()[1], bound_ms * 1.05))  # (in view)
    if len(groups) > 1 or bound_ms:
        axes[1].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in knob)
    path = root / f"sweep-{safe}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(root: Path, cells: list[Cell]) -> dict[str, Path] | None:
    """sweep.md, sweep.csv and the plots at `root`; None when no cell was a bench."""
    cells = sorted(cells, key=lambda c: (len(c[0].name), c[0].name))  # 0, 1, ..., 10
    done = [c / "bench.json" for c, _ in cells if (c / "bench.json").is_file()]
    if not done:
        return None
    swept, metrics, table = rows(cells)
    first = json.loads(done[0].read_text())
    out = {"md": root / "sweep.md", "csv": root / "sweep.csv"}
    out["md"].write_text(markdown(root, swept, metrics, table, first))
    with open(out["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, ["cell", *swept, "target", *metrics], extrasaction="ignore")
        w.writeheader()
        w.writerows(table)
    lb = first["label"]
    title = (f"bench={first['workload']} | {lb['model']['id']} {lb['model']['dtype']} | "
             f"{lb['machine']['chip']} {lb['machine']['backend']} | {lb['date'][:10]}")
    bound = (first.get("tune") or {}).get("ttft_p95_bound_ms")
    if "agg tok/s" in metrics:  # (bench=spec, decode, kv, prefix measure something else)
        for knob in swept:
            out[f"png:{knob}"] = plot(root, knob, swept, table, title, bound)
    return out


class SweepReport(Callback):
    """Collects each job's output dir; at the end of a multirun, writes the report there."""

    def __init__(self) -> None:
        self.cells: list[Cell] = []

    def on_job_end(self, config, job_return, **kwargs) -> None:
        from omegaconf import OmegaConf

        overrides = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
        self.cells.append((Path(config.hydra.runtime.output_dir), [str(o) for o in overrides]))

    def on_multirun_end(self, config, **kwargs) -> None:
        if config.get("mode") not in ("bench", "tune") or not self.cells:
            return
        root = self.cells[0][0].parent
        try:
            out = write_report(root, self.cells)
        except Exception:  # a report must not turn a finished sweep into a failed one
            log.exception("the sweep report failed; every cell's bench.json is under %s", root)
            return
        if out is None:
            return
        print(out["md"].read_text(), flush=True)
        print(f"SWEEP {out['md']} {out['csv']} "
              f"{' '.join(str(p) for k, p in out.items() if k.startswith('png:'))}", flush=True)
        if config.mode == "tune":
            from appliance.bench.tune import write_profile

            write_profile(config, root, [c for c, _ in self.cells])
