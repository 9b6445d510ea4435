"""Multi-token-prediction (MTP) heads and the target-model hooks speculative decoding needs.

An MTP head (DeepSeek-V3 / Qwen3-Next style, depth 1) drafts the token after next from the
target's own state: at position i it takes the target's post-final-norm hidden state h_i and
the embedding of token t_{i+1}, and predicts t_{i+2}::

    x = fc([pre_fc_norm_embedding(embed(t_{i+1})); pre_fc_norm_hidden(h_i)])   # embedding FIRST
    x = decoder_layer(x)        # causal attention over the head's own sequence, own KV cache
    out = norm(x)               # scored by the TARGET's output head: logits_from_hidden(model, out)

Chaining the head (feeding `out` back as the hidden state, with the drafted token) drafts
further tokens. Checkpoints store the head as `mtp.*` tensors (Qwen3-Next / Qwen3.5 names):
`mtp.fc.weight` [h, 2h], `mtp.pre_fc_norm_embedding.weight`, `mtp.pre_fc_norm_hidden.weight`,
`mtp.layers.0.*`, `mtp.norm.weight`. mlx-lm's `sanitize()` drops them, so they are read here
straight from the safetensors files: the checkpoint's own (`model*.safetensors`, sharded or
not), a sidecar `mtp.safetensors` next to them (the embedded model's trained head), or an
explicit `head_file`.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask

PREFIX = "mtp."
SIDECAR = "mtp.safetensors"  # a head shipped next to a checkpoint that has none of its own
#: Families whose RMSNorm computes x * (1 + w): checkpoints store w zero-centred.
OFFSET_NORM_FAMILIES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_moe"})
_EXPERT = re.compile(r"^(layers\.\d+\.mlp)\.experts\.(\d+)\.(\w+)\.weight$")
_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "U32": 4,
                "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


class MTPError(ValueError):
    """An MTP head that is present but cannot be used (wrong family, shape or convention)."""


# ------------------------------------------------------------------ target-model hooks


def _text_model(model):
    """The causal-LM module that owns `.model` (unwraps multimodal `language_model`)."""
    return model.language_model if "language_model" in model else model


def hidden_states(model, inputs: mx.array, cache) -> mx.array:
    """The target's post-final-norm hidden states [B, L, H] (what its output head scores)."""
    return _text_model(model).model(inputs, cache=cache)


def logits_from_hidden(model, h: mx.array) -> mx.array:
    """Score hidden states [B, L, H] with the target's output head (tied or not)."""
    m = _text_model(model)
    if "lm_head" in m:
        return m.lm_head(h)
    return m.model.embed_tokens.as_linear(h)


def embed(model, tokens: mx.array) -> mx.array:
    """The target's input embeddings of `tokens` [B, L] -> [B, L, H]."""
    return _text_model(model).model.embed_tokens(tokens)


# ------------------------------------------------------------------ the head


def _decoder_layer(model, mlp: str) -> nn.Module:
    """One decoder layer of the target's own family, full attention, `mlp` 'dense' or 'moe'."""
    m = _text_model(model)
    args, family = m.args, m.model_type
    if family == "qwen3":
        from mlx_lm.models import qwen3

        return qwen3.TransformerBlock(args)
    if family == "llama":
        from mlx_lm.models import llama

        return llama.TransformerBlock(args)
    if family == "qwen3_next":
        from mlx_lm.models import qwen3_next as q

        layer = q.Qwen3NextDecoderLayer(args, layer_idx=args.full_attention_interval - 1)
        if mlp == "moe":
            if not args.num_experts:
                raise MTPError("the MTP head has experts but the target config has num_experts=0")
            layer.mlp = q.Qwen3NextSparseMoeBlock(args)
        else:
            layer.mlp = q.Qwen3NextMLP(args.hidden_size, args.intermediate_size)
        return layer
    raise MTPError(f"no MTP head support for model family {family!r}; "
                   "known: llama, qwen3, qwen3_next")


class MTPHead(nn.Module):
    """DeepSeek-V3 / Qwen3-Next style depth-1 MTP head.

    fc over [norm_e(embedding of t+1); norm_h(hidden of t)] (embedding first), one decoder
    layer of the target's family (causal attention over the head's own sequence, with its
    own KV cache), then a final norm. Logits come from the target's shared output head
    (`logits_from_hidden`). Build it with `MTPHead.for_model(model)` or `load_mtp`.
    """

    def __init__(self, hidden_size: int, eps: float, layer: nn.Module):
        super().__init__()
        self.fc = nn.Linear(2 * hidden_size, hidden_size, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden_size, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden_size, eps=eps)
        self.layers = [layer]
        self.norm = nn.RMSNorm(hidden_size, eps=eps)

    @classmethod
    def for_model(cls, model, mlp: str = "dense") -> MTPHead:
        """A randomly initialised head shaped for `model` (float32 until cast)."""
        args = _text_model(model).args
        return cls(args.hidden_size, args.rms_norm_eps, _decoder_layer(model, mlp))

    def __call__(self, hidden: mx.array, next_embeds: mx.array, cache=None) -> mx.array:
        """hidden, next_embeds [B, L, H] -> post-norm hidden [B, L, H].

        `cache` is ONE layer cache (mlx-lm KVCache, or a left-padded batch cache such as
        BatchKVCache) or None; positions come from the cache's offset, so a batch cache's
        per-row offsets and padding mask work unchanged.
        """
        x = mx.concatenate(
            [self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], axis=-1)
        x = self.fc(x)
        mask = create_attention_mask(x, cache)
        x = self.layers[0](x, mask, cache)
        return self.norm(x)

    def make_cache(self):
        """A fresh single-sequence cache for the head's one attention layer."""
        from mlx_lm.models.cache import KVCache

        return KVCache()


