"""bench=agents: the conversations, the arithmetic, a tiny run against the appliance and
mlx_lm.server, and Ctrl-C stopping the servers. Speed is never asserted."""

from __future__ import annotations

import glob
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from appliance.bench.agents import agents_line, agents_text, unequal
from appliance.bench.stats import RequestResult, summarize_agents
from appliance.config.schema import BenchConfig

TINY = dict(workload="agents", agents=2, turns=2, max_tokens=4, system_tokens=64,
            user_tokens=16, tool_tokens=32, think_s=0.02, stagger_s=0.02, jitter_s=0.0,
            warmup=0)
CPU = ["model.dtype=float32"]  # bf16 matmuls are slow on CPU


def test_conversations_are_seeded_and_distinct():
    from conftest import resolve_overrides

    from appliance.bench.agents import conversations
    from appliance.bench.prompts import load_tokenizer, model_dir

    tok = load_tokenizer(model_dir(resolve_overrides(CPU)))
    cfg = BenchConfig(**{**TINY, "agents": 3, "turns": 3, "warmup": 1, "think_s": 0.5})
    a, b = conversations(tok, cfg), conversations(tok, cfg)
    assert a == b  # same seed, same text and pauses
    assert len(a.tasks) == 4 and len(set(a.tasks)) == 4  # warm-up + one per agent
    assert [len(t) for t in a.tools] == [2, 2, 2]
    assert len({t for ts in a.tools for t in ts}) == 6  # no two tool outputs alike
    assert a.warm_system != a.system and not a.system.startswith(a.warm_system[:40])
    assert all(0 <= s <= 1.0 for ts in a.think_s for s in ts)
    other = conversations(tok, BenchConfig(**{**TINY, "agents": 3, "turns": 3, "warmup": 1,
                                              "think_s": 0.5, "seed": 1}))
    assert other.think_s != a.think_s and other.system == a.system


