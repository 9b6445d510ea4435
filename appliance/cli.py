"""The `appliance` command: Hydra composes conf/ + profiles/, resolve() makes the plan.

    appliance                                   serve (mode=serve, the default)
    appliance mode=plan [overrides]             print the plan; exit 0, or 2 on PlanError
    appliance -m mode=plan kv=a,b               one plan per sweep cell
    appliance mode=bench [bench=decode]         measure; results in ./bench/<time>/
    appliance -m mode=bench batch.max_rows=4,8  one bench per cell, then sweep.md/csv/png
    appliance mode=tune tune.profile=NAME       search batch/cache knobs on bench=agents
                                                (Optuna); writes profiles/NAME.yaml
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import appliance  # noqa: F401  (BLAS preload before mlx)
from appliance.config.hydra_setup import conf_dir, group_options, setup
from appliance.config.overrides import (
    field_problems,
    remainder_problems,
    shadowed_profiles,
    sweep_problems,
)
from appliance.config.overrides import profiles as _profiles
from appliance.plan import PlanError, resolve

MODES = ("serve", "plan", "bench", "tune")
log = logging.getLogger("appliance")
_exit_code = 0
_objective: float | None = None  # a mode=tune trial's, returned to the Optuna sweeper


def _override_problems(argv: list[str]) -> list[str]:
    """Unknown group options, keys and ill-typed values, found before Hydra composes (it
    would stop at the first); with any, the plan's own problems with the rest too."""
    groups = group_options()
    problems, bad = [], []
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key not in groups:
            continue
        inner = re.sub(r"^(choice|glob)\((.*)\)$", r"\2", value.strip())
        # (`+profile=[a,b],[c,d]` sweeps two lists: each name loses its brackets)
        for v in filter(None, (s.strip().strip("[]").strip() for s in inner.split(","))):
            if v not in groups[key]:
                where = "profiles/" if key == "profile" else f"conf/{key}/"
                problems.append(f"{key}={v!r} is not an option ({where}); "
                                f"valid choices: {', '.join(groups[key])}")
                bad.append(arg)
    for arg, says in field_problems(argv, groups).items():
        problems += says
        bad.append(arg)
    problems += shadowed_profiles(argv)
    if problems and not {"-m", "--multirun"} & set(argv):
        problems += [p for p in remainder_problems(argv, bad) if p not in problems]
    elif not problems and {"-m", "--multirun"} & set(argv):
        problems = sweep_problems(argv)
    return problems


def run(cfg) -> int:
    """One Hydra job: resolve the plan, then print it, serve it, bench it or tune it.
    Returns an exit code (a mode=tune trial leaves its objective in `_objective`)."""
    global _objective
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    hc = HydraConfig.get()
    # the command line as typed: an override such as server.api_key='${oc.env:KEY}' stays
    # text here (resolve() reads its value, and says so if the variable is unset)
    task = [str(o) for o in OmegaConf.to_container(hc.overrides.task, resolve=False)]
    problems = [] if cfg.mode in MODES else [
        f"mode={cfg.mode!r} is not supported; valid choices: {', '.join(MODES)}"]
    from appliance.config.overrides import profile_settings

    # a profile's bench and tune settings are checked as the command line's
    checked = [*task, *profile_settings(_profiles(task), ("bench", "tune"))]
    for section, readers in (("bench", ("bench", "tune")), ("tune", ("tune",))):
        given = [o for o in checked if o.lstrip("+~").split("=", 1)[0].split(".")[0] == section]
        if given and cfg.mode not in readers:  # never accepted and ignored
            problems.append(f"{' '.join(given)}: only mode={' or mode='.join(readers)} reads "
                            f"the {section} settings; drop them, or set that mode")
    if cfg.mode in ("bench", "tune"):
        from appliance.bench import check

        bench_cfg = cfg.bench
        if cfg.mode == "tune" and not any(o.split("=", 1)[0] == "bench" for o in task):
            # mode=tune measures bench=agents: its trials get it (tune.launch), so its
            # fields are checked against that workload, not the default one
            bench_cfg = OmegaConf.merge(cfg.bench, {"workload": "agents"})
        problems += check(bench_cfg, checked)
    if cfg.mode == "tune":
        from appliance.bench import tune

        problems += tune.check(cfg, task, trial=hc.mode == RunMode.MULTIRUN)
    try:
        plan = resolve(cfg, profiles=_profiles(task))
    except PlanError as e:
        if cfg.mode == "tune" and hc.mode == RunMode.MULTIRUN and not problems:
            # a plan refused at a trial's knobs is a bad point of the search, not its end
            print(PlanError(e.problems).render(), file=sys.stderr)
            _objective = tune.FAILED
            return 0
        problems += e.problems
    if not problems and _serves_agents(cfg, hc.mode == RunMode.MULTIRUN):
        from appliance.bench.agents import context_problems

        problems += context_problems(plan, cfg.bench)
    if not problems and cfg.mode == "bench":
        from appliance.bench import keep_ssd_problems

        problems += keep_ssd_problems(cfg.bench, plan, checked)
    if problems:
        print(PlanError(problems).render(), file=sys.stderr)
        if cfg.mode == "bench" and hc.mode != RunMode.MULTIRUN:
            _drop_if_empty(hc.runtime.output_dir)  # a refused bench leaves no ./bench/<time>/
        elif cfg.mode == "bench":  # a sweep's cell: its report row says why
            Path(hc.runtime.output_dir, "error.txt").write_text(
                "refused: " + "; ".join(problems) + "\n")
        return 2

    if hc.mode == RunMode.MULTIRUN:
        print(f"# cell {hc.job.num}: {' '.join(task)}")
    if cfg.mode == "plan":
        print(plan.to_yaml(), end="")
        return 0
    if cfg.mode == "bench":
        from appliance.bench import run as bench

        try:
            bench(plan, OmegaConf.to_object(cfg.bench), Path(hc.runtime.output_dir),
                  tuple(task))
        except Exception as e:
            return _failed(e, Path(hc.runtime.output_dir), cfg.bench.target)
        return 0
    if cfg.mode == "tune":
        from appliance.bench import tune

        if hc.mode != RunMode.MULTIRUN:
            return tune.launch(cfg, plan, task)
        try:
            _objective = tune.trial(cfg, plan, Path(hc.runtime.output_dir), task)
        except Exception as e:
            _objective = tune.FAILED
            _failed(e, Path(hc.runtime.output_dir), "self")
        return 0
    from appliance.serve import serve

    return serve(plan)  # 0, or EXIT_ENGINE_FAILED for a supervisor to restart it


