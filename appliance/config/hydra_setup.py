"""Where conf/ and profiles/ live, and how profiles become a Hydra group.

`+profile=NAME` must load `profiles/NAME.yaml` although profiles sit beside
conf/, not inside it: each profile file is stored in Hydra's ConfigStore as
option NAME of group `profile`, merged at the global package.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from appliance.config.schema import register

_PKG = Path(__file__).resolve().parent.parent


def _first_dir(*candidates: Path) -> Path:
    for c in candidates:
        if c.is_dir():
            return c
    raise FileNotFoundError(f"none of {[str(c) for c in candidates]} exists")


def conf_dir() -> Path:
    """conf/ of a source checkout (editable install), else the copy in the wheel."""
    return _first_dir(_PKG.parent / "conf", _PKG / "_conf")


def profiles_dir() -> Path:
    return _first_dir(_PKG.parent / "profiles", _PKG / "_profiles")


def profile_files() -> dict[str, Path]:
    """Every profile by name: the shipped ones, then ./profiles of the working directory
    (where mode=tune writes; a local file wins over a shipped one of the same name)."""
    found: dict[str, Path] = {}
    for d in dict.fromkeys(p.resolve() for p in (profiles_dir(), Path("profiles"))):
        if d.is_dir():
            found.update((p.stem, p) for p in sorted(d.glob("*.yaml")))
    return found


def group_options() -> dict[str, list[str]]:
    """Every config group and its options, profiles included (for validation and help)."""
    groups = {
        d.name: sorted(p.stem for p in d.glob("*.yaml"))
        for d in sorted(conf_dir().iterdir())
        if d.is_dir() and d.name != "hydra"
    }
    groups["profile"] = sorted(profile_files())
    return groups


def _run_dir(mode: str) -> str:
    """Single runs write nothing to the user's directory, except a bench's results."""
    if mode != "bench":
        return "."
    import datetime

    return "bench/" + datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def setup() -> None:
    """Register the schema, the profiles and the run-dir resolver. Idempotent."""
    if not OmegaConf.has_resolver("appliance_run_dir"):
        OmegaConf.register_new_resolver("appliance_run_dir", _run_dir)
    register()
    cs = ConfigStore.instance()
    for name, path in profile_files().items():
        data = yaml.safe_load(path.read_text()) or {}
        cs.store(group="profile", name=name, node=OmegaConf.create(data), package="_global_")
