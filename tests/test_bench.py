"""mode=bench: the harness's arithmetic, a tiny fleet against this plan, and the CLI.

Speed is never asserted (ARCHITECTURE.md): only structure and token counts.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.bench.stats import (
    RequestResult,
    aggregate_tps,
    median,
    percentile,
    summarize_fleet,
)
from appliance.config.schema import BenchConfig

CPU = ("model.dtype=float32",)  # what the benched server gets too (bf16 is slow on CPU)
TINY_FLEET = dict(clients=3, system_tokens=64, user_tokens=16, max_tokens=8, stagger_s=0.05,
                  jitter_s=0.02, warmup=0)


def test_percentile_and_median_on_fixed_numbers():
    xs = [10.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0, 5.0]  # unsorted on purpose
    assert percentile(xs, 50) == pytest.approx(5.5)
    assert percentile(xs, 95) == pytest.approx(9.55)  # numpy's linear rule
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 10.0
    assert median([3.0]) == 3.0
    assert math.isnan(percentile([], 50))


def test_aggregation_on_fixed_requests():
    a = RequestResult(0, 0, start=0.0, first_token=0.5, last_token=1.5, end=1.5,
                      completion_tokens=11, prompt_tokens=100, usage_reported=True)
    b = RequestResult(1, 0, start=1.0, first_token=1.2, last_token=3.0, end=3.0,
                      completion_tokens=19, prompt_tokens=100, usage_reported=True)
    bad = RequestResult(2, 0, start=0.2, error="HTTP 429: queue full")
    assert a.ttft == pytest.approx(0.5)
    assert a.decode_tps() == pytest.approx(10 / 1.0)
    assert b.decode_tps() == pytest.approx(18 / 1.8)
    # (11 + 19) tokens over first start 0.0 .. last end 3.0; the failed request is left out
    assert aggregate_tps([a, b, bad]) == pytest.approx(10.0)
    s = summarize_fleet([a, b, bad], admitted_rows=2)
    assert (s["requests"], s["completed"], s["errors"]) == (3, 2, 1)
    assert s["ttft_ms_p50"] == pytest.approx(350.0)
    assert s["ttft_ms_p95"] == pytest.approx(485.0)
    assert s["aggregate_tok_s"] == pytest.approx(10.0)
    assert s["request_decode_tok_s_median"] == pytest.approx(10.0)
    assert s["completion_tokens"] == 30 and s["wall_s"] == pytest.approx(3.0)
    assert s["admitted_rows"] == 2 and s["prompt_tokens_mean"] == 100


@pytest.fixture(scope="module")
def cpu_plan():
    from conftest import resolve_overrides

    return resolve_overrides(list(CPU))


def test_fleet_against_self(cpu_plan, tmp_path):
    from appliance.bench import run

    plan = cpu_plan
    cfg = BenchConfig(**TINY_FLEET)
    doc = run(plan, cfg, tmp_path, CPU)
    on_disk = json.loads((tmp_path / "bench.json").read_text())
    assert on_disk == json.loads(json.dumps(doc))
    label = on_disk["label"]
    assert label["fingerprint"] == plan.fingerprint
    assert label["machine"]["backend"] == plan.machine.backend
    assert label["model"]["parameters"] == plan.model.parameters
    assert set(label["versions"]) >= {"mlx", "mlx-lm"} and label["versions"]["mlx"]
    assert label["mlx_env"]["MLX_CUDA_GRAPH_CACHE_SIZE"] == os.environ["MLX_CUDA_GRAPH_CACHE_SIZE"]
    assert label["batch"] == {"mode": plan.batch.mode, "max_rows": plan.batch.max_rows,
                              "prefill_chunk": plan.batch.prefill_chunk}
    assert label["bench"]["clients"] == 3 and label["bench"]["max_tokens"] == 8
    assert on_disk["target"]["kind"] == "self"

    reqs, s = on_disk["requests"], on_disk["summary"]
    assert len(reqs) == 3 and s["requests"] == 3 and s["errors"] == 0
    assert sorted(r["client"] for r in reqs) == [0, 1, 2]
    for r in reqs:
        assert r["error"] is None and r["usage_reported"]
        assert r["completion_tokens"] == 8  # EOS banned: every request runs to max_tokens
        assert r["ttft_ms"] > 0 and r["end_s"] > r["start_s"]
        assert r["prompt_tokens"] > 64 + 16 - 8  # ~system + ~user + chat template
    assert len({r["start_s"] for r in reqs}) == 3
    assert 0 < s["ttft_ms_p50"] <= s["ttft_ms_p95"]
    assert s["aggregate_tok_s"] > 0 and s["completion_tokens"] == 24
    assert 1 <= s["admitted_rows"] <= 3


def test_decode_against_self(cpu_plan, tmp_path):
    from appliance.bench import run

    doc = run(cpu_plan, BenchConfig(workload="decode", decode_tokens=8, repeats=1), tmp_path,
              CPU)
    names = [c["name"] for c in doc["result"]["contenders"]]
    assert names == ["mlx_lm stream_generate", "appliance engine", "appliance http"]
    for c in doc["result"]["contenders"]:
        assert len(c["runs"]) == 1 and c["tok_s_median"] > 0
    assert doc["result"]["contenders"][0]["ratio_to_mlx_lm"] == 1.0
    assert (tmp_path / "bench.json").is_file()


def test_prefix_cold_ram_ssd(cpu_plan, tmp_path):
    """Cold, then RAM hits, then SSD restores in a restarted server: the cached token
    counts prove which path served each (speed itself is not asserted)."""
    from appliance.bench import run

    cfg = BenchConfig(workload="prefix", prefix_tokens=[96], user_tokens=8, keep_ssd=True)
    row = run(cpu_plan, cfg, tmp_path, CPU)["result"]["rows"][0]
    assert row["cold"]["cached_tokens"] == [0, 0, 0]
    for phase in ("ram_hit", "ssd_restore"):
        assert all(c >= 96 for c in row[phase]["cached_tokens"]), row[phase]
        assert row[phase]["ratio_to_cold"] > 0
    assert list((tmp_path / "ssd-96").iterdir())  # the SSD tier really wrote there


def test_bench_refuses_bad_settings_listing_every_problem(plan, tmp_path):
    from appliance.bench import check, run
    from appliance.plan import PlanError

    assert check(BenchConfig()) == [] and check(BenchConfig(target="http://h:1")) == []
    with pytest.raises(PlanError) as e:
        run(plan, BenchConfig(workload="nope", target="vllm", clients=0), tmp_path)
    text = e.value.render()
    assert "valid choices: fleet, decode" in text and "valid choices: self, mlx_lm" in text
    assert "bench.clients=0 must be >= 1" in text and len(e.value.problems) == 3
    assert "self or mlx_lm" in " ".join(check(BenchConfig(workload="decode",
                                                          target="http://127.0.0.1:1")))
    assert not (tmp_path / "bench.json").exists()


def test_cli_writes_bench_json(tmp_path):
    cmd = [sys.executable, "-m", "appliance.cli", "mode=bench", "bench.clients=2",
           "bench.system_tokens=32", "bench.user_tokens=8", "bench.max_tokens=4",
           "bench.warmup=0", "bench.stagger_s=0.02", "bench.jitter_s=0"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    files = list(Path(tmp_path, "bench").glob("*/bench.json"))
    assert len(files) == 1, r.stdout
    doc = json.loads(files[0].read_text())
    assert doc["summary"]["requests"] == 2 and doc["summary"]["errors"] == 0
    assert all(q["completion_tokens"] == 4 for q in doc["requests"])
    assert "BENCH fleet target=self" in r.stdout


def test_a_bench_stopped_before_it_wrote_anything_leaves_no_folder(tmp_path):
    """Ctrl-C in an in-process bench (bench=spec here; bench=kv in the walkthrough that
    found it) exits 130 and, nothing written yet, leaves no empty ./bench/<time>/."""
    import signal
    import time

    cmd = [sys.executable, "-m", "appliance.cli", "mode=bench", "bench=spec", "draft=lookup",
           "model.dtype=float32", "bench.decode_tokens=4096", "bench.repeats=50",
           "bench.progress=false"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 60
        while not list(tmp_path.glob("bench/*")):  # the run has started (its folder made)
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.1)
        time.sleep(3.0)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (tmp_path / "bench").exists()


def test_a_bench_stopped_while_its_plan_resolves_leaves_no_folder(tmp_path):
    """Ctrl-C before the bench starts (here: while the plan resolves) left an empty
    ./bench/<time>/ that Hydra had made (found by a helper's walkthrough)."""
    code = ("import sys, appliance.cli as cli\n"
            "def stopped(*a, **kw): raise KeyboardInterrupt\n"
            "cli.resolve = stopped\nsys.argv[0] = 'appliance'\ncli.main()")
    r = subprocess.run([sys.executable, "-c", code, "mode=bench", "bench.progress=false"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 130 and "appliance: interrupted" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "bench").exists()


def test_kv_scheme_against_native(tmp_path):
    """bench=kv: capacity, batched and short-row decode for k8v4 and its native anchor,
    measured in one run, with the label (speed itself is not asserted)."""
    from conftest import resolve_overrides

    from appliance.bench import check, run

    overrides = ["kv=k8v4", "kv.start=32"]  # the 48-token rows are encoded, short ones not
    plan = resolve_overrides(overrides)
    # a fixed budget: capacity then depends on bytes per token only, not on this machine
    cfg = BenchConfig(workload="kv", kv_batches=[2], kv_context=48, kv_short_context=16,
                      decode_tokens=4, repeats=1, kv_budget="1GiB")
    run(plan, cfg, tmp_path, tuple(overrides))
    doc = json.loads((tmp_path / "bench.json").read_text())
    r, label = doc["result"], doc["label"]
    assert doc["workload"] == "kv" and label["kv"] == "affine"
    assert label["fingerprint"] == plan.fingerprint and label["versions"]["mlx"]
    assert label["machine"]["backend"] == plan.machine.backend
    assert label["model"]["parameters"] == plan.model.parameters
    assert label["bench"]["kv_batches"] == [2] and label["bench"]["kv_context"] == 48
    assert r["anchor"] == "native" and r["scheme"] == "k8v4"
    assert [s["name"] for s in r["schemes"]] == ["native", "k8v4"]
    native, k8v4 = r["schemes"]
    assert native["bytes_per_token"] == k8v4["native_bytes_per_token"] > k8v4["bytes_per_token"]
    assert k8v4["fingerprint"] == plan.fingerprint != native["fingerprint"]
    assert r["kv_budget_bytes"] == 2**30

    cap = {(c["scheme"], c["context"]): c for c in r["capacity"]}
    assert set(cap) == {(s, c) for s in ("native", "k8v4") for c in (4096, 32768)}
    for c in (4096, 32768):
        assert cap["native", c]["ratio_to_native"] == 1.0
        assert cap["k8v4", c]["rows"] > cap["native", c]["rows"] > 0
        assert cap["native", c]["rows"] == 2**30 // (native["bytes_per_token"] * c)

    assert [(d["scheme"], d["batch"]) for d in r["decode"]] == [("native", 2), ("k8v4", 2)]
    for d in r["decode"]:
        assert d["tok_s_median"] > 0 and len(d["runs"]) == 1 and d["ratio_to_native"] > 0
        m = d["memory"]
        assert m["kv_bytes_predicted"] > 0 and m["kv_bytes_held"] > 0
        assert m["active_bytes"] > 0 and m["cache_bytes"] >= 0
    assert r["decode"][0]["ratio_to_native"] == 1.0
    assert (r["decode"][1]["memory"]["kv_bytes_predicted"]
            < r["decode"][0]["memory"]["kv_bytes_predicted"])
    assert [(s["scheme"], s["path"]) for s in r["short"]] == [
        ("native", "solo"), ("k8v4", "solo"), ("native", "batched"), ("k8v4", "batched")]
    assert all(s["tok_s_median"] > 0 and s["context"] == 16 for s in r["short"])

    problems = check(BenchConfig(workload="kv", target="mlx_lm", kv_batches=[],
                                 kv_capacity_contexts=[0], kv_context=0, kv_budget="lots"))
    assert len(problems) == 5, problems
    assert "bench.target must be self" in problems[0]


@pytest.mark.parametrize("args,shown", [
    (["bench=kv", "kv=k8v4", "bench.kv_batches=[2]", "bench.kv_context=48",
      "bench.kv_short_context=16", "bench.kv_budget=1GiB"], "kv: native vs k8v4"),
    (["bench=spec", "draft=lookup", "bench.spec_workloads=[edit]", "bench.spec_batches=[1]",
      "bench.spec_context=128"], "spec: none vs lookup"),
    (["bench=decode"], "decode: mlx_lm, engine, http"),
    (["bench=prefix", "bench.prefix_tokens=[128]", "bench.user_tokens=16"],
     "prefix: cold, RAM hit, SSD restore"),
])
def test_in_process_benches_show_progress_on_a_terminal(tmp_path, args, shown):
    """bench=kv, spec, decode and prefix ran minutes with no output at all (a walkthrough
    stopped one as hung): on a terminal they draw a bar, as fleet and agents do; piped,
    nothing."""
    import pty
    import threading

    short = [] if "bench=prefix" in args else ["bench.repeats=1", "bench.decode_tokens=4"]
    cmd = [sys.executable, "-m", "appliance.cli", "mode=bench", "model.dtype=float32", *short,
           *args]
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    drawn = bytearray()

    def drain():  # (a full pty would block the bench)
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 4096):
                drawn.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    out = proc.communicate(timeout=300)[0].decode()
    reader.join(timeout=10)
    os.close(master)
    assert proc.returncode == 0, drawn.decode(errors="replace")[-2000:]
    assert shown in drawn.decode(errors="replace") and shown not in out
    piped = _run_piped(cmd, tmp_path / "piped")
    assert piped.returncode == 0 and shown not in piped.stderr + piped.stdout


def _run_piped(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    cwd.mkdir()
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
