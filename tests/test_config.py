"""Config: every group option and profile composes and resolves; the CLI behaves."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import resolve_overrides

from appliance.config.hydra_setup import group_options
from appliance.plan import PlanError

OPTIONS = group_options()
# Options that need a value a user must supply.
REQUIRED = {("model", "local"): ["model.path=__EMBEDDED__"], ("model", "hf"): None}


def _cases():
    for group, options in OPTIONS.items():
        for option in options:
            yield group, option


@pytest.mark.parametrize("group,option", list(_cases()))
def test_every_option_composes_and_resolves(group, option):
    from appliance.plan.source import EMBEDDED_MODEL

    extra = REQUIRED.get((group, option), [])
    if extra is None:  # hf needs a network: it must fail with a clear PlanError instead
        with pytest.raises(PlanError) as e:
            resolve_overrides([f"{group}={option}", "model.repo=nobody/does-not-exist"])
        assert "model.repo='nobody/does-not-exist'" in str(e.value)
        return
    extra = [x.replace("__EMBEDDED__", str(EMBEDDED_MODEL)) for x in extra]
    key = f"+{group}" if group == "profile" else group
    plan = resolve_overrides([f"{key}={option}", *extra])
    assert plan.fingerprint.startswith("fp_")
    if group == "profile":
        assert plan.profiles == (option,)


def test_profiles_compose_left_to_right():
    plan = resolve_overrides(["+profile=[m4-pro,agent-fleet]"])
    assert plan.profiles == ("m4-pro", "agent-fleet")
    assert plan.machine.name == "m4-pro"
    assert plan.machine.memory_bytes == 24 * 1024**3
    assert plan.server.clients == 16 and plan.server.default_max_tokens == 2048  # agent-fleet
    assert plan.derived["server.max_context"].startswith(f"max_context={plan.server.max_context}")
    assert plan.cache.kind == "tiered" and plan.batch.mode == "continuous"
    later = resolve_overrides(["+profile=[m4-pro,m1-max]"])
    assert later.machine.name == "m1-max"


def test_plan_error_lists_every_problem():
    with pytest.raises(PlanError) as e:
        resolve_overrides(["kv.scheme=kv3", "batch.mode=warp", "server.port=0",
                           "model.dtype=int3"])
    msg = str(e.value)
    for needle in ("kv.scheme='kv3'", "valid choices: native", "batch.mode='warp'",
                   "server.port=0", "model.dtype='int3'", "float32"):
        assert needle in msg
    assert len(e.value.problems) == 4


def test_server_and_machine_values_are_checked_at_plan_time():
    """Each refused with its valid range: before, a bad log level passed the plan and then
    failed the server's start with a traceback, a bad default temperature failed every
    request that left it out with a 400 blaming the client, and a negative bandwidth was
    planned with (a "past ~-128 rows" ridge)."""
    with pytest.raises(PlanError) as e:
        resolve_overrides(["server.log_level=banana", "server.default_temperature=-1",
                           "server.default_top_p=5", "machine.bandwidth_gbs=-1",
                           "machine.tflops=0", "machine.headroom_gb=-100"])
    msg = str(e.value)
    for needle in ("server.log_level='banana'; valid choices: critical, error, warning, info",
                   "server.default_temperature=-1.0 must be in 0..2",
                   "server.default_top_p=5.0 must be in (0, 1]",
                   "machine.bandwidth_gbs=-1.0 must be > 0, or null to detect it",
                   "machine.tflops=0.0 must be > 0", "machine.headroom_gb=-100.0 must be >= 0"):
        assert needle in msg
    assert len(e.value.problems) == 6
    assert resolve_overrides(["server.log_level=WARNING"]).server.log_level == "WARNING"
    from uvicorn.config import LOG_LEVELS as UVICORN

    from appliance.plan.resolve import LOG_LEVELS
    assert set(LOG_LEVELS) == set(UVICORN)  # the plan's copy of the levels uvicorn takes


@pytest.mark.parametrize("bad,problem", [
    ("server.max_context=0", "server.max_context=0 must be >= 2"),
    ("batch.max_rows=-1", "batch.max_rows=-1 must be >= 1")])
def test_one_bad_value_is_one_problem(bad, problem):
    """Not also its echo in a check that reads it (before: a second `>= 1` for the context,
    a prefill_rows range of 1..-1)."""
    with pytest.raises(PlanError) as e:
        resolve_overrides([bad])
    assert e.value.problems == [problem]


def test_a_kv_budget_holds_one_row_of_the_context():
    """Set by hand, batch.kv_budget caps the derived context at what one row may hold; below
    one row of a context set by hand (or of 256 tokens) it is refused: before, the plan
    passed and every request got a 400 that no shorter prompt could help."""
    per = resolve_overrides([]).kv.bytes_per_token
    capped = resolve_overrides([f"batch.kv_budget={1000 * per}"])
    assert capped.server.max_context == 768 and capped.batch.kv_budget_bytes == 1000 * per
    assert "capped at 768" in capped.derived["server.max_context"]
    for bad in (["batch.kv_budget=1KiB"],
                [f"batch.kv_budget={1000 * per}", "server.max_context=4096"]):
        with pytest.raises(PlanError, match=r"batch.kv_budget=\d+\w* holds less than one row "
                                            r"of server.max_context=\d+ \([\d,]+ bytes of KV\)"):
            resolve_overrides(bad)
    assert resolve_overrides([f"batch.kv_budget={4096 * per}", "server.max_context=4096"])


@pytest.mark.parametrize("overrides", [
    [], ["kv=k8v4"], ["kv=k8v4", "batch=serial"], ["kv=k8v4", "batch.max_rows=1"],
    ["kv=k8v4", "batch.kv_budget=10MiB"], ["kv=turboquant", "draft=mtp", "batch.max_rows=2"],
    ["kv=affine4", "kv.start=256", "batch.kv_budget=4MiB"]])
def test_a_planned_context_fits_what_admission_lets_one_row_hold(overrides):
    """Admission (engine/budget.py) counts a row past kv.start encoded, before it native, and
    a lone row's chunk past it: the plan sizes the budget and caps the context the same way.
    Before, under kv=k8v4 a 911-token chat with max_tokens unset was refused (the budget
    left a row ~1,300 tokens of a 4,096 context)."""
    from appliance.engine.budget import Budget, KVShape

    plan = resolve_overrides(overrides)
    budget = Budget(plan.batch.kv_budget_bytes, KVShape.for_plan(plan))
    ctx = plan.server.max_context
    assert budget.fits_alone(ctx - 1, 1) and budget.fits_alone(1, ctx - 1)


def test_a_ram_tier_too_large_says_what_is_left_for_it():
    with pytest.raises(PlanError, match=r"cache.ram.bytes=1TiB is more than the [\d.]+ GiB left "
                                        r"after the weights, activations, live KV and its copies"):
        resolve_overrides(["cache.ram.bytes=1TiB"])


def test_affine_kv_on_a_head_no_group_divides_names_the_schemes_that_serve():
    with pytest.raises(PlanError, match="no group size .* divides it: affine KV cannot serve "
                                        "this model; valid choices: kv=native, kv=turboquant"):
        resolve_overrides(["model=synthetic", "model.shape=tiny-gemma3", "kv=affine4"])
    assert resolve_overrides(["model=synthetic", "model.shape=tiny-gemma3", "kv=turboquant"])


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_cli_plan_prints_yaml_and_leaves_no_files(tmp_path):
    import yaml

    r = _cli("mode=plan", "+profile=[m4-pro,agent-fleet]", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    assert doc["fingerprint"].startswith("fp_")
    assert doc["model"]["architecture"] == "qwen3"
    assert doc["profiles"] == ["m4-pro", "agent-fleet"]
    assert list(tmp_path.iterdir()) == []  # no Hydra output folders in the user's directory


def test_cli_unknown_option_exits_2_with_choices(tmp_path):
    r = _cli("mode=plan", "kv=nonexistent", "+profile=nope", cwd=tmp_path)
    assert r.returncode == 2
    assert "kv='nonexistent'" in r.stderr
    assert "valid choices: affine4, affine8, k8v4, native" in r.stderr
    assert "profile='nope'" in r.stderr and "agent-fleet, m1-max, m4-pro" in r.stderr


def test_cli_bad_value_exits_2(tmp_path):
    r = _cli("mode=plan", "batch.prefill_chunk=0", cwd=tmp_path)
    assert r.returncode == 2 and "batch.prefill_chunk=0" in r.stderr
    r = _cli("mode=plan", "server.port=notanint", cwd=tmp_path)
    assert r.returncode == 2 and "server.port" in r.stderr


def test_cli_names_every_problem_at_once(tmp_path):
    """An unknown option, an unknown key or a value its type refuses stopped Hydra at the
    first, in Hydra's words (`server.port=abc`: "Error merging override"), hiding the rest;
    now one PlanError names them all, with the plan's own problems with the other overrides
    (found by a new-user walkthrough of README)."""
    r = _cli("mode=plan", "kv=nope", "server.port=abc", "batch.nope=3", "foo=1",
             "batch.max_rows=-1", cwd=tmp_path)
    assert r.returncode == 2 and "PlanError: 5 problem(s)" in r.stderr, r.stderr
    for says in ("kv='nope' is not an option (conf/kv/); valid choices: affine4",
                 "server.port='abc' is not an integer",
                 "batch.nope is not a setting of appliance; did you mean batch.mode?",
                 "foo is not a setting of appliance; valid keys here: mode, model",
                 "batch.max_rows=-1 must be >= 1"):
        assert says in r.stderr
    assert "Error merging override" not in r.stderr and "full_key" not in r.stderr
    r = _cli("-m", "mode=plan", "server.port=8000,abc", cwd=tmp_path)  # each sweep value
    assert r.returncode == 2 and "server.port='abc'" in r.stderr and "8000" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_value_the_plan_refuses_stops_the_sweep_before_any_cell_runs(tmp_path):
    """`batch.max_rows=4,x` (max_rows takes auto or an integer: the type check lets 'x' by)
    ran a whole bench at 4, then stopped at x (a new-user walkthrough); each swept value is
    now planned, the other sweeps at their first value, before the first cell."""
    r = _cli("-m", "mode=bench", "bench.clients=1", "batch.max_rows=4,x", "kv=native,k8v4",
             cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "batch.max_rows='x' is not a number; write an integer >= 1, or auto" in r.stderr
    assert "PlanError: 1 problem(s)" in r.stderr and list(tmp_path.iterdir()) == []
    r = _cli("-m", "mode=plan", "kv=native,k8v4", "kv.start=5", cwd=tmp_path)
    assert r.returncode == 2 and "kv.start=5 is not read by kv.scheme=native" in r.stderr
    r = _cli("-m", "mode=plan", "batch.max_rows=4,8", "kv=native,k8v4", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.count("fingerprint:") == 4, r.stderr


def test_a_profile_every_later_one_overrides_is_refused(tmp_path):
    """`+profile=[m1-max,m4-pro]` planned an M4 Pro and dropped m1-max without a word (never
    accept and ignore); profiles that set different things still compose."""
    r = _cli("mode=plan", "+profile=[m1-max,m4-pro]", cwd=tmp_path)
    assert r.returncode == 2
    assert ("+profile=m1-max: m4-pro sets again every key it sets (machine), so it would be "
            "ignored") in r.stderr
    r = _cli("mode=plan", "+profile=[agent-fleet,agent-fleet]", cwd=tmp_path)
    assert r.returncode == 2 and "+profile=agent-fleet: agent-fleet sets again" in r.stderr
    r = _cli("mode=plan", "+profile=[m4-pro,agent-fleet]", cwd=tmp_path)
    assert r.returncode == 0 and "name: m4-pro" in r.stdout, r.stderr
    # a sweep is one profile (or list) a cell: machines compared, not stacked
    (tmp_path / "sweep").mkdir(), (tmp_path / "lists").mkdir()
    r = _cli("-m", "mode=plan", "+profile=m1-max,m4-pro", cwd=tmp_path / "sweep")
    assert r.returncode == 0 and r.stdout.count("fingerprint:") == 2, r.stderr
    r = _cli("-m", "mode=plan", "+profile=[m1-max,agent-fleet],[m4-pro,agent-fleet]",
             cwd=tmp_path / "lists")
    assert r.returncode == 0 and r.stdout.count("fingerprint:") == 2, r.stderr
    r = _cli("-m", "mode=plan", "+profile=m1-max,[m4-pro,m1-max]", cwd=tmp_path)
    assert r.returncode == 2 and "+profile=m4-pro: m1-max sets again" in r.stderr


def test_cli_refuses_bench_and_tune_settings_no_mode_reads(tmp_path):
    """Never accepted and ignored: bench.* outside mode=bench/tune, tune.* outside mode=tune."""
    r = _cli("mode=plan", "bench=agents", "bench.agents=4", "tune.trials=3", cwd=tmp_path)
    assert r.returncode == 2
    assert "bench=agents bench.agents=4: only mode=bench or mode=tune" in r.stderr
    assert "tune.trials=3: only mode=tune" in r.stderr


def test_a_profiles_bench_and_tune_settings_are_checked_as_the_command_lines(tmp_path):
    """Only the command line's were: a profile's bench settings were taken by mode=plan and
    by a workload that does not read them."""
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.yaml").write_text(
        "# @package _global_\nbatch:\n  max_rows: 4\nbench:\n  agents: 4\n")
    r = _cli("mode=plan", "+profile=mine", cwd=tmp_path)
    assert r.returncode == 2
    assert "bench.agents=4 (+profile=mine): only mode=bench or mode=tune reads" in r.stderr
    r = _cli("mode=bench", "bench=fleet", "+profile=mine", cwd=tmp_path)
    assert r.returncode == 2 and "bench.agents=4 (+profile=mine): bench=fleet does not read" \
        in r.stderr
    (tmp_path / "profiles" / "mine.yaml").write_text("batch:\n  max_rows: 4\n")
    r = _cli("mode=plan", "+profile=mine", cwd=tmp_path)
    assert r.returncode == 0 and "max_rows: 4" in r.stdout, r.stderr


def test_cli_refuses_a_bench_field_the_workload_does_not_read(tmp_path):
    """Never accepted and ignored: bench=fleet has no agents, bench=kv no turns; each
    workload's own fields still pass (the check runs before anything starts)."""
    r = _cli("mode=bench", "bench=fleet", "bench.agents=4", "bench.turns=2", cwd=tmp_path)
    assert r.returncode == 2
    assert "bench.agents=4 bench.turns=2: bench=fleet does not read them" in r.stderr
    assert "it reads clients, requests_per_client" in r.stderr
    from appliance.bench import check

    class Cfg(dict):
        __getattr__ = dict.get

    from appliance.config.schema import BenchConfig

    cfg = Cfg(BenchConfig().__dict__, workload="agents")
    assert check(cfg, ["bench=agents", "bench.agents=4", "bench.think_s=0"]) == []
    assert check(cfg, ["bench.kv_batches=[8]"])[0].startswith(
        "bench.kv_batches=[8]: bench=agents does not read it")


