"""Defaults that serve: the auto knobs are derived from the machine and the workload, each
with its reason; explicit values win; a default-config server still equals mlx-lm."""

from __future__ import annotations

import platform

import pytest
from conftest import app_for, resolve_overrides

from appliance.plan.derive import Facts, Shape, Workload, attention_threads, derive, ridge_rows
from appliance.plan.errors import PlanError
from appliance.plan.machine import detect

GiB = 1024**3
KNOBS = ("batch.max_rows", "batch.prefill_chunk", "batch.kv_budget", "cache.ram.bytes",
         "server.max_context")
LLAMA_1B = ["model=synthetic", "model.shape=llama-3.2-1b"]
LLAMA_8B_4BIT = ["model=synthetic", "model.shape=llama-3-8b", "model.bits=4"]
H200 = ["machine.name=h200", "machine.chip=NVIDIA H200", "machine.memory_gb=139.7"]
LINUX_CPU = platform.system() == "Linux"


def test_a_plain_appliance_has_a_ram_prefix_cache_sized_from_the_machine():
    plan = resolve_overrides([])
    assert plan.cache.kind == "ram" and plan.cache.ram_bytes > 0 and plan.cache.ssd_bytes == 0
    assert plan.derived["cache"].startswith("cache=ram")
    for knob in KNOBS:  # every auto knob says what it became and why
        assert knob in plan.derived and ": " in plan.derived[knob]
    mem = plan.memory
    assert mem.ram_bytes == plan.cache.ram_bytes
    assert mem.ceiling_bytes <= mem.usable_bytes
    assert "derived:" in plan.to_yaml() and plan.to_dict()["derived"] == plan.derived


def test_ssd_stays_opt_in():
    assert resolve_overrides([]).cache.ssd_bytes == 0
    assert resolve_overrides(["+profile=agent-fleet"]).cache.kind == "tiered"
    serial = resolve_overrides(["batch=serial"])  # prefills from scratch: no cache
    assert serial.cache.kind == "none" and serial.derived["cache"].startswith("cache=none")


def test_explicit_values_win():
    plan = resolve_overrides(["batch.max_rows=3", "batch.prefill_chunk=64",
                              "batch.kv_budget=64MiB", "cache.ram.bytes=100MiB",
                              "server.max_context=1024", "model.dtype=bfloat16"])
    assert (plan.batch.max_rows, plan.batch.prefill_chunk) == (3, 64)
    assert plan.batch.kv_budget_bytes == 64 * 1024**2 and plan.cache.ram_bytes == 100 * 1024**2
    assert plan.server.max_context == 1024 and plan.model.dtype == "bfloat16"
    assert not set(KNOBS) & set(plan.derived) and "model.dtype" not in plan.derived


def test_attention_threads_follow_the_cpu_cores_and_kv_heads():
    """CPU: the cores, at most the kv heads (attention splits by kv head); a GPU: 1. An
    explicit value wins where it can be honored and is refused, naming the valid choices,
    where it cannot."""
    assert [attention_threads(None, "cpu", c, h)[0] for c, h in ((2, 2), (16, 8), (1, 8))] \
        == [2, 8, 1]
    n, why, problem = attention_threads(None, "cuda", 16, 8)
    assert n == 1 and "device" in why and problem is None
    assert attention_threads(1, "cuda", 16, 8)[::2] == (1, None)
    assert "valid choices: auto, 1" in attention_threads(2, "metal", 8, 8)[2]
    assert "valid choices: auto, 1..2" in attention_threads(4, "cpu", 8, 2)[2]
    assert attention_threads(2, "cpu", 1, 4)[::2] == (2, None)  # set: more than the cores
    assert resolve_overrides(["batch.attention_threads=1"]).batch.attention_threads == 1
    auto = resolve_overrides([])
    if auto.machine.backend == "cpu":
        assert auto.batch.attention_threads == min(detect().cpu_cores, auto.model.num_kv_heads)
        assert "kv head" in auto.derived["batch.attention_threads"]
    with pytest.raises(PlanError, match="batch.attention_threads=64 exceeds"):
        resolve_overrides(["batch.attention_threads=64"])


