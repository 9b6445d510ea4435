"""/health never waits behind a request (issue 15, item 7): a prompt too long to serve is
refused before tokenizing when its size alone proves it, and one that must be tokenized to
know is tokenized off the event loop."""

from __future__ import annotations

import threading
import time

import httpx


def _poll_health(url: str, stop: threading.Event, latencies: list[float]) -> None:
    with httpx.Client(timeout=10) as c:
        while not stop.is_set():
            t = time.perf_counter()
            assert c.get(f"{url}/health").status_code == 200
            latencies.append(time.perf_counter() - t)
            time.sleep(0.01)


def test_health_answers_within_100ms_while_large_prompts_are_refused(server, plan):
    # ~300 KB: under the size that proves it too long, so it is tokenized in full (~200k
    # tokens, most of a second on a CPU), then refused for the context
    tokenized = "x = 1\n" * 50_000
    refused_at_once = "def f(x):\n    return x\n" * 200_000  # 5 MB
    latencies: list[float] = []
    stop = threading.Event()
    poller = threading.Thread(target=_poll_health, args=(server, stop, latencies))
    poller.start()
    time.sleep(0.2)
    try:
        for prompt in (tokenized, refused_at_once, tokenized):
            before = len(latencies)
            r = httpx.post(f"{server}/v1/completions", timeout=60,
                           json={"model": plan.model.id, "prompt": prompt, "max_tokens": 4})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "context_length_exceeded"
            if prompt is tokenized:  # /health was answered while it was tokenized
                assert len(latencies) - before >= 3
    finally:
        stop.set()
        poller.join()
    assert len(latencies) >= 10
    assert max(latencies) < 0.1, f"/health took {max(latencies) * 1000:.0f} ms at worst"