# ------------------------------------------------------------------ finding the weights


def _header(path: Path) -> dict:
    """A safetensors file's JSON header (tensor name -> dtype, shape, offsets); no data read."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def _sources(model_dir, head_file) -> list[Path]:
    """The safetensors files that may hold `mtp.*` tensors, cheapest first."""
    if head_file is not None:
        p = Path(head_file)
        if not p.is_file():
            raise FileNotFoundError(f"MTP head file {p} does not exist")
        return [p]
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.is_file():  # sharded: the index names the shards holding mtp.*
        wmap = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({f for k, f in wmap.items() if k.startswith(PREFIX)})
        out = [d / f for f in files]
    else:
        out = sorted(d.glob("model*.safetensors"))
    if (d / SIDECAR).is_file():
        out.append(d / SIDECAR)
    return out


def _mtp_names(files: list[Path]) -> dict[str, tuple[Path, dict]]:
    names = {}
    for f in files:
        for k, v in _header(f).items():
            if k.startswith(PREFIX):
                names[k] = (f, v)
    return names


def has_mtp(model_dir, head_file: str | Path | None = None) -> bool:
    """Whether the checkpoint (or `head_file`) carries an MTP head; reads headers only."""
    return bool(_mtp_names(_sources(model_dir, head_file)))


def mtp_bytes(model_dir, head_file: str | Path | None = None, dtype: str | None = None) -> int:
    """Bytes of the MTP head's parameters (0 when there is none).

    As stored, or, with `dtype` ("float32", "bfloat16", ...), as held in memory once cast to
    it (`load_mtp` casts the head to the target's dtype).
    """
    total = 0
    for _, info in _mtp_names(_sources(model_dir, head_file)).values():
        numel = 1
        for s in info["shape"]:
            numel *= s
        itemsize = getattr(mx, dtype).size if dtype else _DTYPE_BYTES[info["dtype"]]
        total += numel * itemsize
    return total


def _read_mtp(files: list[Path]) -> dict[str, mx.array]:
    weights = {}
    for f in files:
        weights.update({k[len(PREFIX):]: v for k, v in mx.load(str(f)).items()
                        if k.startswith(PREFIX)})
    return weights


def _stack_experts(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Per-expert tensors (HF layout) -> mlx-lm's stacked SwitchGLU `switch_mlp` tensors."""
    experts: dict[tuple[str, str], dict[int, mx.array]] = {}
    out = {}
    for k, v in weights.items():
        if m := _EXPERT.match(k):
            experts.setdefault((m[1], m[3]), {})[int(m[2])] = v
        else:
            out[k] = v
    for (prefix, proj), by_id in experts.items():
        out[f"{prefix}.switch_mlp.{proj}.weight"] = mx.stack([by_id[e] for e in sorted(by_id)])
    return out


def _is_norm(name: str, v: mx.array) -> bool:
    return v.ndim == 1 and "norm" in name.split(".")[-2]


def load_mtp(model_dir, model, head_file: str | Path | None = None) -> MTPHead | None:
    """The MTP head of the checkpoint at `model_dir` (or in `head_file`), for loaded `model`.

    None when there is none. The head is cast to the target's dtype. Raises MTPError when the
    tensors do not fit the target (shape, family) or the norm gains are not centred on 1
    (a checkpoint of the wrong RMSNorm convention).
    """
    files = [f for f in _sources(model_dir, head_file) if any(
        k.startswith(PREFIX) for k in _header(f))]
    if not files:
        return None
    weights = _stack_experts(_read_mtp(files))
    family = _text_model(model).model_type
    if family in OFFSET_NORM_FAMILIES:  # stored w, gain 1 + w
        weights = {k: v + 1.0 if _is_norm(k, v) else v for k, v in weights.items()}
    norms = [v.astype(mx.float32) for k, v in weights.items() if _is_norm(k, v)]
    mean = mx.concatenate(norms).mean().item() if norms else 1.0
    if not 0.5 < mean < 1.5:
        conv = "1 + w" if family in OFFSET_NORM_FAMILIES else "w"
        raise MTPError(
            f"MTP head norm gains average {mean:.3f}, not ~1: the head's RMSNorm weights do "
            f"not follow the {family} convention (gain {conv}); wrong or converted head file?")
    moe = any(".switch_mlp." in k for k in weights)
    head = MTPHead.for_model(model, "moe" if moe else "dense")
    try:
        head.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise MTPError(f"MTP head in {files[0]} does not fit the {family} target: {e}") from e
    head.set_dtype(_text_model(model).model.norm.weight.dtype)
    head.eval()
    mx.eval(head.parameters())
    return head
