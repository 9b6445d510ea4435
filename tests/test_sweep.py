"""Sweeps that compare (the multirun report) and mode=tune (Optuna, then a profile).

The report's layout is checked on fixed bench.json files; one tiny real multirun and one
2-trial tune run go through the CLI as a person would. Speed is never asserted."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import yaml

from appliance.bench.sweep import write_report
from appliance.bench.tune import MARK, objective

# a tiny agents workload on the embedded model in float32 (bf16 is slow on CPU)
TINY = ["bench=agents", "bench.anchor=none", "model.dtype=float32", "bench.agents=2",
        "bench.turns=2", "bench.max_tokens=4", "bench.system_tokens=64",
        "bench.user_tokens=16", "bench.tool_tokens=32", "bench.think_s=0.02",
        "bench.stagger_s=0.02", "bench.warmup=0"]


def _cli(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def _doc(overrides: list[str], agg: float, p95: float, errors: int = 0) -> dict:
    label = {"date": "2026-11-30T12:00:00+00:00", "versions": {"mlx": "0", "mlx-lm": "0"},
             "model": {"id": "m", "architecture": "qwen3", "parameters": 1, "dtype": "float32"},
             "machine": {"chip": "cpu", "backend": "cpu", "platform": "linux"}}
    return {"label": label, "workload": "agents", "overrides": overrides,
            "target": {"kind": "self"},
            "summary": {"aggregate_tok_s": agg, "ttft_ms_p50": p95 / 2, "ttft_ms_p95": p95,
                        "errors": errors, "requests": 4, "cache_hit_ratio": 0.5},
            "ratios": {"aggregate_tok_s": agg / 100, "ttft_ms_p95": 0.5}}


def test_report_from_fixed_cells(tmp_path):
    """Knobs that differ between cells become columns (in order), a failed cell is a row,
    every swept knob gets a plot; sizes sort as sizes."""
    cells = []
    for i, (rows, ram, agg) in enumerate([(4, "1GiB", 50.0), (8, "1GiB", 70.0),
                                          (4, "256MiB", 40.0), (8, "256MiB", 60.0)]):
        ov = ["mode=bench", f"batch.max_rows={rows}", f"cache.ram.bytes={ram}"]
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "bench.json").write_text(json.dumps(_doc(ov, agg, 1000 / agg)))
        cells.append((tmp_path / str(i), ov))
    (tmp_path / "4").mkdir()
    cells.append((tmp_path / "4", ["mode=bench", "batch.max_rows=16", "cache.ram.bytes=1GiB"]))
    out = write_report(tmp_path, cells)
    md = out["md"].read_text()
    assert "| cell | batch.max_rows | cache.ram.bytes | target | agg tok/s |" in md
    assert "| 1 | 8 | 1GiB | self | 70.00 |" in md and "failed" in md
    assert "cell 1 (batch.max_rows=8, cache.ram.bytes=1GiB)" in md
    table = list(csv.DictReader(out["csv"].open()))
    assert [r["cell"] for r in table] == ["0", "1", "2", "3", "4"]
    assert table[3]["agg x anchor"] == "0.6" and table[4]["agg tok/s"] == ""
    for knob in ("batch.max_rows", "cache.ram.bytes"):
        png = out[f"png:{knob}"]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert write_report(tmp_path / "4", [(tmp_path / "4", [])]) is None  # nothing benched


def test_objective_penalizes_infeasible_trials():
    ok = {"aggregate_tok_s": 50.0, "ttft_ms_p95": 900.0, "errors": 0}
    assert objective(ok, 1000) == (50.0, True)
    slow, feasible = objective({**ok, "ttft_ms_p95": 1500.0}, 1000)
    assert not feasible and slow == -1.5  # below any feasible trial, closer is better
    failed, _ = objective({**ok, "errors": 1}, 1000)
    assert failed < slow


def test_multirun_ends_with_one_comparison(tmp_path):
    r = _cli(["-m", "mode=bench", *TINY, "batch.max_rows=1,2"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    [root] = list(tmp_path.glob("multirun/*/*"))
    assert (root / "0" / "bench.json").is_file() and (root / "1" / "bench.json").is_file()
    table = list(csv.DictReader((root / "sweep.csv").open()))
    assert [(t["batch.max_rows"], t["errors"]) for t in table] == [("1", "0"), ("2", "0")]
    assert all(float(t["agg tok/s"]) > 0 and float(t["TTFT p95 ms"]) > 0 for t in table)
    assert "| cell | batch.max_rows |" in (root / "sweep.md").read_text()
    assert (root / "sweep-batch.max_rows.png").stat().st_size > 10_000
    assert f"SWEEP {root / 'sweep.md'}" in r.stdout


def test_a_spec_sweep_compares_the_methods(tmp_path):
    """Issue 12 item 10: `appliance -m mode=bench bench=spec draft=none,lookup` ends with one
    table: each method's paired ratio to draft=none and its A/A spread, per workload and
    batch size (the report once plotted only fleet numbers, found none here and failed)."""
    r = _cli(["-m", "mode=bench", "bench=spec", "draft=none,lookup", "model.dtype=float32",
              "bench.repeats=1", "bench.spec_workloads=[edit]", "bench.spec_batches=[1]",
              "bench.decode_tokens=16", "bench.spec_context=128", "bench.progress=false"],
             tmp_path)
    assert r.returncode == 0 and "the sweep report failed" not in r.stderr, r.stderr[-3000:]
    [root] = list(tmp_path.glob("multirun/*/*"))
    docs = [json.loads((root / c / "bench.json").read_text()) for c in ("0", "1")]
    table = list(csv.DictReader((root / "sweep.csv").open()))
    assert [t["draft"] for t in table] == ["none", "lookup"]
    assert table[0]["edit B=1 x none"] == ""  # (draft=none against itself: no ratio)
    assert float(table[1]["edit B=1 x none"]) == docs[1]["result"]["cells"][0]["paired_ratio"]
    assert [float(t["edit B=1 A/A"]) for t in table] == [
        d["result"]["cells"][0]["control"]["paired_ratio"] for d in docs]
    assert "| cell | draft | target | edit B=1 x none | edit B=1 A/A |" in \
        (root / "sweep.md").read_text()
    assert not list(root.glob("*.png"))  # (no fleet numbers to plot)


def test_tune_writes_a_profile_that_resolves(tmp_path):
    """Two Optuna trials over max_rows and prefill_chunk; the best becomes
    ./profiles/<name>.yaml, and `+profile=<name>` then plans with its values."""
    r = _cli(["mode=tune", "tune.profile=tuned-test", "tune.trials=2", "tune.seed=3",
              "tune.max_rows=[1,2]", "tune.prefill_chunk=[64,128]", "tune.ram_bytes=[]",
              "tune.ttft_p95_ms=600000", "cache=ram",
              *TINY[1:]], tmp_path)  # as docs/tuning.md types it: bench=agents is implied
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    path = tmp_path / "profiles" / "tuned-test.yaml"
    text = path.read_text()
    assert text.startswith(MARK) and "model: appliance-tiny (float32)" in text
    profile = yaml.safe_load(text)
    assert profile["defaults"] == [{"override /cache": "ram"}, "_self_"]
    rows, chunk = profile["batch"]["max_rows"], profile["batch"]["prefill_chunk"]
    assert rows in (1, 2) and chunk in (64, 128)
    [root] = list(tmp_path.glob("multirun/*/*"))
    docs = [json.loads(p.read_text()) for p in root.glob("*/bench.json")]
    assert len(docs) == 2 and all(d["tune"]["feasible"] for d in docs)
    best = max(docs, key=lambda d: d["tune"]["objective"])
    assert f"batch.max_rows={rows}" in best["overrides"]
    assert (root / "sweep.md").is_file() and (root / "optimization_results.yaml").is_file()

    plan = _cli(["mode=plan", "+profile=tuned-test", "model.dtype=float32"], tmp_path, 120)
    assert plan.returncode == 0, plan.stderr[-2000:]
    resolved = yaml.safe_load(plan.stdout)
    assert resolved["batch"]["max_rows"] == rows
    assert resolved["batch"]["prefill_chunk"] == chunk
    assert resolved["cache"]["kind"] == "ram" and resolved["profiles"] == ["tuned-test"]

    # a profile not written by mode=tune is never overwritten
    (tmp_path / "profiles" / "mine.yaml").write_text("batch:\n  max_rows: 3\n")
    r = _cli(["mode=tune", "tune.profile=mine", *TINY], tmp_path, 120)
    assert r.returncode == 2 and "was not written by mode=tune" in r.stderr
    # nor named as a shipped profile (it would hide it) or one the run is tuned on (it would
    # include itself: once a RecursionError on every later plan in this directory)
    r = _cli(["mode=tune", "tune.profile=agent-fleet", *TINY], tmp_path, 120)
    assert r.returncode == 2 and "is a shipped profile's name" in r.stderr
    r = _cli(["mode=tune", "tune.profile=tuned-test", "+profile=[m4-pro,tuned-test]", *TINY],
             tmp_path, 120)
    assert r.returncode == 2 and "the tuned file would include itself" in r.stderr
    assert not (tmp_path / "profiles" / "agent-fleet.yaml").exists()
    # candidates that would not be tried: a knob also fixed, a RAM size with no RAM tier
    r = _cli(["mode=tune", "tune.profile=t2", "tune.max_rows=[2,4]", "batch.max_rows=8",
              "tune.ram_bytes=[1GiB]", "cache=none", *TINY], tmp_path, 120)
    assert r.returncode == 2
    assert "tune.max_rows=[2,4] batch.max_rows=8: a setting on the command line stays " \
        "fixed" in r.stderr and "tune.ram_bytes=[1GiB]: cache=none has no RAM tier" in r.stderr


def test_a_cell_that_fails_at_run_time_is_a_row_of_the_report(tmp_path):
    """A cell whose bench fails (here its target does not answer) is said on stderr and in
    its error.txt, and the sweep goes on to its report (Hydra re-raised the job's error,
    so no report was written, and the exit code was the plan error's 2)."""
    r = _cli(["-m", "mode=bench", "bench=fleet", "bench.target=self,http://127.0.0.1:9",
              "bench.clients=2", "bench.system_tokens=64", "bench.user_tokens=16",
              "bench.max_tokens=8", "bench.progress=false"], tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "appliance: the bench failed: ConnectError" in r.stderr
    assert "(bench.target=http://127.0.0.1:9)" in r.stderr and "Traceback" not in r.stderr
    [root] = list(tmp_path.glob("multirun/*/*"))
    assert "Traceback" in (root / "1" / "error.txt").read_text()
    table = list(csv.DictReader((root / "sweep.csv").open()))
    assert float(table[0]["agg tok/s"]) > 0 and table[1]["agg tok/s"] == ""
    assert table[1]["target"].startswith("(failed: ConnectError")


def test_the_tune_bound_is_in_view(tmp_path, monkeypatch):
    """mode=tune's TTFT p95 bound is drawn on its plot's scale (it sat above the y-axis,
    named in the legend only, wherever the trials ran well under it)."""
    import matplotlib.figure

    seen = []
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **kw: (seen.append(fig.axes[1].get_ylim()),
                                               save(fig, *a, **kw)))
    cells = []
    for i, rows in enumerate((1, 2)):
        ov = ["mode=tune", f"batch.max_rows={rows}"]
        doc = {**_doc(ov, 50.0 + i, 90.0), "tune": {"ttft_p95_bound_ms": 3000}}
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "bench.json").write_text(json.dumps(doc))
        cells.append((tmp_path / str(i), ov))
    write_report(tmp_path, cells)
    [(bottom, top)] = seen
    assert bottom == 0 and top >= 3000


