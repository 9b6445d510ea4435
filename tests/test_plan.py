"""The plan: model facts from config.json, layer kinds, budgets, the fingerprint."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import resolve_overrides

from appliance.plan import PlanError


def test_plan_is_frozen_and_describes_the_embedded_model(plan):
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.model.id = "x"
    m = plan.model
    assert m.architecture == "qwen3" and m.source == "tiny"
    assert set(m.layer_kinds) == {"full"}
    assert m.checkpoint_dtype == "bfloat16" and m.dtype == "bfloat16"  # served as stored
    fp32 = resolve_overrides(["model.dtype=float32"]).model
    assert fp32.weight_bytes > 1.9 * m.weight_bytes  # cast to float32 in memory
    assert 4e6 <= m.parameters <= 8e6
    assert plan.memory.kv_budget_bytes == plan.memory.usable_bytes - m.weight_bytes


def test_fingerprint_tracks_exactly_the_output_fields():
    base = resolve_overrides([])
    assert resolve_overrides(["server.port=9999"]).fingerprint == base.fingerprint
    assert resolve_overrides(["+profile=m4-pro"]).fingerprint == base.fingerprint
    assert resolve_overrides(["model.dtype=float32"]).fingerprint != base.fingerprint


@pytest.mark.parametrize("shape,kinds", [
    ("tiny-llama", {"full"}),
    ("tiny-gemma3", {"full", "sliding"}),
    ("tiny-qwen3-next", {"full", "recurrent"}),
])
def test_layer_kinds_come_from_the_model_directory(shape, kinds):
    from appliance.models import ensure

    path = ensure(shape, "float32", None, 0)  # a real mlx-lm directory on disk
    plan = resolve_overrides(["model=local", f"model.path={path}"])
    assert set(plan.model.layer_kinds) == kinds
    if "sliding" in kinds:
        assert plan.model.sliding_window == 16
        assert plan.kv.sliding_bytes_per_token > 0
    full = plan.model.layer_kinds.count("full")
    assert plan.kv.bytes_per_token == 2 * full * plan.model.num_kv_heads * \
        plan.model.head_dim * 4  # float32 weights


def test_not_a_model_directory(tmp_path):
    with pytest.raises(PlanError, match="has no config.json"):
        resolve_overrides(["model=local", f"model.path={tmp_path}"])


def test_weights_that_do_not_fit_are_refused():
    with pytest.raises(PlanError, match="weights need"):
        resolve_overrides(["machine.memory_gb=0.01", "machine.headroom_gb=0",
                           "machine.headroom_fraction=0"])
    with pytest.raises(PlanError, match="server.max_context=100000000 needs"):
        resolve_overrides(["server.max_context=100000000"])


def test_openblas_is_used_when_installed(plan):
    import os

    from appliance import _blas

    present = [p for p in _blas.CANDIDATES if os.path.exists(p)]
    if plan.machine.backend != "cpu" or not os.uname().sysname == "Linux":
        assert plan.machine.blas in ("n/a", "reference")
    elif present:
        assert plan.machine.blas == present[0]
    else:
        assert plan.machine.blas == "reference"


def test_batch_plan_states_placement_and_budget():
    plan = resolve_overrides([])
    assert plan.batch.mode == "continuous" and plan.batch.max_rows == 8
    assert plan.batch.kv_budget_bytes == plan.memory.kv_budget_bytes  # auto
    assert set(plan.batch.placement) == {"full"}
    assert "BatchKVCache" in plan.batch.placement["full"]
    explicit = resolve_overrides(["batch.kv_budget=512MiB"])
    assert explicit.batch.kv_budget_bytes == 512 * 1024**2
    assert "until a second row is admitted" in plan.batch.lone_row  # stated, not silent
    serial = resolve_overrides(["batch=serial"])
    assert serial.batch.max_rows == 1
    assert serial.batch.placement == {"full": "one row at a time"}


def test_batch_refusals_name_the_field():
    with pytest.raises(PlanError) as e:
        resolve_overrides(["batch=serial", "batch.max_rows=4", "batch.kv_budget=lots",
                           "batch.prefill_chunk=0"])
    msg = str(e.value)
    assert "batch.max_rows=4 with batch=serial" in msg and "batch.kv_budget" in msg
    assert "4GiB" in msg and "batch.prefill_chunk=0" in msg
    with pytest.raises(PlanError, match="batch.kv_budget=1TiB is more than"):
        resolve_overrides(["batch.kv_budget=1TiB"])


def test_sizes():
    from appliance.plan.sizes import parse_size

    assert parse_size("4GiB") == 4 * 1024**3 and parse_size("2GB") == 2 * 10**9
    assert parse_size("1.5MiB") == 1572864 and parse_size(1024) == 1024
    with pytest.raises(ValueError, match="4GiB"):
        parse_size("4 parsecs")


@pytest.mark.parametrize("shape,kinds", [("llama-3.2-1b", {"full"}),
                                         ("tiny-gemma3", {"full", "sliding"}),
                                         ("tiny-qwen3-next", {"full", "recurrent"})])
def test_synthetic_shapes_plan_without_building(shape, kinds):
    plan = resolve_overrides(["model=synthetic", f"model.shape={shape}"])
    assert set(plan.model.layer_kinds) == kinds
    assert set(plan.batch.placement) == kinds
    if shape == "llama-3.2-1b":
        assert 1.2e9 < plan.model.parameters < 1.3e9 and plan.model.dtype == "bfloat16"
        q = resolve_overrides(["model=synthetic", "model.bits=4"])
        assert q.model.quantization == "4bit/g64" and q.fingerprint != plan.fingerprint
        assert q.model.weight_bytes < plan.model.weight_bytes / 3


def test_synthetic_bad_shape_lists_the_valid_ones():
    with pytest.raises(PlanError, match="valid choices: llama-3.2-1b, qwen3-0.6b, llama-3-8b"):
        resolve_overrides(["model=synthetic", "model.shape=gpt-5", "model.bits=3"])


def test_fingerprint_sees_different_weights_of_one_shape():
    """Same config.json, same file size, other weights: another fingerprint (prefix caches
    and exported copies are keyed by it)."""
    from appliance.models import ensure

    a = resolve_overrides(["model=local", f"model.path={ensure('tiny-llama', 'float32', None, 0)}"])
    b = resolve_overrides(["model=local", f"model.path={ensure('tiny-llama', 'float32', None, 1)}"])
    assert a.model.config_sha256 == b.model.config_sha256
    assert a.model.weight_bytes_on_disk == b.model.weight_bytes_on_disk
    assert a.fingerprint != b.fingerprint
