"""mode=tune: search the batch and cache knobs on bench=agents with Hydra's Optuna sweeper.

    appliance mode=tune tune.profile=tuned-cpu [tune.trials=20] [tune.ttft_p95_ms=5000] ...

`launch` starts `appliance --multirun hydra/sweeper=optuna mode=tune ...` with one
`choice(...)` per knob that has several candidates (tune.max_rows, tune.prefill_chunk,
tune.ram_bytes; a knob set on the command line stays fixed). Each trial (`trial`) is one
bench=agents run of its plan, without the anchor; its objective is the aggregate tok/s when
TTFT p95 <= tune.ttft_p95_ms and no request failed. Otherwise it is a penalty below every
feasible trial: -(p95 / bound) when only the bound is missed (closer is better), FAILED on
errors or a refused plan. When the sweep ends, sweep.py's callback calls `write_profile`:
the best feasible trial becomes <tune.profiles_dir>/<tune.profile>.yaml, which
`+profile=<name>` then loads (from ./profiles; a shipped profile's name is refused).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from appliance.config.hydra_setup import profiles_dir

# tune.<field> -> the setting it searches
KNOBS = {"max_rows": "batch.max_rows", "prefill_chunk": "batch.prefill_chunk",
         "ram_bytes": "cache.ram.bytes"}
FAILED = -1e6  # errors or a refused plan: below every other trial
MARK = "# Tuned by `appliance mode=tune`"  # a profile without it is never overwritten
# settings of the measured deployment a tuned profile carries (groups and their keys)
_CARRIED = ("kv", "draft", "batch", "cache")


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def check(cfg, task: list[str], trial: bool) -> list[str]:
    """Every problem with the tune settings (empty: ready to launch, or to run a trial)."""
    from appliance.plan.sizes import parse_size

    t, problems = cfg.tune, []
    chose = any(_key(o) == "bench" for o in task)  # else launch() adds bench=agents
    if cfg.bench.workload != "agents" and (trial or chose):
        problems.append(f"mode=tune measures bench=agents, not bench={cfg.bench.workload}")
    if str(cfg.bench.target) != "self":  # (another server never sees the knobs it searches)
        problems.append(f"bench.target={cfg.bench.target}: mode=tune searches this "
                        "appliance's knobs, so it measures the appliance (bench.target=self)")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(t.profile)):
        problems.append(f"tune.profile={t.profile!r}: a file name (letters, digits, _ . -)")
    elif (Path(t.profiles_dir).resolve() != profiles_dir().resolve()
          and (profiles_dir() / f"{t.profile}.yaml").is_file()):
        problems.append(f"tune.profile={t.profile} is a shipped profile's name: the tuned file "
                        "would hide it wherever it is found; choose another name")
    elif t.profile in _bases(task):
        problems.append(f"tune.profile={t.profile} is also a profile this run is tuned on: "
                        "the tuned file would include itself; choose another name")
    else:
        path = Path(t.profiles_dir) / f"{t.profile}.yaml"
        if path.is_file() and not path.read_text().startswith(MARK):
            problems.append(f"tune.profile={t.profile}: {path} exists and was not written by "
                            "mode=tune; choose another name")
    if t.trials < 1:
        problems.append(f"tune.trials={t.trials} must be >= 1")
    if t.ttft_p95_ms <= 0:
        problems.append(f"tune.ttft_p95_ms={t.ttft_p95_ms} must be > 0")
    for name in ("max_rows", "prefill_chunk"):
        if any(not isinstance(v, int) or v < 1 for v in getattr(t, name)):
            problems.append(f"tune.{name}={list(getattr(t, name))} must be integers >= 1")
    for v in t.ram_bytes:
        try:
            parse_size(v)
        except ValueError as e:
            problems.append(f"tune.ram_bytes: {e}")
    given = {_key(o): o for o in task}
    cache = cfg.cache.kind if cfg.cache.kind != "auto" else (
        "none" if cfg.batch.mode == "serial" else "ram")
    for name, key in KNOBS.items():  # a candidate list that would not be searched
        if not trial and f"tune.{name}" in given and key in given:
            problems.append(f"{given[f'tune.{name}']} {given[key]}: a setting on the command "
                            "line stays fixed, so its candidates would not be tried; drop one")
        elif f"tune.{name}" in given and key == "cache.ram.bytes" and cache in ("none", "ssd"):
            problems.append(f"{given['tune.ram_bytes']}: cache={cache} has no RAM tier to size")
    return problems


def _bases(task: list[str]) -> set[str]:
    """The profiles named on the command line (+profile=a or +profile=[a,b])."""
    return {name.strip() for o in task if _key(o) == "profile"
            for name in o.split("=", 1)[1].strip("[]").split(",")}


def search_space(cfg, plan, task: list[str]) -> list[str]:
    """The sweep's overrides: choice(...) per searched knob, key=value per fixed one."""
    fixed = {_key(o) for o in task}
    out = []
    for name, key in KNOBS.items():
        values = [str(v) for v in getattr(cfg.tune, name)]
        if key in fixed or not values:
            continue
        if key == "cache.ram.bytes" and not plan.cache.ram_bytes:
            continue  # no RAM tier in this plan: nothing to size
        out.append(f"{key}=choice({','.join(values)})" if len(values) > 1
                   else f"{key}={values[0]}")
    return out


