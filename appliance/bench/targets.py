"""The servers a workload runs against: this plan in-process, or mlx_lm.server.

Both are started here and stopped here; an `http://` target is someone else's.
"""

from __future__ import annotations

import contextlib
import gc
import json
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from appliance import _mlx_env
from appliance.bench.client import Endpoint
from appliance.plan import ExecutionPlan

READY_TIMEOUT_S = 300.0  # a large model loads slowly; a crashed server is seen at once


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_NOT_FOR_THE_SERVER = ("mode", "bench", "tune", "hydra", "server.port", "server.host",
                       "server.log_level")


@contextlib.contextmanager
def appliance_process(plan: ExecutionPlan, overrides: list[str], log_path: Path) -> Iterator[str]:
    """`appliance` serving this plan in its own process, as mlx_lm.server runs in its own:
    the benchmark's clients then share no interpreter (no GIL) with the engine."""
    port = free_port()
    def ours(o: str) -> bool:
        key = o.lstrip("+~").split("=", 1)[0]
        return any(key == k or key.startswith(k + ".") for k in _NOT_FOR_THE_SERVER)

    keep = [o for o in overrides if not ours(o)]
    cmd = [sys.executable, "-m", "appliance.cli", *keep, "mode=serve",
           f"server.port={port}", "server.log_level=warning"]
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + READY_TIMEOUT_S
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"appliance exited with {proc.returncode}; see {log_path}")
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"appliance did not answer on {url}; see {log_path}")
                time.sleep(0.2)
            fp = httpx.get(f"{url}/v1/plan", timeout=10).json()["fingerprint"]
            if fp != plan.fingerprint:
                raise RuntimeError(f"served plan {fp} is not the benchmarked {plan.fingerprint}")
            yield url
        finally:
            stop(proc, 300)  # SIGTERM: uvicorn shuts down, pending SSD writes finish


def stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM, then SIGKILL after `grace_s` or on a second Ctrl-C: a bench never leaves
    its server running (the terminal's Ctrl-C may already have stopped it)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except KeyboardInterrupt:  # a second Ctrl-C: no graceful exit, but no orphan either
        proc.kill()
        proc.wait()
        raise


def export_dir(plan: ExecutionPlan, src: Path) -> Path:
    """A copy of the model stored in the plan's compute dtype, for mlx_lm.server.

    mlx_lm.server serves weights in their stored dtype; the appliance casts them
    to plan.model.dtype (and may hold quantized ones dense). Comparing float32 against
    bf16, or dense against quantized matmuls, would measure the weights, not the server,
    so mlx-lm gets the same weights already cast (or dense). Cached per
    fingerprint (which covers model and dtype); written to a temp dir, then renamed.
    """
    import mlx.core as mx
    from mlx_lm.utils import save_model

    from appliance.oracle import load

    out = Path("~/.cache/appliance/export").expanduser() / plan.fingerprint
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(f"{out.name}.tmp-{time.time_ns()}")
    model, _ = load(str(src), plan.model.dtype, plan.model.dequantized)
    save_model(tmp, model)
    del model
    gc.collect()
    mx.clear_cache()
    for f in src.iterdir():  # tokenizer, chat template, generation config, code
        if f.is_file() and f.suffix != ".safetensors" and f.name not in (
                "config.json", "model.safetensors.index.json"):
            shutil.copy2(f, tmp / f.name)
    config = json.loads((src / "config.json").read_text())
    config["torch_dtype"] = plan.model.dtype
    if plan.model.dequantized:  # stored dense: mlx_lm must not build quantized layers
        config.pop("quantization", None)
        config.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    try:
        tmp.rename(out)
    except OSError:  # another run exported it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _server_flags() -> str:
    """This mlx-lm version's `mlx_lm.server --help` (flags differ between versions)."""
    r = subprocess.run([sys.executable, "-m", "mlx_lm.server", "--help"], capture_output=True,
                       text=True, timeout=120)
    return r.stdout


MATCHED = ("--decode-concurrency", "--prompt-concurrency", "--prefill-step-size")


# What mlx_lm.server runs first: appliance's BLAS, not its MLX settings (appliance/_mlx_env.py)
BOOT = "import appliance, runpy; appliance._mlx_env.undo(); "


def mlx_lm_command(plan: ExecutionPlan, model_path: Path, port: int, extra: str = "",
                   matched: tuple[str, ...] = MATCHED) -> list[str]:
    """mlx_lm.server with this plan's batch width and prefill chunk, where it has the flags
    (`matched`: which of them; the others keep mlx_lm's defaults).

    It is started through `import appliance` so it binds the same BLAS as the
    appliance does (appliance/_blas.py); otherwise Linux CPU runs would compare
    OpenBLAS against the reference BLAS. The MLX settings appliance chose are dropped
    (`BOOT`; and the process starts without the bench's own: `mlx_lm_server`).
    """
    boot = BOOT + "runpy.run_module('mlx_lm.server', run_name='__main__', alter_sys=True)"
    cmd = [sys.executable, "-c", boot, "--model", str(model_path), "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "WARNING"]
    help_text, b = _server_flags(), plan.batch
    for flag, value in (("--decode-concurrency", b.max_rows), ("--prompt-concurrency", b.max_rows),
                        ("--prefill-step-size", b.prefill_chunk)):
        if flag in matched and flag in help_text and flag not in extra:
            cmd += [flag, str(value)]
    return cmd + shlex.split(extra)  # bench.mlx_lm_args, e.g. "--prompt-cache-size 0"


def _mapped_blas(pid: int, blas: str) -> bool | None:
    """Whether process `pid` has `blas` mapped (Linux only; None where unknowable)."""
    try:
        return blas in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None


@contextlib.contextmanager
def mlx_lm_server(plan: ExecutionPlan, model_path: Path, log_path: Path, extra: str = "",
                  matched: tuple[str, ...] = MATCHED) -> Iterator[dict]:
    """Start mlx_lm.server on `model_path`, wait until it has loaded, yield its facts."""
    port = free_port()
    cmd = mlx_lm_command(plan, model_path, port, extra, matched)
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        # (mlx_lm.server at its own defaults: not the MLX settings appliance chose)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=_mlx_env.without_ours())
    try:
        _wait_ready(url, proc, str(model_path), log_path)
        info = {"kind": "mlx_lm", "url": url, "model": str(model_path), "command": cmd,
                "log": str(log_path)}
        if plan.machine.blas != "reference":
            info["blas_mapped"] = _mapped_blas(proc.pid, plan.machine.blas)
        yield info
    finally:
        stop(proc, 15)


def _wait_ready(url: str, proc: subprocess.Popen, model: str, log_path: Path) -> None:
    """GET /v1/models answers as soon as the socket is up, but mlx_lm.server loads the
    model on its generation thread: a 1-token request waits until it is loaded."""
    deadline = time.time() + READY_TIMEOUT_S

    def dead() -> None:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"mlx_lm.server exited ({proc.returncode}):\n{tail}")
        if time.time() > deadline:
            raise TimeoutError(f"mlx_lm.server did not answer within {READY_TIMEOUT_S:.0f} s")

    while True:
        dead()
        try:
            httpx.get(f"{url}/v1/models", timeout=5)
            break
        except (httpx.ConnectError, httpx.TimeoutException):
            time.sleep(0.2)  # not listening yet
        except httpx.HTTPError:
            break  # it answered, if badly (its /v1/models also scans the HF cache)
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    while True:
        dead()
        try:
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=READY_TIMEOUT_S)
            if r.status_code == 200:
                return
            raise RuntimeError(f"mlx_lm.server answered {r.status_code}: {r.text[:300]}")
        except (httpx.ConnectError, httpx.RemoteProtocolError):
            time.sleep(0.5)


