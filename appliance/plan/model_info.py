"""What a model is, learned from its config.json and safetensors headers (the weights are
read only to digest them, once a file version).

Layer kinds come from the cache objects mlx-lm's own model class would make:
the class is instantiated lazily (MLX does not materialise its random init
until evaluated), so this is exact for every architecture mlx-lm supports.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from appliance.plan.errors import PlanError

DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "U8": 1, "I8": 1, "F64": 8,
               "I64": 8, "U16": 2, "I16": 2, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FLOAT_DTYPES = {"F32", "F16", "BF16", "F64"}
COMPUTE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SAFETENSORS_TO_NAME = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


@dataclass(frozen=True)
class ModelInfo:
    architecture: str
    layer_kinds: tuple[str, ...]  # per layer: full | sliding | recurrent
    sliding_window: int | None
    vocab_size: int
    hidden_size: int | None
    num_kv_heads: int | None
    head_dim: int | None
    max_position_embeddings: int | None
    parameters: int  # model parameters (quantized words unpacked)
    checkpoint_dtype: str  # dominant float dtype of the stored weights
    weight_bytes: int  # on disk
    float_weight_elements: int  # elements whose dtype a dtype override changes
    quantization: str | None  # e.g. "4bit/g64", None when unquantized
    config_sha256: str
    weights_sha256: str  # the weight files' content (see weights_digest)


DIGESTS = Path("~/.cache/appliance/digests.json")  # file digests by path, size and mtime


def weights_digest(files: list[Path]) -> str:
    """sha256 over the weight files' own sha256s. Each file is read whole once; its digest is
    kept under DIGESTS, keyed by path, size and modification time, so later plans only stat
    it. (16 sampled windows a file let two checkpoints that differ elsewhere share a
    fingerprint, and so each other's SSD prefix entries: a probe flipped bits in layer 0.)"""
    import hashlib
    import os

    store = DIGESTS.expanduser()
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = None
    known = known if isinstance(known, dict) else {}
    h, fresh = hashlib.sha256(), False
    for f in files:
        st = f.stat()
        key = f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}"
        if key not in known:
            one = hashlib.sha256()
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 22):
                    one.update(chunk)
            known[key], fresh = one.hexdigest(), True
        h.update(known[key].encode())
    if fresh:  # (another process may write too: whole-file replace, last one wins)
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            tmp = store.with_name(f".{store.name}.{os.getpid()}")
            tmp.write_text(json.dumps(known))
            os.replace(tmp, store)
        except OSError:
            pass  # a read-only home: the digest is recomputed next time
    return h.hexdigest()


def read_safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file: names, dtypes, shapes. Reads no tensor data."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def _kinds_from_cache(model) -> tuple[tuple[str, ...], int | None]:
    from mlx_lm.models import cache as C
    from mlx_lm.models.cache import make_prompt_cache

    kinds, window = [], None
    for c in make_prompt_cache(model):
        if isinstance(c, C.RotatingKVCache):
            kinds.append("sliding")
            window = c.max_size if window is None else min(window, c.max_size)
        elif isinstance(c, (C.KVCache, C.QuantizedKVCache)):
            kinds.append("full")
        elif isinstance(c, C.ArraysCache):
            kinds.append("recurrent")
        else:
            kinds.append(type(c).__name__)
    return tuple(kinds), window


def _lazy_model(config: dict):
    """mlx-lm's own model class for `config`; MLX leaves its random init unevaluated."""
    from appliance.models.synthetic import lazy_model

    try:
        return lazy_model(config)
    except Exception as e:  # unknown model_type, bad args: name the cause
        raise PlanError([f"model: mlx-lm cannot build {config.get('model_type')!r}: {e}"]) from e


def inspect_model(path: Path) -> ModelInfo:
    """Describe the mlx-lm model directory at `path`; PlanError if it is not one."""
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise PlanError([f"model.path: {path} has no config.json (not an mlx-lm model directory)"])
    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise PlanError([f"model.path: {path} has no model*.safetensors weights"])
    tensors = []  # (safetensors dtype, elements)
    for f in files:
        for name, meta in read_safetensors_header(f).items():
            if name != "__metadata__":
                tensors.append((meta["dtype"], _numel(meta["shape"])))
    raw = cfg_path.read_bytes()
    return describe(json.loads(raw), raw, tensors, sum(f.stat().st_size for f in files),
                    weights_digest(files))


def inspect_config(config: dict) -> ModelInfo:
    """Describe a model that exists only as a config (synthetic shapes): tensor sizes come
    from the lazily built module, so nothing is computed or written."""
    from mlx.utils import tree_flatten

    names = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "uint32": "U32"}
    tensors = [(names.get(str(v.dtype).split(".")[-1], "F32"), v.size)
               for _, v in tree_flatten(_lazy_model(config).parameters())]
    # float tensors in the config's dtype, as ensure() will write them
    dt = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[config["torch_dtype"]]
    tensors = [(dt if d in FLOAT_DTYPES else d, n) for d, n in tensors]
    nbytes = sum(n * DTYPE_BYTES[d] for d, n in tensors)
    # synthetic weights are a function of the config (seed included by the caller)
    return describe(config, json.dumps(config, sort_keys=True).encode(), tensors, nbytes, "")


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def describe(config: dict, raw: bytes, tensors: list[tuple[str, int]],
             weight_bytes: int, weights_sha256: str) -> ModelInfo:
    import hashlib

    text = config.get("text_config", {})
    get = lambda k: config.get(k, text.get(k))  # noqa: E731
    q = config.get("quantization") or config.get("quantization_config")
    bits = q.get("bits") if isinstance(q, dict) else None
    # packed quantized words hold 32 / bits parameters each
    params = sum(n * 32 // bits if bits and d == "U32" else n for d, n in tensors)
    float_elems = sum(n for d, n in tensors if d in FLOAT_DTYPES)
    by_dtype: dict[str, int] = {}
    for d, n in tensors:
        by_dtype[d] = by_dtype.get(d, 0) + n
    floats = {k: v for k, v in by_dtype.items() if k in FLOAT_DTYPES}
    ckpt = SAFETENSORS_TO_NAME.get(max(floats, key=floats.get), "float32") if floats else "float32"

    quant = f"{bits}bit/g{q.get('group_size')}" if bits else None

    kinds, window = _kinds_from_cache(_lazy_model({**config, "quantization": None}))

    heads = get("num_attention_heads")
    hidden = get("hidden_size")
    return ModelInfo(
        architecture=str(config.get("model_type")),
        layer_kinds=kinds,
        sliding_window=window,
        vocab_size=int(get("vocab_size") or 0),
        hidden_size=hidden,
        num_kv_heads=get("num_key_value_heads") or heads,
        head_dim=get("head_dim") or (hidden // heads if hidden and heads else None),
        max_position_embeddings=get("max_position_embeddings"),
        parameters=params,
        checkpoint_dtype=ckpt,
        weight_bytes=weight_bytes,
        float_weight_elements=float_elems,
        quantization=quant,
        config_sha256=hashlib.sha256(raw).hexdigest(),
        weights_sha256=weights_sha256,
    )