def test_a_workload_past_the_context_is_refused_before_it_runs(tmp_path):
    """Its last turns would each fail with a 400 (4 of 24 requests once; in mode=tune every
    trial): refused up front, naming what to lower, for a bench and a tune launch alike."""
    from conftest import resolve_overrides

    from appliance.bench.agents import context_problems

    plan = resolve_overrides(CPU)
    assert context_problems(plan, BenchConfig(**TINY)) == []
    long = BenchConfig(**{**TINY, "turns": 8, "tool_tokens": 640})
    [problem] = context_problems(plan, long)
    assert "server.max_context=4096; lower bench.turns" in problem
    for mode in ("bench", "tune"):
        r = subprocess.run([sys.executable, "-m", "appliance.cli", f"mode={mode}",
                            "bench=agents", "bench.turns=8", "bench.tool_tokens=640", *CPU],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "past server.max_context=4096" in r.stderr, r.stderr[-800:]
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing left


def test_summarize_agents_on_fixed_requests():
    def req(agent, turn, start, first, end, prompt, cached, error=None):
        return RequestResult(agent, turn, start, first, end, end, 5, prompt, cached, True, error)

    rs = [req(0, 0, 0.0, 1.0, 2.0, 100, 0), req(1, 0, 0.0, 3.0, 4.0, 100, 60),
          req(0, 1, 2.5, 2.6, 3.0, 300, 200), req(1, 1, 4.0, 4.2, 5.0, 300, 240),
          RequestResult(2, 0, 0.0, error="HTTP 503: busy")]
    s = summarize_agents(rs, admitted_rows=2, abandoned=1)
    assert (s["requests"], s["errors"], s["abandoned"]) == (5, 1, 1)
    assert s["ttft_ms_first_p50"] == pytest.approx(2000.0)
    assert s["ttft_ms_first_p95"] == pytest.approx(2900.0)
    assert s["ttft_ms_later_p50"] == pytest.approx(150.0)
    assert s["cache_hit_ratio"] == pytest.approx(500 / 800, abs=1e-3)
    assert s["aggregate_tok_s"] == pytest.approx(20 / 5.0)
    assert s["error_samples"] == ["HTTP 503: busy"]


def test_no_ratio_where_a_side_failed_requests():
    """A contender that failed requests did less work: its ratio would read as a figure
    (mlx_lm.server died at a last turn on the H100 and answered the rest at once)."""
    def req(agent, turn, error=None):
        return RequestResult(agent, turn, 0.0, 1.0, 2.0, 2.0, 5, 100, 0, True, error)

    ok = summarize_agents([req(0, 0), req(0, 1)], admitted_rows=2)
    bad = summarize_agents([req(0, 0), RequestResult(0, 1, 0.0, error="HTTP 404: died")],
                           admitted_rows=2, abandoned=3)
    assert unequal([("self", ok), ("mlx_lm", ok)]) is None
    why = unequal([("self", ok), ("mlx_lm", bad)])
    assert why == "mlx_lm failed 1 of 2 requests (3 later turns not sent)"
    doc = {"target": {"kind": "self"}, "anchor": {"target": {"kind": "mlx_lm"}},
           "summary": ok, "ratios": None, "void": why,
           "label": {"batch": {"mode": "continuous", "max_rows": 2, "prefill_chunk": 64},
                     "cache": "ram", "model": {"dtype": "float32"}}}
    line = agents_line(doc, Path("bench.json"))
    assert f"| vs mlx_lm: void ({why}) |" in line and "agg x" not in line


def test_agents_against_self_and_mlx_lm(tmp_path):
    """Both contenders in one run, on the same conversations; later turns carry the reply
    and a tool output, so they are longer and mostly served from the prefix cache. The
    SSD tier's directory is fresh for the run and removed at its end."""
    from conftest import resolve_overrides

    from appliance.bench import run

    overrides = [*CPU, "cache=tiered"]
    plan = resolve_overrides(overrides)
    doc = run(plan, BenchConfig(**TINY), tmp_path, tuple(overrides))
    assert doc["workload"] == "agents" and doc["overrides"] == overrides
    assert doc["target"]["kind"] == "self" and doc["anchor"]["target"]["kind"] == "mlx_lm"
    ssd = Path(doc["target"]["ssd_path"])
    assert ssd.parent == tmp_path and not ssd.exists()  # made for the run, then removed
    for part in (doc, doc["anchor"]):
        s, reqs = part["summary"], part["requests"]
        assert (s["requests"], s["errors"], s["abandoned"]) == (4, 0, 0), s["error_samples"]
        assert sorted((r["client"], r["turn"]) for r in reqs) == [(0, 0), (0, 1), (1, 0),
                                                                 (1, 1)]
        assert all(r["completion_tokens"] == 4 for r in reqs)  # EOS banned
        by = {(r["client"], r["turn"]): r for r in reqs}
        for a in (0, 1):  # the reply and a tool output were appended
            assert by[a, 1]["prompt_tokens"] > by[a, 0]["prompt_tokens"] + 32
            assert by[a, 1]["start_s"] > by[a, 0]["end_s"]
        assert s["ttft_ms_first_p95"] > 0 and s["ttft_ms_later_p95"] > 0
        assert 0 < s["cache_hit_ratio"] < 1  # both servers reuse the shared prefix
    later = [r for r in doc["requests"] if r["turn"] == 1]
    assert all(r["cached_tokens"] >= 64 for r in later)  # at least the system prompt
    assert doc["void"] is None and set(doc["ratios"]) >= {"aggregate_tok_s", "ttft_ms_p95"}
    assert all(v > 0 for v in doc["ratios"].values())
    mem = doc["engine"]["memory"]  # MLX's own account, from the server's /stats
    assert mem["peak_bytes"] >= mem["active_bytes"] > 0 and mem["allocation_failures"] == 0
    assert "# memory GiB (MLX, after the run): active" in agents_text(doc)
    on_disk = json.loads((tmp_path / "bench.json").read_text())
    assert on_disk["label"]["bench"]["agents"] == 2 and on_disk["ratios"] == doc["ratios"]


def _children(pid: int) -> list[int]:
    kids = []
    for f in glob.glob(f"/proc/{pid}/task/*/children"):
        kids += [int(k) for k in Path(f).read_text().split()]
    return kids


def _server_port(pid: int) -> int | None:
    """The port a server child of the bench was told to listen on (None: another child)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return None
    for i, a in enumerate(argv):
        if a.startswith("server.port="):
            return int(a.split("=", 1)[1])
        if a == "--port":
            return int(argv[i + 1])
    return None


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # (it ended)
        return b""


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("target,sig", [("self", "SIGINT"), ("mlx_lm", "SIGINT"),
                                        ("self", "SIGTERM")])
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_the_server(tmp_path, target, sig):
    """SIGINT (or SIGTERM) in the middle of a long bench: the server it started is gone, its
    port is free, its SSD directory is removed, and the bench exits 130 (143), as a shell
    reports a process that signal ended."""
    cmd = [sys.executable, "-m", "appliance.cli", "mode=bench", "bench=agents", *CPU,
           *(["cache=tiered"] if target == "self" else []),  # (mlx_lm.server has no tiers)
           f"bench.target={target}", "bench.anchor=none", "bench.agents=2",
           "bench.turns=3", "bench.think_s=30", "bench.max_tokens=32",
           "bench.system_tokens=64", "bench.tool_tokens=32", "bench.warmup=0"]
    # (long by its agents' pauses: a workload past the context is refused before it runs)
    # a background job of a non-interactive shell inherits SIGINT ignored (POSIX), as would
    # the bench: start it with the default disposition, as a terminal's Ctrl-C finds it
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    server = port = None
    try:
        deadline = time.time() + 120
        while port is None or not _listening(port):
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
            assert time.time() < deadline, "the bench did not start its server"
            for kid in _children(proc.pid):
                if (p := _server_port(kid)) is not None:
                    server, port = kid, p
            time.sleep(0.2)
        time.sleep(2.0)  # in the middle of the conversations
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(timeout=60) == 128 + getattr(signal, sig)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not Path(f"/proc/{server}").exists()  # stopped and reaped, not orphaned
    assert not _listening(port)
    assert not glob.glob(str(tmp_path / "bench/*/ssd"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_while_the_anchor_runs_keeps_the_targets_figures(tmp_path):
    """Ctrl-C during mlx_lm.server's half threw away the appliance's finished half (a
    new-user walkthrough): bench.json now holds the target's figures, void says why there
    are no ratios, and the bench still stops with 130."""
    cmd = [sys.executable, "-m", "appliance.cli", "mode=bench", "bench=agents", *CPU,
           "bench.agents=2", "bench.turns=2", "bench.think_s=5", "bench.max_tokens=8",
           "bench.system_tokens=64", "bench.tool_tokens=32", "bench.warmup=0"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline, anchor = time.time() + 240, None
        while anchor is None or not _listening(_server_port(anchor) or 0):
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
            assert time.time() < deadline, "the anchor did not start"
            anchor = next((k for k in _children(proc.pid) if b"mlx_lm" in _cmdline(k)), None)
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        said = proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    [kept] = glob.glob(str(tmp_path / "bench/*/bench.json"))
    assert f"the target's own figures are in {kept}" in said
    doc = json.loads(Path(kept).read_text())
    assert doc["void"] == "interrupted while the anchor (mlx_lm) ran"
    assert doc["anchor"] is None and doc["ratios"] is None
    assert doc["summary"]["requests"] == 4 and doc["summary"]["errors"] == 0


def test_a_warm_up_burst_sends_one_first_turn_per_agent_before_the_timed_run(tmp_path):
    """With warm-up on, one untimed request per agent, as long as a first turn, goes out
    together (the full batch's long prefills and decode steps are compiled before the run,
    for each contender alike); the engine's own counts show it: EOS is banned, so every
    request runs to its max_tokens, and each burst request prefilled a whole system
    prompt of its own."""
    from conftest import resolve_overrides

    from appliance.bench import run
    from appliance.bench.agents import burst_tokens

    overrides = [*CPU, "cache=ram"]
    cfg = {**TINY, "warmup": 1, "agents": 3, "turns": 1, "anchor": "none"}
    plan = resolve_overrides(overrides)
    doc = run(plan, BenchConfig(**cfg), tmp_path, tuple(overrides))
    assert (doc["summary"]["requests"], doc["summary"]["errors"]) == (3, 0)
    assert doc["engine"]["tokens_generated"] == 4 + 3 * burst_tokens(3) + 3 * 4
    # each burst request missed the prefix cache (none primed another's, nor the run's
    # system prompt): misses = warm-up + burst + the run's first agent
    ram = doc["engine"]["cache"]["ram"]
    assert (ram["misses"], ram["hits"]) == (1 + 3 + 1, 2)
    from appliance.bench.agents import burst_messages, conversations
    from appliance.bench.prompts import load_tokenizer, model_dir

    tok = load_tokenizer(model_dir(plan))
    conv = conversations(tok, BenchConfig(**cfg))
    firsts = [burst_messages(conv, i)[0]["content"] for i in range(3)]
    assert all(len(tok.encode(f)) >= TINY["system_tokens"] for f in firsts)  # a first turn's
    assert len({f.splitlines()[0] for f in firsts}) == 3  # each opens with its own line


def test_an_anchor_that_fails_keeps_the_targets_figures(tmp_path):
    """mlx_lm.server refusing its arguments after the appliance was measured threw that
    measurement away (no bench.json) and exited 2, a plan error's code. Now bench.json keeps
    the target's figures with the reason there are no ratios, and the bench exits 1."""
    r = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "mode=bench", "bench=agents", *CPU,
         "bench.agents=2", "bench.turns=2", "bench.max_tokens=4", "bench.system_tokens=64",
         "bench.user_tokens=16", "bench.tool_tokens=32", "bench.think_s=0.02",
         "bench.warmup=0", "bench.progress=false", "bench.mlx_lm_args=--bogus-flag",
         "hydra.run.dir=out"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "appliance: the bench failed: RuntimeError: the anchor (mlx_lm) failed" in r.stderr
    doc = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert doc["summary"]["requests"] == 4 and doc["summary"]["aggregate_tok_s"] > 0
    assert doc["anchor"] is None and doc["ratios"] is None
    assert "--bogus-flag" in doc["void"]
    assert "# no ratios: the anchor (mlx_lm) failed" in r.stdout
