"""Where a plan's model comes from: the embedded model, a local directory, a Hugging Face
repo (its config.json only, at plan time) or a synthetic shape of random weights; and how
its weights are held (the dtype cast, quantized layers held dense)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from appliance.plan.errors import unread
from appliance.plan.machine import GiB
from appliance.plan.model_info import COMPUTE_BYTES, ModelInfo

EMBEDDED_MODEL = Path(__file__).resolve().parent.parent / "embedded" / "tiny"
SOURCES = ("tiny", "local", "hf", "synthetic")


# The fields only some sources read, and their unset values: set for another source, a
# field is refused, never ignored (model.path without model=local served the embedded model)
READS = {"path": ("local",), "repo": ("hf",), "revision": ("hf",), "shape": ("synthetic",),
         "bits": ("synthetic",), "seed": ("synthetic",)}
UNSET = {"path": None, "repo": None, "revision": None, "shape": None, "bits": None, "seed": 0}


def locate_model(m: Any, problems: list[str]) -> tuple[Path | None, str]:
    """The local directory holding config.json and weights, and the served id."""
    if bad := unread("model", m, READS, UNSET, "model", m.source):
        problems += bad
        return None, ""
    if m.source == "tiny":
        return EMBEDDED_MODEL, m.name or "appliance-tiny"
    if m.source == "local":
        if not m.path:
            problems.append("model.path is required with model=local (an mlx-lm model directory)")
            return None, ""
        p = Path(m.path).expanduser().resolve()
        if not p.is_dir():
            problems.append(f"model.path={m.path!r} is not a directory")
            return None, ""
        return p, m.name or p.name
    if m.source == "synthetic":
        from appliance.models.synthetic import SHAPES, TINY, synthetic_dir

        if m.shape not in SHAPES and m.shape not in TINY:
            problems.append(f"model.shape={m.shape!r} is not a known shape; valid choices: "
                            f"{', '.join([*SHAPES, *TINY])}")
            return None, ""
        if m.bits not in (None, 4, 8):
            problems.append(f"model.bits={m.bits} is not supported; valid choices: null, 4, 8")
            return None, ""
        return synthetic_dir(m.shape, synthetic_dtype(m), m.bits, m.seed), \
            m.name or f"synthetic-{m.shape}" + (f"-{m.bits}bit" if m.bits else "")
    if m.source == "hf":
        if not m.repo:
            problems.append("model.repo is required with model=hf (a Hugging Face repo id)")
            return None, ""
        try:  # config.json and headers only; mlx_lm.load fetches weights at serve time
            from huggingface_hub import snapshot_download

            p = Path(snapshot_download(m.repo, revision=m.revision,
                                       allow_patterns=["config.json"]))
        except Exception as e:
            problems.append(f"model.repo={m.repo!r}: cannot fetch its config.json ({e})")
            return None, ""
        return p, m.name or m.repo
    return None, ""


def synthetic_dtype(m) -> str:
    from appliance.models.synthetic import SHAPES, TINY

    shape = SHAPES.get(m.shape) or TINY[m.shape]
    return shape["torch_dtype"] if m.dtype == "auto" else m.dtype


def weights_resident(info: ModelInfo, dtype: str) -> int:
    """Bytes the weights occupy once cast to `dtype` (quantized blocks unchanged)."""
    if dtype == info.checkpoint_dtype:
        return info.weight_bytes
    delta = COMPUTE_BYTES[dtype] - COMPUTE_BYTES.get(info.checkpoint_dtype, 4)
    return info.weight_bytes + delta * info.float_weight_elements


def config_dict(m: Any, path: Path | None) -> dict:
    """The model's config.json as a dict (synthetic shapes: the config they are built from)."""
    import json

    if m.source == "synthetic":
        from appliance.models.synthetic import config_for

        return config_for(m.shape, synthetic_dtype(m), m.bits)
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return {}


def dense_bytes(info, dtype: str) -> int:
    """The weights held dense in `dtype`: the quantized ones unpacked, without their affine
    scales and biases (two a group, counted among the float elements)."""
    group = int(info.quantization.split("/g")[1]) if info.quantization else 0
    unpacked = info.parameters - info.float_weight_elements
    return (info.parameters - (2 * unpacked // group if group else 0)) * COMPUTE_BYTES[dtype]


def dequantize(value: Any, info, dtype: str, backend: str, usable: int,
                why: dict[str, str], problems: list[str]) -> bool:
    """model.dequantize: hold a quantized model's layers dense in `dtype`. auto: where MLX
    runs on CUDA, whose quantized matmuls are slow over many tokens, and the dense weights
    take at most half of usable memory (the rest stays for KV and the prefix cache)."""
    if value not in ("auto", True, False):
        problems.append(f"model.dequantize={value!r}; valid choices: auto, true, false")
        return False
    if info.quantization is None:
        if value is True:
            problems.append("model.dequantize=true but the model is not quantized; valid "
                            "choices for it: auto, false")
        return False
    need = dense_bytes(info, dtype)
    if value != "auto":
        return value
    dense = backend == "cuda" and need <= usable // 2
    why["model.dequantize"] = (
        f"dequantize={str(dense).lower()}: " + (
            f"the {info.quantization} weights held dense in {dtype} ({need / GiB:.1f} GiB of "
            f"{usable / GiB:.1f} usable): on MLX's CUDA backend quantized matmuls over many "
            "tokens run several times slower than dense ones (an 8B 4-bit 16-row decode step "
            "60 ms against 11 ms on an H200); one-row steps cost the same"
            if dense else
            f"the weights stay {info.quantization}" + (
                f": held dense they would need {need / GiB:.1f} GiB, over half of the "
                f"{usable / GiB:.1f} GiB usable" if backend == "cuda" else
                f": dense copies are derived only on CUDA, where quantized matmuls over many "
                f"tokens were measured slow (not on {backend})")))
    return dense