def _failed(e: Exception, out: Path, target: str) -> int:
    """A measurement that failed at run time (a server that did not start, a target that
    does not answer): said on stderr and in the cell's error.txt, with its traceback, so a
    sweep goes on to its other cells and its report shows this one failed. Exit code 1."""
    import traceback

    what = f"{type(e).__name__}: {e}" + ("" if target == "self" else f" (bench.target={target})")
    out.mkdir(parents=True, exist_ok=True)
    (out / "error.txt").write_text(what + "\n\n" + "".join(traceback.format_exception(e)))
    print(f"appliance: the bench failed: {what}; traceback in {out / 'error.txt'}",
          file=sys.stderr)
    return 1


def _drop_if_empty(run_dir: str) -> None:
    """A single bench's ./bench/<time>/, and ./bench, where nothing was written in them."""
    d = Path(run_dir).absolute()
    if d.parent.name != "bench" or d == Path.cwd():  # (only the layout _run_dir makes)
        return
    for p in (d, d.parent):
        try:
            p.rmdir()  # (an empty one only)
        except OSError:
            return


def _serves_agents(cfg, multirun: bool) -> bool:
    """A bench=agents run the appliance serves, or a tune launch (checked once, not per
    trial): its workload must fit the plan's context (`agents.context_problems`)."""
    if cfg.mode == "tune":
        return not multirun
    return cfg.mode == "bench" and cfg.bench.workload == "agents" and cfg.bench.target == "self"


def main() -> None:
    setup()
    argv = sys.argv[1:]
    problems = _override_problems(argv)
    if problems:
        print(PlanError(problems).render(), file=sys.stderr)
        sys.exit(2)

    import hydra

    @hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")
    def _job(cfg) -> float | None:
        global _exit_code, _objective
        _objective = None
        try:
            _exit_code = max(_exit_code, run(cfg))
        except KeyboardInterrupt:  # (before a bench wrote anything: no ./bench/<time>/)
            from hydra.core.hydra_config import HydraConfig
            from hydra.types import RunMode

            hc = HydraConfig.get()
            if hc.mode != RunMode.MULTIRUN:
                _drop_if_empty(hc.runtime.output_dir)
            raise
        return _objective  # what Hydra's Optuna sweeper maximizes (mode=tune trials)

    try:
        _job()
    except SystemExit as e:  # Hydra exits 1 on a config it cannot compose: a plan error too
        sys.exit(2 if e.code == 1 else e.code)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: servers a bench started are stopped
        from appliance.bench import Terminated

        term = isinstance(e, Terminated)
        print(f"appliance: {'terminated' if term else 'interrupted'}", file=sys.stderr)
        sys.exit(128 + (15 if term else 2))  # as the shell reports a process the signal ended
    sys.exit(_exit_code)


if __name__ == "__main__":
    main()
