"""The KV scheme of a plan: which layers are quantized, how, and their true bytes per token.

Schemes (`conf/kv/`): `native` (the compute dtype), `affine` (`mx.quantize`: per group of
`group_size` elements a scale and a bias in the compute dtype; keys and values may have
their own bits: `k8v4`), `turboquant` (norm + rotation + Lloyd-Max codes: `engine/kv/
turboquant.py`). Only full-attention
layers are quantized: sliding-window and recurrent layers stay native, and so do
`keep_layers` (by default the first 2 and last 2 attention layers of a dense model, where
quantization error costs most: vLLM's and aither's boundary layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from appliance.plan.errors import unread
from appliance.plan.model_info import COMPUTE_BYTES, ModelInfo

SCHEMES = ("native", "affine", "turboquant")
TURBO_BITS = (2, 3, 3.5, 4)
ROTATIONS = ("hadamard", "orthogonal")
AFFINE_BITS = (2, 3, 4, 5, 6, 8)  # what mx.quantize packs
GROUP_SIZES = (32, 64, 128)
BOUNDARY = 2  # attention layers kept native at each end of a dense model
NATIVE_CUDA_DIMS = (64, 128, 256)  # head dims of the masked decode kernels (engine/kv/native_cuda)
# The conf/kv/ options, for the plan's per-option capacity table.
def _options() -> dict:
    """conf/kv/<option>.yaml's scheme and bits (what sets one option apart), native first."""
    import yaml

    from appliance.config.hydra_setup import conf_dir

    out = {}
    for f in sorted((conf_dir() / "kv").glob("*.yaml"), key=lambda f: (f.stem != "native", f.stem)):
        d = yaml.safe_load(f.read_text()) or {}
        out[f.stem] = {"scheme": d.get("scheme", "native"), "key_bits": d.get("key_bits"),
                       "value_bits": d.get("value_bits")}
    return out


OPTIONS = _options()
# The schema's defaults: a field left at its default is not "set".
UNSET = {"key_bits": None, "value_bits": None, "group_size": 64, "start": 0,
         "keep_layers": None, "rotation": "hadamard", "rotation_seed": 0}
# The schemes each field is read by: set for another scheme, a field is refused
READS = {"key_bits": ("affine", "turboquant"), "value_bits": ("affine", "turboquant"),
         "group_size": ("affine",), "start": ("affine", "turboquant"),
         "keep_layers": ("affine", "turboquant"), "rotation": ("turboquant",),
         "rotation_seed": ("turboquant",)}
MLA_ARCHITECTURES = ("deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe_lite", "minicpm3")


@dataclass(frozen=True)
class KVPlan:
    scheme: str  # native | affine | turboquant
    dtype: str  # the compute dtype (native layers; scales and biases of affine layers)
    key_bits: float | None
    value_bits: float | None
    group_size: int | None  # affine
    rotation: str | None  # turboquant: hadamard | orthogonal
    rotation_seed: int | None  # turboquant
    head_dim: int | None
    start: int  # a row's KV stays native until it holds this many tokens
    keep_layers: tuple[int, ...]  # full-attention layers held native
    quantized_layers: tuple[int, ...]  # full-attention layers held quantized
    attention: str  # how decode attends over stored codes, on this backend
    bytes_per_token: int  # all growing (full-attention) layers, K and V, as stored
    native_bytes_per_token: int  # the same layers in the compute dtype
    sliding_bytes_per_token: int  # sliding layers (native), up to sliding_window tokens
    layers: dict  # per layer kind present: how it is held and its bytes per token

    def fingerprint_key(self) -> list:
        """Everything that changes the stored bytes or the tokens."""
        key = [self.scheme, self.dtype, self.key_bits, self.value_bits, self.group_size,
               self.rotation, self.rotation_seed, self.start, list(self.quantized_layers)]
        fractional = any(b is not None and b != int(b) for b in (self.key_bits,
                                                                  self.value_bits))
        return key + ["outlier-channel split"] if fractional else key


def full_row_bytes(tokens: int, per_token: int, native_per_token: int = 0, start: int = 0,
                   spec: int = 0) -> int:
    """One row's most bytes on its growing (full-attention) layers: below `start` (plus the
    `spec` slots a verify pass's padding may write past it) native, after it encoded. A row
    being prefilled may hold one chunk more natively (`prefill_extra`). Admission
    (engine/budget.py) and the plan count with it."""
    full = per_token * tokens
    if start and native_per_token > per_token:
        full = max(full, native_per_token * min(tokens, start + spec))
    return full


def prefill_extra(per_token: int, native_per_token: int, start: int, spec: int,
                  chunk: int) -> int:
    """What a row being prefilled may hold beyond `full_row_bytes`: a row, lone or batched,
    is encoded after the chunk that carries it to `start` (mlx-lm's generate_step
    arithmetic), so that chunk may carry it past `start` natively. As many rows as are
    prefilled together (`batch.prefill_rows`) may hold it at once."""
    if not start or native_per_token <= per_token:
        return 0
    return native_per_token * max(0, chunk - 1 - spec)


