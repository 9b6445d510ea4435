"""The command line's field overrides, checked before Hydra composes them: Hydra stops at the
first it cannot apply (`server.port=abc`, `batch.nope=3`) with its own message, and an
unknown group option hides every other problem. A PlanError names them all at once. Also
checked before anything runs: a profile a later one wholly overrides, and a sweep's values."""

from __future__ import annotations

import re
from typing import Any

_ABSENT = object()


def profiles(task_overrides: list[str]) -> tuple[str, ...]:
    """The profiles `+profile=A` / `+profile=[A,B]` name, in order."""
    names: list[str] = []
    for o in task_overrides:
        if o.lstrip("+").startswith("profile="):
            names += [s.strip() for s in o.split("=", 1)[1].strip("[]").split(",") if s.strip()]
    return tuple(names)


def profile_settings(names: tuple[str, ...], sections: tuple[str, ...]) -> list[str]:
    """What the named profiles set in `sections`, as overrides (`bench.agents=4 (+profile=x)`):
    checked as the command line's are, so a profile's bench or tune settings are never
    taken and dropped either."""
    from appliance.config.hydra_setup import profile_files

    files = profile_files()
    return [f"{k}={v} (+profile={name})" for name in names
            for k, v in _profile_items(name, files, groups=False).items()
            if k.split(".")[0] in sections]


def _profile_items(name: str, files: dict, groups: bool = True) -> dict[str, Any]:
    """Every key a profile sets, dotted (`machine.memory_gb`), with its value; with `groups`,
    its group overrides too, as the group (`override /cache: tiered` sets `cache`)."""
    import yaml

    data = yaml.safe_load(files[name].read_text()) if name in files else None
    items: dict[str, Any] = {}

    def flat(prefix: str, node) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                flat(f"{prefix}.{k}", v)
        else:
            items[prefix] = node

    for k, v in (data if isinstance(data, dict) else {}).items():
        if k == "defaults":
            if groups:
                items.update((str(g).split()[-1].strip("/"), o) for item in v or []
                             if isinstance(item, dict) for g, o in item.items())
        else:
            flat(str(k), v)
    return items


def shadowed_profiles(argv: list[str]) -> list[str]:
    """A profile whose every setting a later profile or the command line sets again would be
    accepted and ignored (`+profile=[m1-max,m4-pro]` is an M4 Pro): refused. A sweep
    (`+profile=m1-max,m4-pro`) is checked one value at a time."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except Exception:  # noqa: BLE001  (Hydra refuses it itself, in its own words)
        return []
    given = {a.split("=", 1)[0].lstrip("+~") for a in args}
    problems: list[str] = []
    for o in parsed:
        if o.key_or_group == "profile" and not o.is_delete():
            for v in (o.sweep_iterator() if o.is_sweep_override() else [o.value()]):
                names = tuple(map(str, v)) if isinstance(v, list) else (str(v),)
                problems += [p for p in _shadowed(names, given) if p not in problems]
    return problems


def _shadowed(names: tuple[str, ...], given: set[str]) -> list[str]:
    from appliance.config.hydra_setup import profile_files

    files = profile_files()
    sets = [(n, set(_profile_items(n, files))) for n in names]
    problems = []
    for i, (name, keys) in enumerate(sets):
        by = [n for n, k in sets[i + 1:] if k & keys]
        if keys and keys <= given.union(*(k for _, k in sets[i + 1:])):
            again = " and ".join([*by, *(["the command line"] if keys & given else [])])
            problems.append(
                f"+profile={name}: {again} set{'s' if len(by) < 2 else ''} again every key it "
                f"sets ({', '.join(sorted({k.split('.')[0] for k in keys}))}), so it would be "
                "ignored; name it once, and one machine profile at most")
    return problems


def field_problems(argv: list[str], groups: dict[str, list[str]]) -> dict[str, list[str]]:
    """Per `key=value` argument the schema has no key for, or whose value its type refuses
    (each value of a sweep), what is wrong. Group choices (`kv=...`) are checked by the
    caller; `+key=` (checked after composing: `unknown_keys`), `~key` and hydra.* are left
    alone."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from appliance.config.schema import AppConfig, unknown_keys

    try:
        parsed = OverridesParser.create().parse_overrides(
            [a for a in argv if "=" in a and not a.startswith("-")])
    except Exception:  # noqa: BLE001  (Hydra refuses it itself, in its own words)
        return {}
    schema, problems = OmegaConf.structured(AppConfig), {}
    parser = OverridesParser.create()
    for o in parsed:
        key = o.key_or_group
        if key in groups or key.replace("/", ".").split(".")[0] == "hydra" or o.is_add() \
                or o.is_delete():
            continue
        if OmegaConf.select(schema, key, default=_ABSENT) is _ABSENT:
            nested: dict[str, Any] = {}
            node = nested
            for part in key.split(".")[:-1]:
                node = node.setdefault(part, {})
            node[key.split(".")[-1]] = None
            problems[o.input_line] = unknown_keys(OmegaConf.create(nested))
            continue
        # a sweep's values as Hydra gives them to its jobs: `[128],[256]` is two lists
        values = [parser.parse_override(f"{key}={v}").value()
                  for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.value()]
        for v in values:
            try:
                OmegaConf.update(schema.copy(), key, v, merge=True)
            except OmegaConfBaseException as e:
                why = str(e.msg).splitlines()[0]  # (without OmegaConf's object dump)
                problems.setdefault(o.input_line, []).append(_said(key, v, why))
    return problems


