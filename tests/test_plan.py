"""The plan: model facts from config.json, layer kinds, budgets, the fingerprint."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from conftest import resolve_overrides

from appliance.plan import PlanError


def test_plan_is_frozen_and_describes_the_embedded_model(plan):
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.model.id = "x"
    m = plan.model
    assert m.architecture == "qwen3" and m.source == "tiny"
    assert set(m.layer_kinds) == {"full"}
    assert m.checkpoint_dtype == "bfloat16" and m.dtype == "bfloat16"  # pinned (ORACLE_PIN)
    fp32 = resolve_overrides(["model.dtype=float32"]).model
    assert fp32.weight_bytes > 1.9 * m.weight_bytes  # cast to float32 in memory
    assert 4e6 <= m.parameters <= 8e6
    mem = plan.memory  # one account: the parts sum to the ceiling, within usable memory
    assert mem.ceiling_bytes == (mem.weights_bytes + mem.activations_bytes
                                 + mem.buffer_cache_bytes + mem.kv_budget_bytes
                                 + mem.copies_bytes + mem.ram_bytes) <= mem.usable_bytes
    assert mem.weights_bytes == m.weight_bytes and mem.ram_bytes == 0  # cache=none


def test_fingerprint_tracks_exactly_the_output_fields():
    base = resolve_overrides([])
    assert resolve_overrides(["server.port=9999"]).fingerprint == base.fingerprint
    assert resolve_overrides(["+profile=m4-pro"]).fingerprint == base.fingerprint
    other = "bfloat16" if base.model.dtype == "float32" else "float32"
    assert resolve_overrides([f"model.dtype={other}"]).fingerprint != base.fingerprint


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


def test_openblas_workers_spin_briefly_unless_the_user_says_otherwise(plan):
    """_blas.py sets OPENBLAS_THREAD_TIMEOUT before OpenBLAS loads (it reads it then); a
    value the user set, under either of OpenBLAS's names, wins."""
    import os
    import subprocess
    import sys

    from appliance import _blas

    if _blas.ACTIVE == "reference":
        pytest.skip("no OpenBLAS is loaded here")
    probe = "import appliance, os; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"
    env = {k: v for k, v in os.environ.items() if "THREAD_TIMEOUT" not in k}
    run = lambda **extra: subprocess.run(  # noqa: E731
        [sys.executable, "-c", probe], env={**env, **extra}, capture_output=True, text=True,
        check=True).stdout.strip()
    assert run() == _blas.THREAD_TIMEOUT == "4"
    assert run(OPENBLAS_THREAD_TIMEOUT="12") == "12"
    assert run(GOTO_THREAD_TIMEOUT="12") == "None"


def test_mlx_settings_are_set_before_mlx_unless_the_user_set_them():
    import os
    import subprocess
    import sys

    probe = ("import appliance, os; from appliance import _mlx_env; "
             "print(os.environ['MLX_CUDA_GRAPH_CACHE_SIZE'], "
             "'MLX_CUDA_GRAPH_CACHE_SIZE' in _mlx_env.without_ours())")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    ours = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, check=True).stdout.split()
    assert ours == ["4096", "False"]  # set for us; a peer server (mlx_lm) runs without it
    users = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True, env={**env, "MLX_CUDA_GRAPH_CACHE_SIZE": "7"})
    assert users.stdout.split() == ["7", "True"]  # the user's value wins and is passed on
    # mlx_lm.server, started by the bench through `import appliance`, runs without ours
    from appliance.bench.targets import BOOT

    peer = BOOT + "import os; print(os.environ.get('MLX_CUDA_GRAPH_CACHE_SIZE'))"
    assert subprocess.run([sys.executable, "-c", peer], env=env, capture_output=True,
                          text=True, check=True).stdout.split() == ["None"]
    assert subprocess.run([sys.executable, "-c", peer], capture_output=True, text=True,
                          check=True, env={**env, "MLX_CUDA_GRAPH_CACHE_SIZE": "7"}
                          ).stdout.split() == ["7"]