def served_model_dir(plan: ExecutionPlan, src: Path) -> tuple[Path, bool]:
    """The directory mlx_lm should load, and whether it is an export (dtype-cast or held
    dense: mlx-lm computes with the very weights the appliance does)."""
    if plan.model.dtype != plan.model.checkpoint_dtype or plan.model.dequantized:
        return export_dir(plan, src), True
    return src, False


def remote_info(url: str) -> dict:
    """An already running server: the first model id it lists and, from an appliance,
    its own plan's fingerprint and batch settings (the local plan's label is not its)."""
    url = url.rstrip("/")
    r = httpx.get(f"{url}/v1/models", timeout=30)
    r.raise_for_status()
    info = {"kind": "url", "url": url, "model": r.json()["data"][0]["id"]}
    try:
        p = httpx.get(f"{url}/v1/plan", timeout=30)
        if p.status_code == 200:
            plan = p.json()
            info["remote_plan"] = {"fingerprint": plan.get("fingerprint"),
                                   "batch": {k: plan.get("batch", {}).get(k)
                                             for k in ("mode", "max_rows", "prefill_chunk")}}
    except (httpx.HTTPError, ValueError):
        pass  # not an appliance: nothing more to learn
    return info


def _fresh_ssd(plan: ExecutionPlan, overrides: list[str], outdir: Path) -> Path | None:
    """A new SSD-tier directory for a served plan with an SSD tier, unless the command line
    chose one: entries left by earlier runs would turn cold turns into hits."""
    if not plan.cache.ssd_bytes or any(o.lstrip("+~").startswith("cache.ssd.path=")
                                       for o in overrides):
        return None
    return outdir / "ssd"


@contextlib.contextmanager
def started(kind: str, plan: ExecutionPlan, cfg, path: Path, outdir: Path,
            overrides: list[str], bias: dict[str, float]) -> Iterator[tuple[dict, Endpoint]]:
    """Start the contender `kind` (self | mlx_lm | url), yield (its facts, an Endpoint), and
    stop it, on Ctrl-C too. An SSD directory made here is removed after the server has
    stopped, unless bench.keep_ssd (a bench must not leave gigabytes behind)."""
    from appliance.bench.progress import status

    with contextlib.ExitStack() as stack:
        if kind == "self":
            ov, ssd = list(overrides), _fresh_ssd(plan, overrides, outdir)
            if ssd is not None:
                ov.append(f"cache.ssd.path={ssd}")
                if not cfg.keep_ssd:  # registered first: runs after the server stopped
                    stack.callback(shutil.rmtree, ssd, ignore_errors=True)
            with status(f"starting appliance ({plan.model.id})", cfg.progress):
                url = stack.enter_context(appliance_process(plan, ov, outdir / "appliance.log"))
            info = {"kind": "self", "url": url, "model": plan.model.id}
            if ssd is not None:
                info["ssd_path"] = str(ssd)
            yield info, Endpoint(url, plan.model.id, bias, poll_stats=True)
        elif kind == "mlx_lm":
            # bench=agents: mlx_lm's defaults but for equal decode concurrency (the plan's
            # rows); the fleet also matches prompt concurrency and prefill step
            matched = MATCHED[:1] if cfg.workload == "agents" else MATCHED
            with status("starting mlx_lm.server", cfg.progress):
                served, exported = served_model_dir(plan, path)
                info = stack.enter_context(mlx_lm_server(
                    plan, served, outdir / "mlx_lm_server.log", cfg.mlx_lm_args, matched))
            # mlx_lm.server keeps its prompt (prefix) cache on by default; its usage reports
            # the cached prompt tokens.
            info["dtype_export"] = exported
            yield info, Endpoint(info["url"], info["model"], bias, poll_stats=False)
        else:
            # The EOS ban uses the local plan's tokenizer: the server should serve that model.
            info = remote_info(cfg.target)
            yield info, Endpoint(info["url"], info["model"], bias, poll_stats=True)
