"""The `draft` section of the plan: which proposer speculative decoding uses, and its cost.

Options (`conf/draft/*.yaml`): `none`; `lookup` (n-grams of the row's own prompt and
output); `model` (a small draft model with the target's tokenizer); `mtp` (a multi-token
prediction head, from the checkpoint or a head file). A field an option does not read is
refused when set, never ignored. The draft's weights and KV count in the memory budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.plan.errors import unread

KINDS = ("none", "lookup", "model", "mtp")
SOURCES = ("embedded", "local", "hf")
EMBEDDED_DRAFT = Path(__file__).resolve().parent.parent / "embedded" / "draft"
MAX_K = 16

DEFAULTS = {"k": 0, "adaptive": True, "ngram_min": None, "ngram_max": None, "source": None,
            "path": None, "repo": None, "revision": None, "head": None}
READS = {"none": (), "lookup": ("k", "adaptive", "ngram_min", "ngram_max"),
         "model": ("k", "adaptive", "source", "path", "repo", "revision"),
         "mtp": ("k", "adaptive", "head")}
READERS = {f: tuple(k for k, fields in READS.items() if f in fields) for f in DEFAULTS}
# draft=model's fields each source reads (draft.path without draft.source=local served the
# embedded draft)
SOURCE_READS = {"path": ("local",), "repo": ("hf",), "revision": ("hf",)}


@dataclass(frozen=True)
class DraftPlan:
    kind: str  # none | lookup | model | mtp
    k: int = 0  # most tokens a row proposes per step
    adaptive: bool = True  # k shrinks / rows pause when drafts fail or cost more than they save
    ngram_min: int | None = None  # lookup
    ngram_max: int | None = None
    path: str | None = None  # model: the draft model's directory; mtp: the head's weights
    head: str | None = None  # mtp: "checkpoint" or the head file's path
    weight_bytes: int = 0  # resident draft weights (model, mtp head)
    kv_bytes_per_token: int = 0  # the draft's own KV per token of a row
    verify: str = ""  # how proposals are checked, for the printed plan
    content: str = ""  # identifies the draft's weights (content, not location)


def resolve_draft(d: Any, target_dir: Path | None, info, dtype: str, batch_mode: str,
                  problems: list[str]) -> DraftPlan | None:
    """The draft plan for config section `d` against the target model (`info`, in
    `target_dir`, computing in `dtype`). Problems are appended, naming the choices."""
    from appliance.plan.model_info import COMPUTE_BYTES

    dtype_bytes = COMPUTE_BYTES[dtype]
    if d.kind not in KINDS:
        problems.append(f"draft.kind={d.kind!r} is not an option; valid choices: "
                        f"{', '.join(KINDS)}")
        return None
    problems += unread("draft", d, READERS, DEFAULTS, "draft", d.kind)
    if d.kind == "none":
        return DraftPlan(kind="none")
    n = len(problems)
    if not 1 <= d.k <= MAX_K:
        problems.append(f"draft.k={d.k} must be in 1..{MAX_K}")
    if batch_mode != "continuous":
        problems.append(f"draft={d.kind} with batch={batch_mode}: speculation runs in the "
                        "continuous batch; valid choices: batch=continuous, or draft=none")
    verify = ("one forward pass verifies every row's proposals together; a row keeps the "
              "drafts its own samples confirm" if d.kind == "lookup" else
              "one forward pass verifies every row's proposals together; temperature 0 keeps "
              "drafts equal to the target's argmax, sampling keeps each with probability "
              "min(1, p/q) and resamples from max(0, p-q) at the first rejection")
    if "recurrent" in info.layer_kinds:
        verify += "; recurrent layers return to a snapshot and re-feed the kept tokens"
    verify += "; a seeded sampled row proposes nothing (its text stays reproducible)"
    if d.kind == "lookup":
        lo, hi = d.ngram_min, d.ngram_max
        if lo is None or hi is None or not 1 <= lo <= hi <= 16:
            problems.append(f"draft.ngram_min={lo}, draft.ngram_max={hi}: need "
                            "1 <= ngram_min <= ngram_max <= 16")
        return None if len(problems) > n else DraftPlan(
            kind="lookup", k=d.k, adaptive=d.adaptive, ngram_min=lo, ngram_max=hi,
            verify=verify)
    if d.kind == "model":
        path = _draft_dir(d, problems)
        if path is None:
            return None
        from appliance.plan.model_info import inspect_model

        try:
            dinfo = inspect_model(path)
        except Exception as e:
            problems.append(f"draft model at {path}: {e}")
            return None
        if not _same_tokenizer(target_dir, path):
            problems.append(f"draft model at {path} does not have the target's tokenizer "
                            "(tokenizer.json vocabularies differ); valid choices: a draft "
                            "trained with the same tokenizer, or draft=lookup")
        if dinfo.vocab_size != info.vocab_size:
            problems.append(f"draft model vocab_size={dinfo.vocab_size} but the target's is "
                            f"{info.vocab_size}")
        if set(dinfo.layer_kinds) - {"full"}:
            problems.append(f"draft model layers {sorted(set(dinfo.layer_kinds))}: only "
                            "full-attention draft models are supported")
        per_tok = (len(dinfo.layer_kinds) * 2 * (dinfo.num_kv_heads or 0)
                   * (dinfo.head_dim or 0) * dtype_bytes)
        # loaded in the target's compute dtype (quantized blocks stay as they are)
        weights = dinfo.weight_bytes + dinfo.float_weight_elements * (
            dtype_bytes - COMPUTE_BYTES.get(dinfo.checkpoint_dtype, 4))
        return None if len(problems) > n else DraftPlan(
            kind="model", k=d.k, adaptive=d.adaptive, path=str(path), weight_bytes=weights,
            kv_bytes_per_token=per_tok, verify=verify,
            content=f"{dinfo.config_sha256[:16]}-{dinfo.weights_sha256[:16]}")
    # mtp
    from appliance.models import mtp
    from appliance.plan.model_info import weights_digest

    head = d.head or "checkpoint"
    if head == "checkpoint":
        if target_dir is None or not mtp.has_mtp(target_dir):
            problems.append(f"draft=mtp: model {info.architecture} at {target_dir} has no MTP "
                            "head in its checkpoint; valid choices: draft.head=/path/to/"
                            "head.safetensors, draft=lookup, draft=model, draft=none")
            return None
        weights = mtp.mtp_bytes(target_dir)
        where = str(target_dir)
    else:
        p = Path(head).expanduser()
        if not p.is_file():
            problems.append(f"draft.head={head!r} is not a file; valid choices: checkpoint "
                            "(the model's own mtp.* weights) or a path to a head file")
            return None
        weights = mtp.mtp_bytes(target_dir, head_file=str(p))
        where = str(p.resolve())
    per_tok = 2 * (info.num_kv_heads or 0) * (info.head_dim or 0) * dtype_bytes
    return None if len(problems) > n else DraftPlan(
        kind="mtp", k=d.k, adaptive=d.adaptive, path=where, head=head, weight_bytes=weights,
        kv_bytes_per_token=per_tok, verify=verify,
        content=weights_digest(mtp._sources(target_dir, None if head == "checkpoint" else p))
        [:16])


def _draft_dir(d: Any, problems: list[str]) -> Path | None:
    src = d.source or "embedded"
    if src not in SOURCES:
        problems.append(f"draft.source={src!r} is not an option; valid choices: "
                        f"{', '.join(SOURCES)}")
        return None
    if bad := unread("draft", d, SOURCE_READS, DEFAULTS, "draft.source", src):
        problems += bad
        return None
    if src == "embedded":
        p = EMBEDDED_DRAFT
    elif src == "local":
        if not d.path:
            problems.append("draft.path is required with draft.source=local")
            return None
        p = Path(d.path).expanduser().resolve()
    else:
        if not d.repo:
            problems.append("draft.repo is required with draft.source=hf")
            return None
        try:
            from huggingface_hub import snapshot_download

            p = Path(snapshot_download(d.repo, revision=d.revision, allow_patterns=[
                "config.json", "tokenizer.json", "tokenizer_config.json", "*.safetensors"]))
        except Exception as e:
            problems.append(f"draft.repo={d.repo!r}: cannot fetch it ({e})")
            return None
    if not (p / "config.json").is_file():
        problems.append(f"draft model directory {p} has no config.json")
        return None
    return p


def _vocab(path: Path) -> tuple | None:
    f = path / "tokenizer.json"
    if not f.is_file():
        return None
    t = json.loads(f.read_text())
    added = sorted((a["id"], a["content"]) for a in t.get("added_tokens", []))
    return (json.dumps(t.get("model", {}).get("vocab"), sort_keys=True), tuple(added))


def _same_tokenizer(a: Path | None, b: Path) -> bool:
    va = _vocab(a) if a is not None else None
    return va is not None and va == _vocab(b)