def launch(cfg, plan, task: list[str]) -> int:
    """mode=tune as a single run: run the Optuna sweep as a multirun of this command."""
    t = cfg.tune
    base = [o for o in task if _key(o) != "mode"]
    if not any(_key(o) == "bench" for o in base):
        base.insert(0, "bench=agents")
    cmd = [sys.executable, "-m", "appliance.cli", "--multirun", "hydra/sweeper=optuna",
           f"hydra.sweeper.n_trials={t.trials}", "hydra.sweeper.direction=maximize",
           f"hydra.sweeper.sampler.seed={t.seed}", f"hydra.sweeper.study_name=tune-{t.profile}",
           "bench.anchor=none", *base, "mode=tune", *search_space(cfg, plan, task)]
    print("# " + " ".join(cmd[3:]), flush=True)
    from appliance.bench import _interrupt_on_sigterm

    proc = subprocess.Popen(cmd)
    undo = _interrupt_on_sigterm()
    try:
        rc = proc.wait()
    except KeyboardInterrupt:  # let the sweep stop its servers: no SIGKILL, as call() would
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise
    finally:
        undo()
    path = Path(t.profiles_dir) / f"{t.profile}.yaml"
    if rc == 0 and not (path.is_file() and path.read_text().startswith(MARK)):
        print(f"mode=tune: no profile written (no trial met TTFT p95 <= {t.ttft_p95_ms} ms "
              "without errors); see the sweep's sweep.md", file=sys.stderr)
        return 1
    return rc


def objective(summary: dict, bound_ms: float) -> tuple[float, bool]:
    """(value to maximize, feasible)."""
    agg, p95 = summary.get("aggregate_tok_s"), summary.get("ttft_ms_p95")
    if summary.get("errors") or summary.get("abandoned") or agg is None or p95 is None:
        return FAILED, False
    if p95 > bound_ms:
        return -p95 / bound_ms, False
    return float(agg), True


def trial(cfg, plan, outdir: Path, task: list[str]) -> float:
    """One trial: bench=agents on this plan; the objective is also stamped in bench.json."""
    from omegaconf import OmegaConf

    from appliance.bench import report
    from appliance.bench import run as bench

    doc = bench(plan, OmegaConf.to_object(cfg.bench), outdir, tuple(task))
    value, feasible = objective(doc["summary"], cfg.tune.ttft_p95_ms)
    doc["tune"] = {"objective": value, "feasible": feasible,
                   "ttft_p95_bound_ms": cfg.tune.ttft_p95_ms}
    report.write(outdir, doc)
    print(f"TUNE objective={value:.3f} feasible={feasible} | {outdir / 'bench.json'}",
          flush=True)
    return value


def _nest(flat: dict[str, object]) -> dict:
    out: dict = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def profile_text(doc: dict, root: Path, trials: int) -> str:
    """The best trial as a profile: its knobs, plus the deployment it was measured on."""
    overrides = doc["overrides"]
    includes = [p for o in overrides if _key(o) == "profile"
                for p in o.split("=", 1)[1].strip("[]").split(",") if p.strip()]
    defaults = [f"/profile/{p.strip()}" for p in includes]
    defaults += [{f"override /{_key(o)}": o.split("=", 1)[1]} for o in overrides
                 if _key(o) in _CARRIED]
    flat = {_key(o): yaml.safe_load(o.split("=", 1)[1]) for o in overrides
            if _key(o).split(".")[0] in _CARRIED and "." in _key(o)
            and _key(o) != "cache.ssd.path"}
    body = _nest(flat)
    if defaults:
        body = {"defaults": [*defaults, "_self_"], **body}
    lb, s, c = doc["label"], doc["summary"], doc["label"]["bench"]
    header = [
        f"{MARK} (docs/tuning.md) on {lb['date']}.",
        f"# Machine: {lb['machine']['chip']} ({lb['machine']['backend']}, "
        f"{lb['machine']['platform']}); model: {lb['model']['id']} ({lb['model']['dtype']}).",
        f"# Workload: bench=agents agents={c['agents']} turns={c['turns']} "
        f"system={c['system_tokens']} tool={c['tool_tokens']} max_tokens={c['max_tokens']}.",
        f"# Objective: highest aggregate tok/s with TTFT p95 <= "
        f"{doc['tune']['ttft_p95_bound_ms']:g} ms and no errors; {trials} trials.",
        f"# Best: {s['aggregate_tok_s']} tok/s, TTFT p95 {s['ttft_ms_p95']} ms, cache hit "
        f"{s['cache_hit_ratio']}; sweep {root}.",
        "# Measured with: " + " ".join(o for o in overrides
                                       if _key(o).split(".")[0] not in ("hydra", "tune", "mode")),
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False)


def write_profile(config, root: Path, cells: list[Path]) -> Path | None:
    """Write the best feasible trial of a finished tune sweep as a profile."""
    docs = [json.loads((c / "bench.json").read_text()) for c in cells
            if (c / "bench.json").is_file()]
    feasible = [d for d in docs if (d.get("tune") or {}).get("feasible")]
    if not feasible:
        print(f"TUNE no feasible trial (TTFT p95 <= {config.tune.ttft_p95_ms} ms, no errors) "
              f"in {len(cells)}; no profile written", flush=True)
        return None
    best = max(feasible, key=lambda d: d["tune"]["objective"])
    path = Path(config.tune.profiles_dir) / f"{config.tune.profile}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile_text(best, root, len(cells)))
    print(f"TUNE wrote {path}: use +profile={config.tune.profile}", flush=True)
    return path
