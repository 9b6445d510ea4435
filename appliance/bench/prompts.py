"""Deterministic prompt text, sized in the model's own tokens.

The corpus is this Python's standard library source (top-level *.py, sorted by
name): present on every machine, code-like (the workload is coding agents),
and needing no download. Texts are token slices of it, decoded back, so their
length is "about N tokens" of the served model's tokenizer, whatever it is.
"""

from __future__ import annotations

import json
import logging
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from appliance.plan import ExecutionPlan


def model_dir(plan: ExecutionPlan) -> Path:
    """The local directory holding the plan's model (an hf repo resolves to its snapshot,
    a synthetic shape is written the first time)."""
    if plan.model.synthetic:
        from appliance.models import materialize

        return materialize(plan.model)
    p = Path(plan.model.path).expanduser()
    if p.is_dir():
        return p.resolve()
    from mlx_lm.utils import _download  # what mlx_lm.load itself uses to find a repo's files

    return Path(_download(plan.model.path, revision=plan.model.revision))


def load_tokenizer(path: Path):
    """The tokenizer exactly as mlx_lm.load builds it (EOS ids from config.json included)."""
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    # whole corpus files are tokenized and then sliced into prompts: transformers' warning
    # that a sequence exceeds the model's length is about text no request carries
    logging.getLogger("transformers.tokenization_utils_base").setLevel(logging.ERROR)
    config = json.loads((path / "config.json").read_text())
    return mlx_load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))


def eos_bias(tokenizer) -> dict[str, float]:
    """logit_bias banning every EOS id, so every request runs exactly max_tokens."""
    return {str(i): -100.0 for i in sorted(tokenizer.eos_token_ids)}


def _corpus_files() -> list[Path]:
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def corpus_tokens(tokenizer, n: int) -> list[int]:
    """The first `n` tokens of the corpus (files tokenized one by one until enough)."""
    ids: list[int] = []
    for f in _corpus_files():
        ids += tokenizer.encode(f.read_text(encoding="utf-8", errors="replace") + "\n",
                                add_special_tokens=False)
        if len(ids) >= n:
            return ids[:n]
    raise RuntimeError(f"the corpus has only {len(ids)} tokens; {n} are needed")


@dataclass(frozen=True)
class FleetPrompts:
    system: str  # shared by every request
    users: list[str]  # distinct user turns, handed out in order (warm-up first)


def fleet_prompts(tokenizer, system_tokens: int, user_tokens: int, n_users: int) -> FleetPrompts:
    """One shared system prompt and `n_users` distinct user turns (disjoint corpus slices)."""
    ids = corpus_tokens(tokenizer, system_tokens + user_tokens * n_users)
    system = tokenizer.decode(ids[:system_tokens])
    users = [tokenizer.decode(ids[system_tokens + k * user_tokens:
                                  system_tokens + (k + 1) * user_tokens])
             for k in range(n_users)]
    return FleetPrompts(system, users)


# A short, fixed prompt for B=1 decode: prefill cost is negligible next to decode.
DECODE_PROMPT = "def fibonacci(n):\n"


def heldout_tokens(tokenizer, n: int) -> list[int]:
    """`n` tokens of the held-out stdlib files (appliance/embedded/train.py keeps them out of
    the embedded model's training), cycled when they run short: text the model never saw."""
    from appliance.embedded.train import load_corpus

    ids: list[int] = []
    for _, text in load_corpus()[2]:
        ids += tokenizer.encode(text + "\n", add_special_tokens=False)
        if len(ids) >= n:
            return ids[:n]
    if not ids:
        raise RuntimeError("the held-out corpus is empty")
    return (ids * (n // len(ids) + 1))[:n]
