"""The plan: model facts from config.json, layer kinds, budgets, the fingerprint."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import resolve_overrides
from models import make_model

from appliance.plan import PlanError


def test_plan_is_frozen_and_describes_the_embedded_model(plan):
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.model.id = "x"
    m = plan.model
    assert m.architecture == "qwen3" and m.source == "tiny"
    assert set(m.layer_kinds) == {"full"}
    assert m.checkpoint_dtype == "bfloat16" and m.dtype == "float32"
    assert m.weight_bytes > m.weight_bytes_on_disk  # bf16 on disk, cast to fp32 in memory
    assert 4e6 <= m.parameters <= 8e6
    assert plan.memory.kv_budget_bytes == plan.memory.usable_bytes - m.weight_bytes


def test_fingerprint_tracks_exactly_the_output_fields():
    base = resolve_overrides([])
    assert resolve_overrides(["server.port=9999"]).fingerprint == base.fingerprint
    assert resolve_overrides(["+profile=m4-pro"]).fingerprint == base.fingerprint
    assert resolve_overrides(["model.dtype=bfloat16"]).fingerprint != base.fingerprint


@pytest.mark.parametrize("arch,kinds", [
    ("llama", {"full"}),
    ("gemma3_text", {"full", "sliding"}),
    ("qwen3_next", {"full", "recurrent"}),
])
def test_layer_kinds_come_from_the_architecture(tmp_path, arch, kinds):
    path = make_model(tmp_path / arch, arch)
    plan = resolve_overrides(["model=local", f"model.path={path}"])
    assert set(plan.model.layer_kinds) == kinds
    if "sliding" in kinds:
        assert plan.model.sliding_window == 16
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