# OmegaConf's "Value 'abc' of type 'str' could not be converted to Integer", in our words
_TYPES = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false"}


def _said(key: str, value, why: str) -> str:
    m = re.fullmatch(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", why)
    if not m or m[2] not in _TYPES:
        return f"{key}={value!r}: {why}"
    if m[1] == str(value):
        return f"{key}={value!r} is not {_TYPES[m[2]]}"
    return f"{key}={value!r}: {m[1]!r} is not {_TYPES[m[2]]}"  # (an item of a list)


def sweep_problems(argv: list[str]) -> list[str]:
    """A multirun's plan problems at each swept value (the other sweeps at their first), found
    before any cell runs: `batch.max_rows=4,x` ran the bench at 4, then stopped at x.
    Combinations are checked as their cells come up."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [a for a in argv if "=" in a and not a.startswith("-") and not a.startswith("hydra")]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
        values = {o.input_line: [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
                  for o in parsed if o.is_sweep_override()}
    except Exception:  # noqa: BLE001  (ranges, intervals, Optuna's: Hydra checks them)
        return []
    firsts = [values[a][0] if a in values else a for a in args]
    problems: list[str] = []
    for i, arg in enumerate(args):
        for cell in values.get(arg, [])[1:]:
            found = remainder_problems([*firsts[:i], cell, *firsts[i + 1:]], [])
            problems += [p for p in found if p not in problems]
    if values:
        problems += [p for p in remainder_problems(firsts, []) if p not in problems]
    return problems


def remainder_problems(argv: list[str], skip: list[str]) -> list[str]:
    """The plan's own problems with every override but those in `skip` (the ones already
    found wrong), so that `kv=nope batch.max_rows=-1` names both. Single runs only."""
    from hydra import compose, initialize_config_dir

    from appliance.config.hydra_setup import conf_dir
    from appliance.plan import PlanError, resolve

    keep = [a for a in argv if "=" in a and not a.startswith("-") and a not in skip
            and not a.startswith("hydra")]
    try:
        with initialize_config_dir(str(conf_dir()), version_base="1.3"):
            cfg = compose("config", overrides=keep)
        resolve(cfg, profiles=profiles(keep))
    except PlanError as e:
        return e.problems
    except Exception:  # noqa: BLE001  (what is left does not compose: the found ones stand)
        return []
    return []