def test_a_plan_setting_a_bench_does_not_pass_on_is_refused(tmp_path):
    """A bench starts its own servers (or engine, or talks to another server): a plan setting
    that does not reach what it measures is refused with the reason, never dropped (bench=kv
    took batch=serial and draft=lookup, bench=prefix cache=none, target=mlx_lm kv=k8v4, and
    server.api_key crashed the bench once its server was up)."""
    r = _cli("mode=bench", "server.api_key=k", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "server.api_key=k: not used with bench=fleet bench.target=self: a bench serves on" \
        in r.stderr
    r = _cli("mode=bench", "bench.keep_ssd=true", cwd=tmp_path)  # no SSD tier: none to keep
    assert r.returncode == 2 and "bench.keep_ssd=true: bench=fleet bench.target=self makes " \
        "no SSD directory to keep" in r.stderr
    r = _cli("mode=tune", "bench.target=mlx_lm", cwd=tmp_path)  # it would search knobs
    assert r.returncode == 2 and "so it measures the appliance (bench.target=self)" in r.stderr
    from appliance.bench import check

    class Cfg(dict):
        __getattr__ = dict.get

    from appliance.config.schema import BenchConfig

    def refused(workload, target, overrides):
        cfg = Cfg(BenchConfig().__dict__, workload=workload, target=target)
        return " ".join(check(cfg, overrides))

    assert "batch=serial draft=lookup cache=ram: not used with bench=kv" in refused(
        "kv", "self", ["kv=k8v4", "batch=serial", "draft=lookup", "cache=ram",
                       "batch.prefill_chunk=64", "batch.kv_budget=1GiB"])
    assert "batch.max_rows=2 cache.ram.bytes=1GiB: not used with bench=spec" in refused(
        "spec", "self", ["draft=lookup", "batch.max_rows=2", "cache.ram.bytes=1GiB"])
    assert "cache=none server.max_context=512: not used with bench=prefix" in refused(
        "prefix", "self", ["cache=none", "server.max_context=512", "cache.ssd.bytes=1GiB"])
    assert "kv=k8v4 batch.kv_budget=1GiB: not used with bench=fleet bench.target=mlx_lm" in \
        refused("fleet", "mlx_lm", ["kv=k8v4", "batch.max_rows=4", "batch.prefill_chunk=512",
                                    "batch.kv_budget=1GiB"])
    assert "batch.prefill_chunk=512: not used" in refused(
        "agents", "mlx_lm", ["batch.max_rows=4", "batch.prefill_chunk=512"])
    assert "batch.max_rows=4: not used" in refused("fleet", "http://127.0.0.1:1",
                                                   ["model.dtype=float32", "batch.max_rows=4"])
    assert "bench.mlx_lm_args=--x: no mlx_lm.server runs in bench=decode" in refused(
        "decode", "self", ["bench.mlx_lm_args=--x"])
    # what each passes on stays allowed
    for workload, target, overrides in (
            ("kv", "self", ["kv=k8v4", "batch.prefill_chunk=64", "model.dtype=float32"]),
            ("spec", "self", ["draft=mtp", "kv=turboquant", "batch.compile_step=true"]),
            ("agents", "self", ["cache=tiered", "batch.max_rows=4", "server.max_context=8192"]),
            ("fleet", "mlx_lm", ["batch.max_rows=4", "batch.prefill_chunk=512",
                                 "bench.mlx_lm_args=--x"]),
            ("agents", "self", ["bench.mlx_lm_args=--x"])):
        assert refused(workload, target, overrides) == "", (workload, target)


def test_cli_multirun_prints_one_plan_per_cell(tmp_path):
    r = _cli("-m", "mode=plan", "model.dtype=float32,bfloat16", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("fingerprint: fp_") == 2
    assert "# cell 0: mode=plan model.dtype=float32" in r.stdout
    fps = [ln for ln in r.stdout.splitlines() if ln.startswith("fingerprint:")]
    assert fps[0] != fps[1]  # dtype changes output bits
    assert [p.name for p in tmp_path.iterdir()] == ["multirun"]


def test_cli_help_lists_groups(tmp_path):
    r = _cli("--help", cwd=tmp_path)
    assert r.returncode == 0
    for line in ("kv: affine4, affine8, k8v4, native", "model: hf, local, synthetic, tiny",
                 "batch: continuous, serial", "profile: agent-fleet, m1-max, m4-pro"):
        assert line in r.stdout


def test_a_sweep_of_lists_is_checked_value_by_value():
    """`bench.prefix_tokens=[128],[256]` is two lists to Hydra; the pre-check read each as
    the text '[128]' and refused it ("str is not a ListConfig"), found by a helper's sweep."""
    from appliance.config.hydra_setup import group_options, setup
    from appliance.config.overrides import field_problems

    setup()
    groups = group_options()
    assert field_problems(["bench.prefix_tokens=[128],[256]", "tune.max_rows=[2],[4]",
                           "bench.spec_batches=[1],[2,4]"], groups) == {}
    [(arg, says)] = field_problems(["bench.prefix_tokens=[128],[x]"], groups).items()
    assert arg == "bench.prefix_tokens=[128],[x]"
    assert says == ["bench.prefix_tokens=['x']: 'x' is not an integer"]
