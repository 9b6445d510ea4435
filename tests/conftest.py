"""Shared fixtures: the embedded model's plan, one started engine, one real server in a thread,
and the real `appliance` command in its own process (`Process`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import appliance  # noqa: F401  (BLAS preload before mlx)
from appliance.config.hydra_setup import conf_dir, setup


def compose(overrides: list[str] | None = None):
    """The DictConfig the CLI would build for these overrides (Hydra's compose API)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    setup()
    with initialize_config_dir(str(conf_dir()), version_base="1.3"):
        return hydra_compose("config", overrides=overrides or [])


def resolve_overrides(overrides: list[str] | None = None):
    from appliance.cli import _profiles
    from appliance.plan import resolve

    overrides = overrides or []
    return resolve(compose(overrides), profiles=_profiles(overrides))


def golden(name: str) -> dict:
    """goldens/<this backend>/<name>.json; skip (not fail) the calling test where no layer
    exists for it yet. Call it inside a test or fixture, never at import: a backend without
    goldens (Metal) still runs the tests that compare against live mlx-lm."""
    import json

    from appliance import oracle

    path = oracle.golden_path(name)
    if not path.exists():
        pytest.skip(f"no goldens for backend {oracle.backend()!r}: run `just goldens`")
    return json.loads(path.read_text())


def golden_cases(name: str = "tiny") -> dict[str, dict]:
    """The golden cases of `name` by case name (skips the test without goldens)."""
    return {c["name"]: c for c in golden(name)["cases"]}


def pytest_generate_tests(metafunc):
    """`loaded` runs over the module's MODELS (default: oracle.BATCH_MODELS)."""
    if "loaded" in metafunc.fixturenames and not hasattr(metafunc.module, "loaded"):
        from appliance import oracle

        names = getattr(metafunc.module, "MODELS", oracle.BATCH_MODELS)
        metafunc.parametrize("loaded", names, indirect=True, scope="module")


@pytest.fixture(scope="module")
def loaded(request):
    """(name, model, tokenizer): a test model in float32, one per name in MODELS."""
    from appliance import oracle

    model, tok = oracle.load(oracle.model_path(request.param), "float32")
    return request.param, model, tok


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What the serial goldens (goldens/<backend>/tiny.json) were recorded at: the embedded
# model as stored (bfloat16), every prompt prefilled from scratch, up to 8 rows (B=4 parity
# runs them together). The defaults moved on
# (float32 on Linux CPU, a RAM prefix cache); the oracle fixtures pin what they compare.
ORACLE_PIN = ["model.dtype=bfloat16", "cache=none", "batch.max_rows=8"]


@pytest.fixture(scope="session")
def plan():
    return resolve_overrides([f"server.port={free_port()}", *ORACLE_PIN])


@pytest.fixture(scope="session")
def engine(plan):
    """The default engine (batch=continuous)."""
    from appliance.engine import build_engine

    eng = build_engine(plan)
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def serial_engine():
    from appliance.engine import build_engine

    eng = build_engine(resolve_overrides(["batch=serial", "model.dtype=bfloat16"]))
    yield eng
    eng.stop()


@pytest.fixture(params=["continuous", "serial"])
def any_engine(request):
    """Each engine mode in turn: B=1 through either must equal the serial oracle."""
    return request.getfixturevalue("engine" if request.param == "continuous" else "serial_engine")


@contextlib.contextmanager
def serving(plan, engine):
    """The real app on a real socket (uvicorn in a thread). Yields the base URL."""
    import uvicorn

    from appliance.api import create_app

    cfg = uvicorn.Config(create_app(plan, engine), host="127.0.0.1", port=plan.server.port,
                         log_level="warning")
    srv = uvicorn.Server(cfg)
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.time() + 30
    while not srv.started:
        assert time.time() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{plan.server.port}"
    finally:
        srv.should_exit = True
        t.join(timeout=10)


@contextlib.contextmanager
def app_for(overrides: list[str]):
    """A plan, its engine and its server, for tests that need other settings."""
    from appliance.engine import build_engine

    plan = resolve_overrides([f"server.port={free_port()}", *overrides])
    engine = build_engine(plan)
    try:
        with serving(plan, engine) as url:
            yield plan, engine, url
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def server(plan, engine):
    with serving(plan, engine) as url:
        yield url


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def run_engine(engine, request):
    """Submit one request and collect (token ids, Finished) from the engine."""
    from appliance.engine import Finished

    async def go():
        handle = engine.submit(request)
        toks = []
        async for ev in handle:
            if isinstance(ev, Finished):
                return toks, ev
            toks.append(ev.id)

    return asyncio.run(go())


def _command(*overrides: str, inject: str | None = None) -> list[str]:
    """The `appliance` console script (or, with `inject`, the same main() after some code)."""
    if inject is None:
        exe = shutil.which("appliance", path=str(Path(sys.executable).parent))
        head = [exe] if exe else [sys.executable, "-m", "appliance.cli"]
        return [*head, *overrides]
    code = f"{inject}\nimport sys\nfrom appliance.cli import main\nsys.argv[0] = 'appliance'\n" \
           "main()"
    return [sys.executable, "-c", code, *overrides]


class Process:
    """The real `appliance` command in its own process, serving once /health answers."""

    def __init__(self, tmp: Path, *overrides: str, inject: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "stderr.log"
        self.proc = subprocess.Popen(
            _command(f"server.port={self.port}", *overrides, inject=inject), cwd=tmp,
            stdout=subprocess.DEVNULL, stderr=self.log.open("w"),
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.time() + 120
        while True:
            assert self.proc.poll() is None, f"the server exited early:\n{self.stderr()}"
            assert time.time() < deadline, f"the server did not start:\n{self.stderr()}"
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def stderr(self) -> str:
        return self.log.read_text()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"still running after {timeout}s:\n{self.stderr()}") from None
