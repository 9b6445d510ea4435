"""GET /metrics (issue 15, item 4): scraped from a live server and parsed with
prometheus-client's own parser."""

from __future__ import annotations

import httpx
import pytest
from conftest import app_for
from prometheus_client.parser import text_string_to_metric_families

from appliance.api.metrics import MAX_AGENTS, Metrics


@pytest.fixture(scope="module")
def live():
    with app_for(["cache=ram"]) as (plan, engine, url):
        yield plan, engine, url


def _scrape(url: str) -> dict:
    """{(sample name, frozenset(labels)): value}"""
    r = httpx.get(f"{url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    # each parameter once (Prometheus's Go parser refuses a repeated one), the format's version
    params = [p.split("=")[0].strip() for p in r.headers["content-type"].split(";")[1:]]
    assert sorted(params) == ["charset", "version"], r.headers["content-type"]
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def _get(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_requests_tokens_latency_and_engine_state_are_exported(live):
    plan, engine, url = live
    before = _scrape(url)
    chat = {"model": plan.model.id, "max_tokens": 5, "user": "planner",
            "messages": [{"role": "system", "content": "You write Python. " * 20},
                         {"role": "user", "content": "def add(a, b):"}]}
    usages = []
    for _ in range(2):  # the second one hits the prefix cache
        r = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60)
        assert r.status_code == 200, r.text
        usages.append(r.json()["usage"])
    with httpx.stream("POST", f"{url}/v1/completions", timeout=60,
                      headers={"X-Agent-Id": "coder-1"},
                      json={"model": plan.model.id, "prompt": "import os\n", "max_tokens": 4,
                            "stream": True, "stream_options": {"include_usage": True}}) as s:
        assert s.status_code == 200
        list(s.iter_lines())
    bad = httpx.post(f"{url}/v1/chat/completions", json={**chat, "top_k": 10**6}, timeout=30)
    assert bad.status_code == 400
    # a body that fails validation is refused before its `user` is read
    unread = httpx.post(f"{url}/v1/chat/completions", json={**chat, "temperature": 9})
    assert unread.status_code == 400
    missing = httpx.post(f"{url}/v1/completions", json={"model": "nope", "prompt": "x"})
    assert missing.status_code == 404

    after = _scrape(url)

    def delta(name, **labels):
        return _get(after, name, **labels) - _get(before, name, **labels)

    chat_ep, comp_ep = "/v1/chat/completions", "/v1/completions"
    assert delta("appliance_requests_total", endpoint=chat_ep, status="200",
                 agent="planner") == 2
    assert delta("appliance_requests_total", endpoint=chat_ep, status="400",
                 agent="planner") == 1
    assert delta("appliance_requests_total", endpoint=chat_ep, status="400",
                 agent="anonymous") == 1
    assert delta("appliance_requests_total", endpoint=comp_ep, status="200",
                 agent="coder-1") == 1
    assert delta("appliance_requests_total", endpoint=comp_ep, status="404",
                 agent="anonymous") == 1
    assert delta("appliance_prompt_tokens_total", agent="planner") == \
        sum(u["prompt_tokens"] for u in usages)
    assert delta("appliance_generated_tokens_total", agent="planner") == \
        sum(u["completion_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached > 0 and delta("appliance_cached_prompt_tokens_total", agent="planner") == cached
    assert delta("appliance_generated_tokens_total", agent="coder-1") >= 1
    assert delta("appliance_time_to_first_token_seconds_count", endpoint=chat_ep) == 2
    assert delta("appliance_time_to_first_token_seconds_count", endpoint=comp_ep) == 1
    assert delta("appliance_time_per_output_token_seconds_count", endpoint=chat_ep) == \
        sum(u["completion_tokens"] > 1 for u in usages)
    assert delta("appliance_queue_wait_seconds_count") == 3
    assert _get(after, "appliance_queue_depth") == 0
    assert _get(after, "appliance_active_rows") == 0
    assert ("appliance_kv_bytes", frozenset()) in after
    assert _get(after, "appliance_kv_budget_bytes") == engine.budget.budget
    assert delta("appliance_prefix_cache_hits_total", tier="ram") >= 1
    assert _get(after, "appliance_prefix_cache_bytes", tier="ram") > 0
    assert _get(after, "appliance_prefix_cache_entries", tier="ram") > 0


def test_agent_labels_are_bounded():
    class Engine:
        scheduler = None

    m = Metrics(Engine())
    names = [m.agent(f"agent-{i}") for i in range(MAX_AGENTS + 5)]
    assert names[:MAX_AGENTS] == [f"agent-{i}" for i in range(MAX_AGENTS)]
    assert set(names[MAX_AGENTS:]) == {"other"}
    assert m.agent("agent-0") == "agent-0"  # known ones keep their label
    assert m.agent(None) == "anonymous"
    assert Metrics(Engine()).agent("x" * 500) == "x" * 64


def test_metrics_need_the_key_when_there_is_one():
    with app_for(["server.api_key=secret"]) as (_, _, url):
        assert httpx.get(f"{url}/metrics").status_code == 401
        ok = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer secret"})
        assert ok.status_code == 200 and "appliance_requests_total" in ok.text


def test_anthropic_and_responses_requests_count_their_tokens_and_ttft(live):
    plan, engine, url = live
    before = _scrape(url)
    m = httpx.post(f"{url}/v1/messages", timeout=60, json={
        "model": plan.model.id, "max_tokens": 4, "metadata": {"user_id": "reviewer"},
        "messages": [{"role": "user", "content": "def add(a, b):"}]})
    assert m.status_code == 200, m.text
    r = httpx.post(f"{url}/v1/responses", timeout=60, json={
        "model": plan.model.id, "max_output_tokens": 3, "user": "reviewer",
        "input": "import os\n"})
    assert r.status_code == 200, r.text
    after = _scrape(url)

    def delta(name, **labels):
        return _get(after, name, **labels) - _get(before, name, **labels)

    generated = m.json()["usage"]["output_tokens"] + r.json()["usage"]["output_tokens"]
    assert delta("appliance_generated_tokens_total", agent="reviewer") == generated > 0
    assert delta("appliance_time_to_first_token_seconds_count", endpoint="/v1/messages") == 1
    assert delta("appliance_time_to_first_token_seconds_count", endpoint="/v1/responses") == 1