@pytest.mark.skipif(not LINUX_CPU, reason="the float32 default is Linux CPU's")
def test_linux_cpu_picks_float32_and_says_so():
    plan = resolve_overrides([])
    if plan.machine.backend != "cpu":
        pytest.skip("MLX runs on an accelerator here")
    assert plan.model.checkpoint_dtype == "bfloat16" and plan.model.dtype == "float32"
    assert "float32" in plan.derived["model.dtype"] and "BLAS" in plan.derived["model.dtype"]
    assert plan.batch.prefill_chunk == 256 and plan.batch.max_rows <= 8  # few rows on CPU


def test_m1_max_and_m4_pro_resolve_to_different_plans():
    for model in ([], LLAMA_8B_4BIT):
        m1 = resolve_overrides([*model, "+profile=[m1-max,agent-fleet]"])
        m4 = resolve_overrides([*model, "+profile=[m4-pro,agent-fleet]"])
        assert m1.machine.planned_for == m4.machine.planned_for == "metal"
        assert m1.cache.ram_bytes > m4.cache.ram_bytes  # 32 GB against 24 GB
        assert m1.derived != m4.derived
    # the 8B's 1 GiB contexts bind rows on both; the bigger Mac runs more
    assert m1.batch.max_rows > m4.batch.max_rows >= 1
    assert "memory" in m4.derived["batch.max_rows"].split(";")[0]


def test_agent_fleet_on_an_h200_derives_what_won_there():
    """The issue's evidence: 16 rows and a 32 GiB RAM tier beat 8 rows and 4 GiB."""
    for model in (LLAMA_1B, LLAMA_8B_4BIT):
        plan = resolve_overrides([*model, "+profile=agent-fleet", *H200,
                                  "model.dtype=bfloat16"])
        assert plan.machine.planned_for == "cuda"
        assert plan.batch.max_rows == 16 and plan.batch.prefill_chunk == 2048
        assert plan.cache.ram_bytes >= 32 * GiB
        assert "16 clients" in plan.derived["batch.max_rows"]


def test_rows_follow_bandwidth_against_compute():
    s = Shape(weights=2 * 10**9, parameters=10**9, per_token=32768, hidden=2048,
              intermediate=8192, heads=32, vocab=128256, act_bytes=2, trained=131072)
    gpu = Facts("cuda", 100 * GiB, bandwidth_gbs=4800, tflops=989, sources="")
    cpu = Facts("cpu", 100 * GiB, bandwidth_gbs=20, tflops=0.064, sources="")
    assert ridge_rows(gpu, s) > 100 and ridge_rows(cpu, s) < 4
    kw = dict(max_rows=None, prefill_chunk=None, max_context=None, trained_context=False,
              kv_budget=None, ram=None, prefill_rows=1, serial=False)
    big, small = (derive(f, s, Workload(16, 8192), **kw) for f in (gpu, cpu))
    # compute is stated, not a cap: past the ridge rows share it rather than queue
    assert big.max_rows == small.max_rows == 16
    assert "compute-bound" in small.reasons["batch.max_rows"]
    assert "bandwidth-bound up to" in big.reasons["batch.max_rows"]
    assert big.prefill_chunk == 2048 and small.prefill_chunk <= 512
    assert big.kv_budget == 16 * 8192 * 32768 or big.kv_budget == 131072 * 32768
    # the parts fit what is usable, with the RAM tier a share of what is left
    for d in (big, small):
        total = s.weights + d.activations + d.buffer_cache + d.kv_budget + d.copies + d.ram
        assert total <= 100 * GiB and d.ram > 0