def check_scheme(scheme: str, problems: list[str]) -> None:
    if scheme not in SCHEMES:
        problems.append(f"kv.scheme={scheme!r} is not supported; valid choices: "
                        f"{', '.join(SCHEMES)} (kv=native|affine8|affine4|k8v4|turboquant)")


def affine_vector_bytes(dim: int, bits: int, group_size: int, dtype_bytes: int) -> int:
    """One head vector under mx.quantize: packed words plus a scale and a bias per group."""
    return dim * bits // 8 + 2 * (dim // group_size) * dtype_bytes


def turbo_vector_bytes(dim: int, bits: float) -> int:
    """One head vector under TurboQuant: indices packed densely into uint32 words (whole
    words per run), a float16 norm per run (3.5 bits: the outlier half of the channels at 4
    bits, the other half at 3, each with its own norm)."""
    from math import gcd

    runs = [(int(bits), dim)] if bits == int(bits) else [(int(bits) + 1, dim // 2),
                                                        (int(bits), dim - dim // 2)]
    block = lambda b: 32 // gcd(32, b)  # noqa: E731 (indices per whole number of words)
    return sum(4 * (-(-n // block(b)) * block(b) * b // 32) + 2 for b, n in runs)


def resolve_kv(kv: Any, info: ModelInfo, dtype: str, backend: str, max_context: int,
               problems: list[str]) -> KVPlan | None:
    """The KVPlan for config group `kv`, or None with `problems` appended."""
    if kv.scheme not in SCHEMES:  # reported by check_scheme, with the config's other problems
        return None
    heads, dim = info.num_kv_heads or 0, info.head_dim or 0
    dtype_bytes = COMPUTE_BYTES[dtype]
    width = heads * dim * dtype_bytes  # one of K or V, one layer, one token
    full = [i for i, k in enumerate(info.layer_kinds) if k == "full"]
    n_problems = len(problems)
    if kv.start < 0:
        problems.append(f"kv.start={kv.start} must be >= 0")
    if kv.scheme != "native" and kv.start > max_context:
        problems.append(f"kv.start={kv.start} is larger than server.max_context={max_context}:"
                        " no row would ever be quantized; lower kv.start or use kv=native")
    problems += unread("kv", kv, READS, UNSET, "kv.scheme", kv.scheme)
    if kv.scheme == "native":
        native = 2 * width * len(full)
        attention = "fused SDPA"
        if backend == "cuda" and dim in NATIVE_CUDA_DIMS:
            attention = ("decode in a batch: masked CUDA kernels (its rows are left-padded, and "
                         "MLX fuses attention only without a mask; query groups of at most 8); "
                         "a lone row and prefill: fused SDPA")
        return None if len(problems) > n_problems else KVPlan(
            scheme="native", dtype=dtype, key_bits=None, value_bits=None, group_size=None,
            rotation=None, rotation_seed=None, head_dim=dim, start=0,
            keep_layers=tuple(full), quantized_layers=(), attention=attention,
            bytes_per_token=native, native_bytes_per_token=native,
            sliding_bytes_per_token=2 * width * info.layer_kinds.count("sliding"),
            layers=_layers(info, dtype, 2 * width, None))
    if info.architecture in MLA_ARCHITECTURES:
        problems.append(f"kv={kv.scheme} on {info.architecture}: its cache is an MLA latent, "
                        "which quantizing loses (tech-brief 1.7); valid choices: kv=native")
    if not full:
        problems.append(f"kv={kv.scheme}: {info.architecture} has no full-attention layers to "
                        "quantize (sliding and recurrent layers stay native); valid choices: "
                        "kv=native")
    valid_bits = AFFINE_BITS if kv.scheme == "affine" else TURBO_BITS
    for f in ("key_bits", "value_bits"):
        bits = getattr(kv, f)
        if bits not in valid_bits:
            problems.append(f"kv.{f}={bits} is not supported by kv.scheme={kv.scheme}; valid "
                            f"choices: {', '.join(map(str, valid_bits))}")
    if kv.scheme == "affine":
        if kv.group_size not in GROUP_SIZES:
            problems.append(f"kv.group_size={kv.group_size} is not supported; valid choices: "
                            f"{', '.join(map(str, GROUP_SIZES))}")
        elif dim and dim % kv.group_size:
            fits = [str(g) for g in GROUP_SIZES if dim % g == 0]
            problems.append(f"kv.group_size={kv.group_size} does not divide head_dim={dim}; "
                            + (f"valid choices: {', '.join(fits)}" if fits else
                               f"no group size ({', '.join(map(str, GROUP_SIZES))}) divides "
                               "it: affine KV cannot serve this model; valid choices: "
                               "kv=native, kv=turboquant"))
    else:
        if kv.rotation not in ROTATIONS:
            problems.append(f"kv.rotation={kv.rotation!r} is not supported; valid choices: "
                            f"{', '.join(ROTATIONS)}")
        elif kv.rotation == "hadamard" and dim & (dim - 1):
            problems.append(f"kv.rotation=hadamard needs a power-of-two head size, but "
                            f"head_dim={dim}; valid choices: kv.rotation=orthogonal")
    dense = set(info.layer_kinds) == {"full"}
    if kv.keep_layers is None:  # boundary layers of a dense model; hybrids keep none
        keep = tuple(full[:BOUNDARY] + full[-BOUNDARY:]) if dense else ()
        keep = tuple(sorted(set(keep)))
    else:
        keep = tuple(sorted(set(kv.keep_layers)))
        bad = [i for i in keep if i not in full]
        if bad:
            problems.append(f"kv.keep_layers={list(kv.keep_layers)}: {bad} are not "
                            f"full-attention layers; valid choices: {full}")
        elif full and set(full) <= set(keep):  # (the codec's settings would change nothing)
            problems.append(f"kv.keep_layers={list(kv.keep_layers)} keeps every "
                            f"full-attention layer native: kv={kv.scheme} would encode none; "
                            "valid choices: kv=native, or fewer layers kept")
    if len(problems) > n_problems:
        return None
    quantized = tuple(i for i in full if i not in keep)
    if kv.scheme == "affine":
        kb = affine_vector_bytes(dim, int(kv.key_bits), kv.group_size, dtype_bytes) * heads
        vb = affine_vector_bytes(dim, int(kv.value_bits), kv.group_size, dtype_bytes) * heads
        widths = {int(kv.key_bits), int(kv.value_bits)} <= {2, 4, 8}
        attention = ("decode: mx.quantized_matmul over the stored codes" if backend != "cuda"
                     else "decode: fused CUDA kernels over the packed codes (MLX's CUDA backend "
                     "has no quantized_matmul for attention's shapes)" if widths else
                     "decode: dequantize, then fused SDPA (no fused kernel for these widths "
                     "on cuda)") + "; prefill: fused SDPA over fresh float KV"
    else:
        kb = turbo_vector_bytes(dim, kv.key_bits) * heads
        vb = turbo_vector_bytes(dim, kv.value_bits) * heads
        fused = backend == "cuda" and kv.key_bits == int(kv.key_bits) \
            and kv.value_bits == int(kv.value_bits)
        attention = ("decode: fused CUDA kernels over the packed codes, in the rotated space"
                     if fused else "decode: plain MLX in the rotated space (no fused kernel "
                     f"for this on {backend})") + "; prefill: fused SDPA over fresh float KV"
        if kv.key_bits != int(kv.key_bits) or kv.value_bits != int(kv.value_bits):
            attention += ("; 3.5 bits: per layer and kv head, the half of the channels with "
                          "the largest mean |x| (calibrated once on the model) at 4 bits, the "
                          "rest at 3, each half with its own norm and rotation")
    turbo = kv.scheme == "turboquant"
    return KVPlan(
        scheme=kv.scheme, dtype=dtype, key_bits=kv.key_bits, value_bits=kv.value_bits,
        group_size=None if turbo else kv.group_size,
        rotation=kv.rotation if turbo else None,
        rotation_seed=kv.rotation_seed if turbo else None, head_dim=dim,
        start=kv.start, keep_layers=keep, quantized_layers=quantized, attention=attention,
        bytes_per_token=(kb + vb) * len(quantized) + 2 * width * len(keep),
        native_bytes_per_token=2 * width * len(full),
        sliding_bytes_per_token=2 * width * info.layer_kinds.count("sliding"),
        layers=_layers(info, dtype, 2 * width, (kb + vb, len(quantized), len(keep))))


def _layers(info: ModelInfo, dtype: str, native: int, quant) -> dict:
    out = {}
    kinds = dict.fromkeys(info.layer_kinds)
    if "full" in kinds:
        if quant is None:
            out["full"] = {"held": dtype, "bytes_per_token": native}
        else:
            q, n_q, n_keep = quant
            out["full"] = {"held": f"{n_q} quantized, {n_keep} native ({dtype})",
                           "bytes_per_token": q, "native_bytes_per_token": native}
    if "sliding" in kinds:
        out["sliding"] = {"held": f"{dtype} (never quantized)", "bytes_per_token": native}
    if "recurrent" in kinds:
        out["recurrent"] = {"held": f"{dtype} state (never quantized)", "bytes_per_token": 0}
    return out


def rows_per_option(info: ModelInfo, dtype: str, backend: str, kv: Any, budget: int,
                     max_ctx: int) -> dict:
    """Rows of `max_ctx` tokens each KV option would fit in `budget` (same keep_layers and
    group size as this plan), so a user sees what switching kv= buys before trying it."""
    out = {}
    for name, fields in OPTIONS.items():
        mine = {k: v for k, v in _fields(kv).items()  # what this option's scheme reads
                if k not in READS or fields["scheme"] in READS[k]}
        p = resolve_kv(type("KV", (), {**UNSET, **mine, **fields})(), info, dtype, backend,
                       max_ctx, [])
        if p is not None and p.bytes_per_token:
            out[name] = max(0, budget) // (p.bytes_per_token * max_ctx)
    return out


def _fields(kv: Any) -> dict:
    return {k: getattr(kv, k) for k in ("scheme", "key_bits", "value_bits", "group_size",
                                        "start", "keep_layers", "rotation", "rotation_seed")}
