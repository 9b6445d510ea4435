"""The process's life as a supervisor sees it, through the real `appliance` command in a
subprocess: SIGTERM drains and exits 0 with no traceback; a failed engine exits non-zero."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest
from conftest import Process

from appliance.api.errors import SHUTTING_DOWN
from appliance.serve import EXIT_ENGINE_FAILED

pytestmark = pytest.mark.slow
BAN_EOS = {"0": -100, "2": -100}  # the embedded model's EOS ids: every request runs long


def _stream(url: str, out: dict, started: threading.Event) -> None:
    """One long streaming chat; records the status and every data event."""
    body = {"model": "appliance-tiny", "stream": True, "max_tokens": 3000,
            "messages": [{"role": "user", "content": "def main():"}], "logit_bias": BAN_EOS}
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
            out["status"] = r.status_code
            if r.status_code != 200:
                out["body"] = json.loads(r.read())
                return
            out["events"] = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    out["events"].append(line[6:])
                    started.set()
    except Exception as e:  # a cut connection: what must not happen
        out["exception"] = repr(e)


def _ended_properly(out: dict) -> str:
    """'finished', 'error event' or '503', or raise: each stream must end with a final event."""
    assert "exception" not in out, out
    if out["status"] == 503:
        assert out["body"]["error"]["code"] == "shutting_down", out
        return "503"
    events = out["events"]
    assert out["status"] == 200 and events[-1] == "[DONE]", out
    last = json.loads(events[-2])
    if "error" in last:
        assert last["error"]["message"] == SHUTTING_DOWN, last
        return "error event"
    assert last["choices"][0]["finish_reason"] in ("stop", "length"), last
    return "finished"


def test_sigterm_drains_ends_every_stream_with_a_final_event_and_exits_0(tmp_path):
    """Issue 15, F6: SIGTERM during 10 streams cut 2 queued ones with no final event, and
    uvicorn's timeout cancelled tasks with CancelledError tracebacks in the log."""
    drain = 2.0
    p = Process(tmp_path, f"server.drain_seconds={drain}", "batch.max_rows=2")
    outs = [{} for _ in range(5)]
    started = threading.Event()
    threads = [threading.Thread(target=_stream, args=(p.url, o, started)) for o in outs]
    for t in threads:
        t.start()
    assert started.wait(60), p.stderr()
    time.sleep(0.5)  # the others are queued behind max_rows=2 by now
    t0 = time.perf_counter()
    p.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    ended = time.perf_counter() - t0
    rc = p.wait(30)
    log = p.stderr()
    kinds = [_ended_properly(o) for o in outs]
    assert ended < drain + 5, f"streams took {ended:.1f}s to end (drain {drain}s)"
    assert "error event" in kinds and "503" in kinds, kinds  # running and queued ones
    assert rc == 0, log
    assert "Traceback" not in log and "Cancel" not in log, log
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{p.url}/health", timeout=2)


def test_sigterm_with_nothing_in_flight_exits_at_once(tmp_path):
    p = Process(tmp_path, "server.drain_seconds=30")
    t0 = time.perf_counter()
    p.proc.send_signal(signal.SIGTERM)
    assert p.wait(20) == 0
    assert time.perf_counter() - t0 < 10  # not the drain time: nothing was in flight
    assert "Traceback" not in p.stderr()


INJECT = """
from appliance.engine.continuous import ContinuousScheduler

def broken(self, *args):
    raise RuntimeError("injected fault")

ContinuousScheduler.step = broken
ContinuousScheduler.fail_all = broken
"""


def test_a_failed_engine_exits_non_zero_for_its_supervisor(tmp_path):
    """Issue 15, item 2: once the engine cannot go on, /health answers 503, requests get an
    error rather than hanging, and the process exits EXIT_ENGINE_FAILED (not 0: a supervisor
    such as launchd's KeepAlive or systemd's Restart=on-failure restarts it)."""
    p = Process(tmp_path, inject=INJECT)
    r = httpx.post(f"{p.url}/v1/completions", timeout=60,
                   json={"model": "appliance-tiny", "prompt": "x", "max_tokens": 4})
    assert r.status_code in (500, 503) and "injected fault" in r.json()["error"]["message"]
    rc = p.wait(30)
    assert rc == EXIT_ENGINE_FAILED, p.stderr()
    assert "the engine has failed (RuntimeError: injected fault); stopping with exit code" \
        in p.stderr()


def test_a_port_in_use_is_a_setting_to_change_not_a_failed_engine(tmp_path):
    """Exit 2 with a PlanError naming server.port, before the model loads; it exited 3, the
    code README gives a failed engine (for a supervisor to restart it, which cannot help)."""
    import socket
    import subprocess

    from conftest import _command

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run(_command(f"server.port={port}"), cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"server.port={port}: cannot listen on 127.0.0.1:{port}" in r.stderr
    assert "plan fp_" not in r.stderr  # (logged as the model starts loading: it did not)


def test_a_request_a_graceful_stop_ends_is_a_warning_not_an_error(caplog):
    """The documented end of a drain (503 shutting_down) and a memory shortfall (503, retry)
    are expected outcomes a client retries: a warning in the log; any other failure an
    error (a walkthrough read an ERROR line on every graceful stop)."""
    import logging

    from appliance.api.errors import SHUTTING_DOWN, generation_failed
    from appliance.engine.memory import OUT_OF_MEMORY

    with caplog.at_level(logging.WARNING, logger="appliance.api"):
        codes = [generation_failed(e).status for e in
                 (SHUTTING_DOWN, f"{OUT_OF_MEMORY}: 1 GiB more", "boom")]
    assert codes == [503, 503, 500]
    assert [r.levelno for r in caplog.records] == [logging.WARNING] * 2 + [logging.ERROR]