def test_mode_plan_prints_the_reasons():
    import subprocess
    import sys

    out = {}
    for name in ("m1-max", "m4-pro"):
        r = subprocess.run([sys.executable, "-m", "appliance.cli", "mode=plan",
                            f"+profile={name}"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "derived:" in r.stdout and "batch.max_rows: 'max_rows=" in r.stdout
        out[name] = r.stdout
    assert out["m1-max"] != out["m4-pro"]


def test_a_default_config_server_equals_mlx_lm_at_its_dtype():
    """No options: float32 on Linux CPU, a RAM prefix cache. Greedy tokens over HTTP equal
    mlx-lm's generate_step at the same dtype, cold and again on a prefix-cache hit."""
    import httpx

    from appliance import oracle

    with app_for([]) as (plan, engine, url):
        model, tok = oracle.load(plan.model.path, plan.model.dtype)
        text = open(__file__).read()[:1200]
        want = tok.decode(oracle.generate(model, tok, tok.encode(text), 24, {}))
        body = {"model": plan.model.id, "prompt": text, "max_tokens": 24}
        for _ in range(2):  # the second is served from the RAM tier
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == want
        assert engine.stats()["cache"]["ram"]["hits"] >= 1


def test_cuda_counts_score_matrices_only_where_prefill_attention_is_not_fused():
    """On CUDA a lone row's prefill over full-attention layers is fused (no chunk x keys
    matrices) and may feed GRID tokens more (its pass starts on the grid); rows prefilled
    together, or layers that are not all full attention, are not, and their score
    matrices count. A pass's temporaries count for every layer."""
    from dataclasses import replace

    from appliance.plan.derive import GRID, activations

    s = Shape(weights=2 * 10**9, parameters=10**9, per_token=32768, hidden=2048,
              intermediate=8192, heads=32, vocab=128256, act_bytes=2, trained=131072, layers=16)
    fused = activations(s, 2048, 16, 1, 16384, "cuda")
    one_layer = activations(s, 2048, 16, 1, 16384, "cuda", whole_pass=False)
    scores = 2 * 32 * 2048 * (16384 + 2048) * 2  # one layer's scores and softmax
    logits = 16 * 3 * 128256 * 4
    token = (3 * 2048 + 2 * 2048 + 3 * 8192) * 2  # one fed token's activations, one layer
    assert fused - logits == 16 * (one_layer - logits) == 16 * (2048 + GRID) * token
    assert activations(replace(s, fused_prefill=False), 2048, 16, 1, 16384, "cuda") \
        == 16 * (2048 * token + scores) + logits
    assert activations(s, 2048, 16, 2, 16384, "cuda") == 16 * 2 * (2048 * token + scores) \
        + logits


def test_on_cuda_a_quantized_model_is_held_dense_where_it_fits(monkeypatch):
    """model.dequantize=auto: dense on CUDA when the dense weights take at most half of usable
    memory (the plan counts them), quantized otherwise; explicit values win or are refused."""
    import importlib

    from appliance.plan.machine import Detected

    r = importlib.import_module("appliance.plan.resolve")  # the module, not its function

    cpu = resolve_overrides(LLAMA_8B_4BIT)
    assert not cpu.model.dequantized and "stay 4bit" in cpu.derived["model.dequantize"]
    monkeypatch.setattr(r, "detect", lambda: Detected("cuda", "NVIDIA H200", 150 * 10**9, 16))
    gpu = resolve_overrides([*LLAMA_8B_4BIT, *H200])
    assert gpu.model.dequantized and gpu.model.dtype == "bfloat16"
    bf16 = resolve_overrides([*LLAMA_8B_4BIT[:2], *H200, "model.dtype=bfloat16"])
    assert gpu.model.weight_bytes == bf16.model.weight_bytes > 3 * cpu.model.weight_bytes
    assert gpu.memory.weights_bytes == gpu.model.weight_bytes
    assert "held dense" in gpu.derived["model.dequantize"]
    assert gpu.fingerprint != resolve_overrides([*LLAMA_8B_4BIT, *H200,
                                                 "model.dequantize=false"]).fingerprint
    big = resolve_overrides(["model=synthetic", "model.shape=llama-3-70b", "model.bits=4", *H200])
    assert not big.model.dequantized and "over half" in big.derived["model.dequantize"]
    plain = resolve_overrides([*LLAMA_1B, *H200])
    assert not plain.model.dequantized and "model.dequantize" not in plain.derived
    # native KV: the plan says a batch decodes through the masked kernels there, not here
    assert "masked CUDA kernels" in plain.kv.attention and cpu.kv.attention == "fused SDPA"
    for bad, says in (("model.dequantize=true", "not quantized"),
                      ("model.dequantize=maybe", "valid choices: auto, true, false")):
        with pytest.raises(PlanError, match=says):
            resolve_overrides([*LLAMA_1B, bad])


def test_a_quantized_model_held_dense_serves_mlx_lms_tokens_on_those_weights():
    """model.dequantize=true: no quantized layer is left in the engine, and greedy tokens over
    HTTP equal mlx-lm's generate_step on the same weights held dense, cold and on a hit."""
    import httpx
    import mlx.nn as nn

    from appliance import oracle

    tiny_q4 = ["model=synthetic", "model.shape=tiny-llama", "model.bits=4"]
    with app_for([*tiny_q4, "model.dequantize=true"]) as (plan, engine, url):
        assert plan.model.dequantized and plan.model.quantization
        model, tok = oracle.load(plan.model.path, plan.model.dtype, dequantize=True)
        for m in (engine.model, model):
            assert not any(isinstance(x, (nn.QuantizedLinear, nn.QuantizedEmbedding))
                           for _, x in m.named_modules())
        quantized, _ = oracle.load(plan.model.path, plan.model.dtype)
        assert any(isinstance(x, nn.QuantizedLinear) for _, x in quantized.named_modules())
        prompt = "def parse(text):\n    return"
        want = tok.decode(oracle.generate(model, tok, tok.encode(prompt), 16, {}))
        body = {"model": plan.model.id, "prompt": prompt, "max_tokens": 16}
        for _ in range(2):
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == want


def test_the_plan_says_where_stated_machine_facts_come_from():
    """Machine facts stated for another machine: from a profile, named as such; from
    machine.* settings, not called a profile ('auto', 'h200' were), and a memory taken from
    this machine said so (the plan mixed a data-sheet H200 with this box's memory silently)."""
    from conftest import resolve_overrides

    (note,) = [n for n in resolve_overrides(["+profile=m4-pro"]).notes if "facts" in n]
    assert note.startswith("machine facts come from profile 'm4-pro' (Apple M4 Pro); MLX")
    plan = resolve_overrides(["machine.name=h200", "machine.chip=NVIDIA H200"])
    (note,) = [n for n in plan.notes if "facts" in n]
    assert "from the machine.* settings (NVIDIA H200; memory: this machine's" in note
    assert "profile" not in note


def test_max_context_counts_a_chunks_activations_at_the_context_it_allows():
    """They were counted over the trained length (131k keys for the 1B shape): under
    batch=serial (2048-token chunks) a 1B plan on a 24 GB CPU got max_context=256, and the
    default plan 13312 where ~36k fit. The cap must still hold its own accounting."""
    from conftest import resolve_overrides

    from appliance.plan.machine import GiB

    one_b = ["model=synthetic", "model.shape=llama-3.2-1b", "machine.memory_gb=24"]
    serial = resolve_overrides(["batch=serial", *one_b])
    assert serial.server.max_context >= 4096
    plan = resolve_overrides(one_b)
    assert plan.server.max_context > 2 * 13312
    assert plan.memory.ceiling_bytes <= plan.memory.usable_bytes <= 24 * GiB


def test_an_accelerators_memory_is_its_own_not_the_hosts(monkeypatch):
    """MLX names the device's memory `memory_size` on Metal and `total_memory` on CUDA; the
    CUDA key was missed, so an 80 GB H100 on a 128 GiB host was planned as 135 GB (a memory
    limit of 96 GB). The dicts are what MLX 0.32.4 returned on an H100 and (keys) on Metal."""
    import mlx.core as mx

    from appliance.plan import machine

    h100 = {"total_memory": 85520809984, "free_memory": 84465090560, "architecture": "sm_90",
            "compute_capability_major": 9, "compute_capability_minor": 0,
            "device_name": "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(mx.metal, "is_available", lambda: False)
    if not hasattr(mx, "cuda"):
        monkeypatch.setattr(mx, "cuda", type("cuda", (), {}), raising=False)
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True, raising=False)
    monkeypatch.setattr(mx, "device_info", lambda: h100)
    found = machine.detect()
    assert (found.backend, found.chip, found.memory_bytes) == \
        ("cuda", "NVIDIA H100 80GB HBM3", 85520809984)
    m4 = {"device_name": "Apple M4 Pro", "architecture": "applegpu_g16s",
          "memory_size": 48 * 2**30, "max_recommended_working_set_size": 38 * 2**30}
    assert machine.accelerator_memory(m4, 1) == 48 * 2**30
    assert machine.accelerator_memory({"device_name": "?"}, 7) == 7
