"""Who may call the API (issue 15, F11): an API key, no open non-loopback bind, no foreign
Host on a loopback bind, JSON bodies only, and a /v1/plan that leaks no paths."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from conftest import app_for, resolve_overrides

from appliance.plan import PlanError

KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def keyed():
    with app_for([f"server.api_key={KEY}"]) as (plan, engine, url):
        yield plan, url


def test_every_endpoint_but_health_needs_the_key(keyed):
    plan, url = keyed
    body = {"model": plan.model.id, "prompt": "x", "max_tokens": 2}
    for method, path in (("GET", "/v1/models"), ("GET", "/v1/plan"), ("GET", "/stats"),
                         ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")):
        r = httpx.request(method, f"{url}{path}", json=body, timeout=30)
        assert r.status_code == 401, path
        assert r.json()["error"]["code"] == "invalid_api_key"
        wrong = httpx.request(method, f"{url}{path}", json=body, timeout=30,
                              headers={"Authorization": "Bearer sk-test-0123456788"})
        assert wrong.status_code == 401, path
    assert httpx.get(f"{url}/health").status_code == 200
    ok = httpx.post(f"{url}/v1/completions", json=body, headers={"x-api-key": KEY}, timeout=30)
    assert ok.status_code == 200  # the Anthropic clients' header


def test_the_openai_client_with_the_key_is_served(keyed):
    plan, url = keyed
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    r = client.completions.create(model=plan.model.id, prompt="def ", max_tokens=3)
    assert r.usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0).models.list()
    served = httpx.get(f"{url}/v1/plan", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert served["server"]["api_key"] == "<set>" and KEY not in str(served)


def test_a_non_loopback_bind_needs_a_key_or_says_it_does_not():
    with pytest.raises(PlanError, match="server.host=0.0.0.0 serves beyond this machine"):
        resolve_overrides(["server.host=0.0.0.0"])
    assert resolve_overrides(["server.host=0.0.0.0", f"server.api_key={KEY}"])
    assert resolve_overrides(["server.host=0.0.0.0", "server.allow_unauthenticated=true"])
    with pytest.raises(PlanError, match="server.api_key is empty"):
        resolve_overrides(["server.api_key=' '"])
    # where it permits nothing, it is refused rather than taken
    with pytest.raises(PlanError, match="has no effect on the loopback host 127.0.0.1"):
        resolve_overrides(["server.allow_unauthenticated=true"])
    with pytest.raises(PlanError, match="has no effect beside server.api_key"):
        resolve_overrides(["server.host=0.0.0.0", f"server.api_key={KEY}",
                           "server.allow_unauthenticated=true"])


def test_a_foreign_host_header_is_refused_on_a_loopback_bind(server):
    r = httpx.get(f"{server}/v1/models", headers={"Host": "attacker.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "foreign_host"
    port = server.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LocalHost"):
        assert httpx.get(f"{server}/v1/models", headers={"Host": host}).status_code == 200


def test_post_bodies_must_be_json(server, plan):
    body = f'{{"model":"{plan.model.id}","prompt":"x","max_tokens":2}}'
    r = httpx.post(f"{server}/v1/completions", content=body,
                   headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"


ABSOLUTE = re.compile(r"(?<![\w.~])/(?:[\w.+-]+/)+")


def test_an_open_plan_shows_no_absolute_paths(server):
    served = httpx.get(f"{server}/v1/plan")
    assert served.json()["model"]["path"] == "tiny" and served.json()["server"]["api_key"] is None
    assert not ABSOLUTE.search(served.text), served.text  # (on CPU: the BLAS library's too)
    assert not ABSOLUTE.search(httpx.get(f"{server}/stats").text)
    # the SSD tier's and the draft's paths too; a keyed reader sees them whole
    plan = resolve_overrides(["draft=mtp", "cache=tiered", "cache.ssd.path=/tmp/x/ssd"])
    assert not ABSOLUTE.search(str(plan.to_dict(public=True)))
    assert plan.to_dict(public=True)["cache"]["ssd_path"] == "ssd"
    assert plan.to_dict()["cache"]["ssd_path"] == "/tmp/x/ssd"


def test_a_key_from_an_unset_environment_variable_is_a_plan_error(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "APPLIANCE_API_KEY"}
    r = subprocess.run([sys.executable, "-m", "appliance.cli", "mode=plan",
                        "server.api_key=${oc.env:APPLIANCE_API_KEY}"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "APPLIANCE_API_KEY' not found" in r.stderr
    r = subprocess.run([sys.executable, "-m", "appliance.cli", "mode=plan", "server.host=0.0.0.0",
                        "server.api_key=${oc.env:APPLIANCE_API_KEY}"], cwd=tmp_path,
                       env={**env, "APPLIANCE_API_KEY": KEY}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "api_key: <set>" in r.stdout and KEY not in r.stdout
