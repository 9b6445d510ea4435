"""The batched service over HTTP: concurrency, refusals, /stats, logprobs."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import httpx
import openai
import pytest
from conftest import app_for, golden

from appliance import oracle


def test_concurrent_clients_match_batch_generator(server, plan, engine):
    """B=4 concurrent openai clients, compared token for token with BatchGenerator's
    static B=4 schedule (the rows' outputs do not depend on arrival order here: each
    row's tokens are checked against the golden of its own prompt)."""
    gold = golden("batch-tiny")
    prompts, want = gold["prompts"], gold["schedules"]["static-4"]["tokens"]
    client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0)

    async def one(r):
        resp = await client.completions.create(model=plan.model.id, prompt=prompts[r],
                                               max_tokens=oracle.BATCH_ROWS[r][1])
        return r, resp

    async def fleet():
        return await asyncio.gather(*(one(r) for r in "abcd"))

    for r, resp in asyncio.run(fleet()):
        assert resp.choices[0].text == engine.tokenizer.decode(want[r])
        assert resp.usage.completion_tokens == len(want[r])


def test_stats_during_load(server, plan):
    body = {"model": plan.model.id, "prompt": "def ", "max_tokens": 60}
    seen = []
    done = threading.Event()

    def poll():
        while not done.is_set():
            seen.append(httpx.get(f"{server}/stats").json())
            time.sleep(0.01)

    t = threading.Thread(target=poll)
    t.start()

    async def go():
        async with httpx.AsyncClient(timeout=60) as c:
            await asyncio.gather(*(c.post(f"{server}/v1/completions", json=body)
                                   for _ in range(3)))

    asyncio.run(go())
    done.set()
    t.join()
    last = httpx.get(f"{server}/stats").json()
    for key in ("mode", "max_rows", "active_rows", "pending_rows", "submitted_rows", "kv_bytes",
                "kv_budget_bytes", "tokens_generated", "prefill_seconds", "decode_seconds"):
        assert key in last
    assert last["mode"] == "continuous" and last["max_rows"] == plan.batch.max_rows
    assert last["kv_budget_bytes"] == plan.batch.kv_budget_bytes
    assert max(s["active_rows"] for s in seen) >= 2  # rows really shared the engine
    assert max(s["kv_bytes"] for s in seen) > 0
    assert last["active_rows"] == 0 and last["prefill_seconds"] > 0
    assert last["decode_seconds"] > 0


def test_over_budget_is_400():
    with app_for(["batch.max_rows=1", "batch.kv_budget=2MiB"]) as (plan, engine, url):
        # the plan caps the context at what one row may hold in the budget (in 256s)
        fits = 2 * 1024**2 // plan.kv.bytes_per_token  # tokens one row may hold
        assert plan.server.max_context == fits // 256 * 256 < fits
        r = httpx.post(f"{url}/v1/completions", json={
            "model": plan.model.id, "prompt": "def ", "max_tokens": plan.server.max_context})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert "server.max_context" in err["message"] and err["param"] == "prompt"
        assert err["code"] == "context_length_exceeded"


@pytest.mark.parametrize("held_by", ["max_rows", "kv_budget"])
def test_a_full_queue_is_429(held_by):
    """One long row runs; the second waits for a row, held back by the row count or, with
    rows free, by the KV budget: either way it fills batch.max_queue=1 and shows in
    pending_rows and the queue metrics (held back by the budget beside a prefix cache, it
    counted as admitted, and the queue took more than max_queue)."""
    rows = ["batch.max_rows=1"] if held_by == "max_rows" else ["batch.max_rows=4", "cache=ram"]
    with app_for([*rows, "batch.max_queue=1", "batch.kv_budget=2MiB"]) as (plan, engine, url):
        no_eos = {str(t): -100 for t in engine.eos_ids}
        long = {"model": plan.model.id, "prompt": "def ",
                "max_tokens": plan.server.max_context - 16, "logit_bias": no_eos}
        results = []

        def send():
            results.append(httpx.post(f"{url}/v1/completions", json=long, timeout=120))

        workers = [threading.Thread(target=send) for _ in range(2)]
        workers[0].start()  # the only row that fits
        _wait_for(lambda: engine.stats()["active_rows"] == 1)
        workers[1].start()  # waits for a row: the queue is now full
        _wait_for(lambda: engine.stats()["submitted_rows"] == 2)
        time.sleep(0.2)  # (a step or more: it is still not admitted)
        stats = engine.stats()
        assert stats["active_rows"] == 1 and stats["pending_rows"] == 1
        assert "appliance_queue_depth 1.0" in httpx.get(f"{url}/metrics").text
        third = httpx.post(f"{url}/v1/completions", json=long, timeout=30)
        assert third.status_code == 429, third.text
        assert third.headers["retry-after"] == "1"
        assert third.json()["error"]["type"] == "rate_limit_error"
        for w in workers:
            w.join()
        assert [r.status_code for r in results] == [200, 200]  # the queued one was served
        waited = float(re.search(r"^appliance_queue_wait_seconds_sum (\S+)$",
                                 httpx.get(f"{url}/metrics").text, re.M).group(1))
        assert waited >= 0.2  # the second request's wait, counted until it had its row


def _wait_for(cond, timeout=30):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.01)


def test_logprobs_over_http(client, plan):
    r = client.chat.completions.create(model=plan.model.id, max_tokens=4, logprobs=True,
                                       top_logprobs=2,
                                       messages=[{"role": "user", "content": "import os"}])
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
    assert "".join(c.token for c in content) == r.choices[0].message.content
    c = client.completions.create(model=plan.model.id, prompt="def ", max_tokens=3, logprobs=1)
    assert len(c.choices[0].logprobs.token_logprobs) == 3
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=plan.model.id, max_tokens=2, top_logprobs=2,
                                       messages=[{"role": "user", "content": "x"}])


def test_a_forward_error_is_a_500_and_serving_goes_on(monkeypatch):
    with app_for([]) as (plan, engine, url):
        model_cls = type(engine.model)
        real = model_cls.__call__
        body = {"model": plan.model.id, "prompt": "def ", "max_tokens": 4}

        def broken(self, *a, **kw):
            raise RuntimeError("device lost")

        monkeypatch.setattr(model_cls, "__call__", broken)
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        s = httpx.post(f"{url}/v1/completions", json={**body, "stream": True}, timeout=60)
        monkeypatch.setattr(model_cls, "__call__", real)
        assert r.status_code == 500 and "device lost" in r.json()["error"]["message"]
        assert r.json()["error"]["type"] == "server_error"
        assert s.status_code == 500 and "device lost" in s.json()["error"]["message"]
        ok = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