def test_mlx_jit_gets_fma_where_the_cpu_has_it(tmp_path):
    """On x86-64 with AVX2 and FMA and a g++ installed, `import appliance` puts a g++ front
    (adding -mavx2 -mfma -ffp-contract=off and what vectorizes exp) first on PATH for MLX's
    CPU JIT, with a TMPDIR of its own for MLX's kernel cache (shared by its children); a
    peer server runs without either; APPLIANCE_JIT_FRONT=0 leaves PATH alone, and a value
    other than 0 or 1 is refused, named, by every plan. A kernel the front compiles gives
    mx.exp's bits, over exp's whole range and past it."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "") \
        if os.path.exists("/proc/cpuinfo") else ""
    if not ({"avx2", "fma"} <= set(flags.split()) and shutil.which("g++")
            and os.uname().machine == "x86_64"):
        pytest.skip("needs an x86-64 CPU with AVX2 and FMA, and g++")
    probe = ("import appliance, os; from appliance import _mlx_env; "
             "peer = _mlx_env.without_ours(); "
             "print(_mlx_env.JIT, os.environ['PATH'].split(os.pathsep)[0], "
             "_mlx_env.JIT in peer['PATH'].split(os.pathsep), os.environ['TMPDIR'], "
             "peer['TMPDIR'])")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    env.pop("APPLIANCE_JIT_FRONT", None)
    jit, first, peer_has, tmpdir, peer_tmpdir = subprocess.run(
        [sys.executable, "-c", probe], env=env, check=True, capture_output=True,
        text=True).stdout.split()
    front = tmp_path / "appliance" / "jit" / "g++"
    assert jit == first == str(front.parent) and peer_has == "False"
    assert "-mavx2 -mfma -ffp-contract=off -fno-trapping-math" in front.read_text()
    assert Path(tmpdir).parent == tmp_path and Path(tmpdir).name.startswith("appliance-jit-")
    assert peer_tmpdir == str(tmp_path)
    # a child of such a process (its TMPDIR the front's directory) shares it, not nests one
    child = subprocess.run([sys.executable, "-c", probe], env={**env, "TMPDIR": tmpdir},
                           check=True, capture_output=True, text=True).stdout.split()
    assert child[3:] == [tmpdir, str(tmp_path)]
    off = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True, env={**env, "APPLIANCE_JIT_FRONT": "0"}).stdout.split()
    assert off[0] == "None" and off[1] != str(front.parent)
    # a bad value: a plan error (CLI exit 2, one line), not a traceback at import
    bad = subprocess.run([sys.executable, "-m", "appliance.cli", "mode=plan"],
                         capture_output=True, text=True, cwd=tmp_path,
                         env={**env, "APPLIANCE_JIT_FRONT": "off"})
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "- APPLIANCE_JIT_FRONT='off': valid choices: 0" in bad.stderr
    # the front compiles a kernel (MLX's cache in the front's own directory) to exp's bits
    kernel = ("import appliance, mlx.core as mx; "
              "x = mx.concatenate([mx.random.normal((100000,)) * 30, "
              "mx.linspace(-100, 100, 400001), mx.array([0.0, -0.0, 88.0, -88.0])]); "
              "f = mx.compile(lambda a, b: mx.exp(a - b)); z = mx.array(0.0); "
              "print(mx.array_equal(f(x, z), mx.exp(x)).item())")
    out = subprocess.run([sys.executable, "-c", kernel], check=True, capture_output=True,
                         text=True, env=env).stdout.split()
    assert out == ["True"] and list(Path(tmpdir).glob("mlx/*/cpu/*.so"))
    assert not list(tmp_path.glob("mlx"))


def test_batch_plan_states_placement_and_budget():
    plan = resolve_overrides([])
    assert plan.batch.mode == "continuous" and plan.batch.max_rows >= 1
    assert plan.derived["batch.max_rows"].startswith(f"max_rows={plan.batch.max_rows}: ")
    assert plan.batch.kv_budget_bytes == plan.memory.kv_budget_bytes  # auto
    assert set(plan.batch.placement) == {"full"}
    assert "left-padded to one write cursor" in plan.batch.placement["full"]
    explicit = resolve_overrides(["batch.kv_budget=512MiB"])
    assert explicit.batch.kv_budget_bytes == 512 * 1024**2
    assert "until a second row is admitted" in plan.batch.lone_row  # stated, not silent
    serial = resolve_overrides(["batch=serial"])
    assert serial.batch.max_rows == 1
    assert serial.batch.placement == {"full": "one row at a time"}
    assert ": one row of max_context=" in serial.derived["batch.kv_budget"]  # not "1 rows"
    assert "kv.start" not in plan.batch.placement["full"]
    # kv.start holds per row, in a batch too: said so
    quantized = resolve_overrides(["kv=turboquant"])
    assert quantized.kv.start > 0
    assert f"kv.start={quantized.kv.start} holds per row" in quantized.batch.placement["full"]
    assert "kv.start" not in resolve_overrides(["kv=turboquant", "kv.start=0"]) \
        .batch.placement["full"]


def test_batch_refusals_name_the_field():
    with pytest.raises(PlanError) as e:
        resolve_overrides(["batch=serial", "batch.max_rows=4", "batch.kv_budget=lots",
                           "batch.prefill_chunk=0"])
    msg = str(e.value)
    assert "batch.max_rows=4 with batch=serial" in msg and "batch.kv_budget" in msg
    assert "4GiB" in msg and "batch.prefill_chunk=0" in msg
    with pytest.raises(PlanError, match="batch.kv_budget=1TiB is more than"):
        resolve_overrides(["batch.kv_budget=1TiB"])
    # the workload sizes the batch's rows and budget; batch=serial (one row) reads neither
    with pytest.raises(PlanError) as e:
        resolve_overrides(["batch=serial", "server.clients=16", "server.typical_context=9000"])
    assert e.value.problems == [
        "server.clients=16 is not read by batch=serial; it applies to batch=continuous",
        "server.typical_context=9000 is not read by batch=serial; it applies to batch=continuous"]


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
        assert 1.2e9 < plan.model.parameters < 1.3e9
        assert plan.model.checkpoint_dtype == "bfloat16"
        assert plan.model.dtype == ("float32" if "model.dtype" in plan.derived else "bfloat16")
        q = resolve_overrides(["model=synthetic", "model.bits=4"])
        assert q.model.quantization == "4bit/g64" and q.fingerprint != plan.fingerprint
        assert q.model.weight_bytes < plan.model.weight_bytes / 3


def test_synthetic_bad_shape_lists_the_valid_ones():
    with pytest.raises(PlanError, match="valid choices: llama-3.2-1b, qwen3-0.6b, llama-3-8b"):
        resolve_overrides(["model=synthetic", "model.shape=gpt-5", "model.bits=3"])


def test_a_synthetic_model_another_process_wrote_first_is_used(tmp_path, monkeypatch):
    """Two processes making one synthetic model at once (two servers starting, parallel
    tests): the one that finishes second keeps the directory the first wrote."""
    import os

    from appliance.models import synthetic

    monkeypatch.setattr(synthetic, "CACHE", tmp_path)
    replace = os.replace

    def first_wins(src, dst):
        if str(dst).startswith(str(tmp_path)):  # the other process renames its copy first
            os.mkdir(dst)
            with open(os.path.join(dst, "model.safetensors"), "wb") as f:
                f.write(b"theirs")
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", first_wins)
    out = synthetic.ensure("tiny-llama", "float32", None, 0)
    assert out == synthetic.synthetic_dir("tiny-llama", "float32", None, 0)
    assert (out / "model.safetensors").read_bytes() == b"theirs"
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # its own copy removed


def test_fingerprint_sees_different_weights_of_one_shape():
    """Same config.json, same file size, other weights: another fingerprint (prefix caches
    and exported copies are keyed by it)."""
    from appliance.models import ensure

    a = resolve_overrides(["model=local", f"model.path={ensure('tiny-llama', 'float32', None, 0)}"])
    b = resolve_overrides(["model=local", f"model.path={ensure('tiny-llama', 'float32', None, 1)}"])
    assert a.model.config_sha256 == b.model.config_sha256
    assert a.model.weight_bytes_on_disk == b.model.weight_bytes_on_disk
    assert a.fingerprint != b.fingerprint


def test_fingerprint_sees_one_changed_weight_byte_anywhere(tmp_path, monkeypatch):
    """The fingerprint sampled 16 windows a file: a probe flipped bits in layer 0's tensors
    outside them, and the copy was served the original's SSD prefix entries (another first
    token). Every byte counts now; a file's digest is kept by path, size and mtime."""
    import shutil

    from appliance.plan import model_info

    monkeypatch.setattr(model_info, "DIGESTS", tmp_path / "digests.json")
    src = Path(model_info.__file__).parents[1] / "embedded" / "tiny"
    copies = []
    for name in ("a", "b"):
        shutil.copytree(src, tmp_path / name, ignore=shutil.ignore_patterns("mtp*"))
        copies.append(tmp_path / name / "model.safetensors")
    data = bytearray(copies[1].read_bytes())
    data[len(data) // 2 + 12345] ^= 0x80  # a sign bit between the old sampled windows
    copies[1].write_bytes(bytes(data))
    a, b = (resolve_overrides(["model=local", f"model.path={f.parent}"]) for f in copies)
    assert a.model.weight_bytes_on_disk == b.model.weight_bytes_on_disk
    assert a.fingerprint != b.fingerprint
    kept = json.loads((tmp_path / "digests.json").read_text())
    assert len(kept) == 2 and all(str(f.resolve()) in " ".join(kept) for f in copies)
    # kept digests are read back, not recomputed: a stale entry for an unchanged stat wins
    key = next(k for k in kept if str(copies[0].resolve()) in k)
    (tmp_path / "digests.json").write_text(json.dumps({**kept, key: "0" * 64}))
    again = resolve_overrides(["model=local", f"model.path={copies[0].parent}"])
    assert again.fingerprint != a.fingerprint
    data[len(data) // 2 + 12345] ^= 0x80  # b back to a's bytes: a new mtime, a new digest
    copies[1].write_bytes(bytes(data))
    assert resolve_overrides(["model=local", f"model.path={copies[1].parent}"]).fingerprint \
        == a.fingerprint


def test_kv_schemes_state_their_true_bytes_and_capacity():
    bf16 = ["model.dtype=bfloat16"]  # the bytes below are bf16 KV's
    native, q = resolve_overrides(bf16), resolve_overrides(["kv=affine4", *bf16])
    # 6 layers x K+V x 2 heads x 64 dims x 2 bytes (bf16) = 512 per layer and token
    assert native.kv.bytes_per_token == 6 * 512 and native.kv.quantized_layers == ()
    assert q.kv.keep_layers == (0, 1, 4, 5) and q.kv.quantized_layers == (2, 3)
    # an affine4 vector of 64: 32 bytes of codes + a bf16 scale and bias per group of 64
    assert q.kv.bytes_per_token == 4 * 512 + 2 * (2 * 2 * (32 + 4))
    assert q.kv.layers["full"]["bytes_per_token"] == 2 * 2 * 36
    rows = q.memory.rows_at_max_context
    assert set(rows) == {"native", "affine8", "k8v4", "affine4", "turboquant"}
    assert rows["native"] < rows["affine8"] < rows["k8v4"] < rows["affine4"]
    every = resolve_overrides(["kv=turboquant", "kv.keep_layers=[]", *bf16])
    assert every.kv.quantized_layers == tuple(range(6))
    assert every.kv.bytes_per_token == 6 * 2 * 2 * (32 + 2)  # 4-bit codes + a float16 norm
    assert "rotated space" in every.kv.attention
    fingerprints = {resolve_overrides(o).fingerprint for o in (
        [], ["kv=affine8"], ["kv=k8v4"], ["kv=affine4"], ["kv=turboquant"],
        ["kv=k8v4", "kv.start=0"], ["kv=k8v4", "kv.keep_layers=[]"],
        ["kv=turboquant", "kv.rotation=orthogonal"], ["kv=turboquant", "kv.rotation_seed=1"])}
    assert len(fingerprints) == 9  # an SSD blob of one scheme never loads under another


def test_impossible_kv_compositions_are_refused_together():
    with pytest.raises(PlanError) as e:
        resolve_overrides(["kv=k8v4", "kv.start=99999", "kv.group_size=48",
                           "kv.keep_layers=[9]", "kv.value_bits=7"])
    msg = str(e.value)
    for needle in ("kv.start=99999", "server.max_context", "kv.group_size=48",
                   "valid choices: 32, 64, 128", "kv.keep_layers=[9]", "kv.value_bits=7",
                   "valid choices: 2, 3, 4, 5, 6, 8"):
        assert needle in msg
    assert len(e.value.problems) == 4


def test_turboquant_hadamard_needs_a_power_of_two_head_and_mla_stays_native():
    from dataclasses import replace

    from appliance.plan.kv import resolve_kv
    from appliance.plan.model_info import inspect_model
    from appliance.plan.source import EMBEDDED_MODEL

    info = inspect_model(EMBEDDED_MODEL)
    kv = type("KV", (), {"scheme": "turboquant", "key_bits": 4, "value_bits": 4,
                         "group_size": 64, "start": 0, "keep_layers": None,
                         "rotation": "hadamard", "rotation_seed": 0})()
    problems: list[str] = []
    assert resolve_kv(kv, replace(info, head_dim=96), "bfloat16", "cpu", 4096, problems) is None
    assert "power-of-two head size" in problems[0] and "kv.rotation=orthogonal" in problems[0]
    kv.rotation, problems = "orthogonal", []
    assert resolve_kv(kv, replace(info, head_dim=96), "bfloat16", "cpu", 4096, problems)
    problems = []
    assert resolve_kv(kv, replace(info, architecture="deepseek_v3"), "bfloat16", "cpu", 4096,
                      problems) is None
    assert "MLA latent" in problems[0] and "valid choices: kv=native" in problems[0]


def test_a_model_or_cache_field_its_choice_does_not_read_is_refused():
    """`model.path=...` without model=local planned (and served) the embedded model; a RAM
    size with cache=ssd gave no RAM tier: each is refused, naming who reads it."""
    for overrides, says in (
            (["model.path=/some/model"], "model.path='/some/model' is not read by model=tiny; "
                                         "it applies to model=local"),
            (["model.repo=org/m"], "model.repo='org/m' is not read by model=tiny"),
            (["model=synthetic", "model.revision=main"], "model.revision='main' is not read"),
            (["model.bits=4"], "model.bits=4 is not read by model=tiny; it applies to "
                               "model=synthetic"),
            (["model.seed=3"], "model.seed=3 is not read"),
            (["cache=none", "cache.ram.bytes=1GiB"], "cache.ram.bytes='1GiB' is not read by "
                                                     "cache=none; it applies to cache=ram|tiered"),
            (["cache=ssd", "cache.ram.bytes=1GiB"], "cache.ram.bytes='1GiB' is not read by "
                                                    "cache=ssd"),
            (["cache=ram", "cache.ssd.path=/tmp/x"], "cache.ssd.path='/tmp/x' is not read by "
                                                     "cache=ram; it applies to cache=ssd|tiered"),
            (["batch=serial", "cache.ssd.bytes=5GiB"], "cache=auto (here none)")):
        with pytest.raises(PlanError) as e:
            resolve_overrides(overrides)
        assert says in str(e.value), (overrides, str(e.value))
    plan = resolve_overrides(["model=synthetic", "model.shape=tiny-llama", "model.seed=3",
                              "cache=tiered", "cache.ram.bytes=1GiB", "cache.ssd.bytes=2GiB"])
    assert (plan.cache.ram_bytes, plan.cache.ssd_bytes) == (2**30, 2**31)


def test_a_kv_field_the_scheme_does_not_read_is_refused():
    for overrides, field in ((["kv.start=5"], "kv.start=5 is not read by kv.scheme=native; it "
                                              "applies to kv.scheme=affine|turboquant"),
                             (["kv=k8v4", "kv.rotation=orthogonal"],
                              "kv.rotation='orthogonal' is not read by kv.scheme=affine"),
                             (["kv=turboquant", "kv.group_size=32"], "kv.group_size=32 is not")):
        with pytest.raises(PlanError, match=re.escape(field)):
            resolve_overrides(overrides)
    rows = resolve_overrides(["kv=turboquant", "kv.rotation=orthogonal"])
    assert set(rows.memory.rows_at_max_context) == {"native", "affine8", "k8v4", "affine4",
                                                     "turboquant"}


def test_keep_layers_covering_every_full_attention_layer_is_refused():
    """No layer encoded: the codec's settings changed nothing, and the plan still differed
    from kv=native (a fingerprint of its own)."""
    with pytest.raises(PlanError, match=r"kv.keep_layers=\[0, 1, 2, 3, 4, 5\] keeps every "
                                        "full-attention layer native: kv=affine would encode"):
        resolve_overrides(["kv=affine8", "kv.keep_layers=[0,1,2,3,4,5]"])
    assert resolve_overrides(["kv=affine8", "kv.keep_layers=[0,1,2,3,4]"]).kv.quantized_layers \
        == (5,)


def test_compile_step_where_the_step_cannot_be_compiled_is_refused():
    """It was a note while the plan still said compile_step: true and the step ran
    uncompiled: accepted and dropped."""
    for overrides, says in ((["kv=k8v4"], "kv=affine attends over codes"),
                            (["batch=serial", "batch.max_rows=1"], "batch=serial decodes"),
                            (["draft=mtp"], "draft=mtp reads hidden states")):
        with pytest.raises(PlanError) as e:
            resolve_overrides(["batch.compile_step=true", *overrides])
        assert says in str(e.value) and "valid choices: batch.compile_step=false" in str(e.value)
    assert resolve_overrides(["batch.compile_step=true"]).batch.compile_step