def test_decode_kv_and_prefix_sweeps_compare_their_own_numbers(tmp_path):
    """A sweep of bench=decode, kv or prefix had a table of knobs and no numbers (the
    report read fleet summaries and bench=spec's cells only); each now shows its own."""
    results = {
        "decode": {"contenders": [{"name": "appliance engine", "tok_s_median": 244.2,
                                   "ratio_to_mlx_lm": 1.15}]},
        "kv": {"decode": [{"scheme": "k8v4", "batch": 2, "context": 128, "tok_s_median": 381.7,
                           "ratio_to_native": 1.12}],
               "capacity": [{"scheme": "k8v4", "context": 256, "rows": 94}]},
        "prefix": {"rows": [{"prefix_tokens": 128, "cold": {"ttft_ms_median": 57.2},
                             "ram_hit": {"ttft_ms_median": 24.3}}]},
    }
    want = {"decode": {"appliance engine tok/s": "244.2", "appliance engine x mlx_lm": "1.15"},
            "kv": {"k8v4 B=2 ctx=128 tok/s": "381.7", "k8v4 B=2 ctx=128 x native": "1.12",
                   "k8v4 rows at ctx=256": "94"},
            "prefix": {"128 cold TTFT ms": "57.2", "128 ram_hit TTFT ms": "24.3"}}
    for workload, result in results.items():
        root, cells = tmp_path / workload, []
        for i in range(2):
            ov = ["mode=bench", f"bench={workload}", f"bench.repeats={i + 1}"]
            doc = {**_doc(ov, 1.0, 1.0), "workload": workload, "result": result}
            del doc["summary"], doc["ratios"]
            (root / str(i)).mkdir(parents=True)
            (root / str(i) / "bench.json").write_text(json.dumps(doc))
            cells.append((root / str(i), ov))
        out = write_report(root, cells)
        table = list(csv.DictReader(out["csv"].open()))
        assert [t["bench.repeats"] for t in table] == ["1", "2"]
        for t in table:
            assert {k: t[k] for k in want[workload]} == want[workload]
