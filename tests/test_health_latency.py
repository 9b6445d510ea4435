"""/health never waits behind a request (issue 15, item 7): a prompt too long to serve is
refused before tokenizing when its size alone proves it, and one that must be tokenized to
know is tokenized off the event loop.

The server runs in its own process (the real `appliance` command, as in production): here, with
some 400k objects on the heap after the modules before this one, a full garbage collection
takes 300-400 ms and stops every thread, an in-process server's event loop included (464 ms
once on CI). The server's own stay short: serve() freezes what its startup built."""

from __future__ import annotations

import gc
import signal
import threading
import time

import httpx
import pytest
from conftest import Process

pytestmark = pytest.mark.slow


def _poll_health(url: str, stop: threading.Event, latencies: list[float]) -> None:
    with httpx.Client(timeout=10) as c:
        while not stop.is_set():
            t = time.perf_counter()
            assert c.get(f"{url}/health").status_code == 200
            latencies.append(time.perf_counter() - t)
            time.sleep(0.01)


@pytest.fixture
def own_server(tmp_path):
    p = Process(tmp_path)
    yield p.url
    p.proc.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0, p.stderr()


def test_health_answers_within_100ms_while_large_prompts_are_refused(own_server):
    # ~300 KB: under the size that proves it too long, so it is tokenized in full (~200k
    # tokens, most of a second on a CPU), then refused for the context
    tokenized = "x = 1\n" * 50_000
    refused_at_once = "def f(x):\n    return x\n" * 200_000  # 5 MB
    latencies: list[float] = []
    stop = threading.Event()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # this process's collections would stall the poller, not the server
    poller = threading.Thread(target=_poll_health, args=(own_server, stop, latencies))
    poller.start()
    time.sleep(0.2)
    try:
        for prompt in (tokenized, refused_at_once, tokenized):
            before = len(latencies)
            r = httpx.post(f"{own_server}/v1/completions", timeout=60,
                           json={"model": "appliance-tiny", "prompt": prompt, "max_tokens": 4})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "context_length_exceeded"
            if prompt is tokenized:  # /health was answered while it was tokenized
                assert len(latencies) - before >= 3
    finally:
        stop.set()
        poller.join()
        if gc_was_enabled:
            gc.enable()
    assert len(latencies) >= 10
    assert max(latencies) < 0.1, f"/health took {max(latencies) * 1000:.0f} ms at worst"
