"""Random-weight tiny variants of real mlx-lm architectures, built from config dicts.

They share the embedded model's tokenizer, so prompts and chat templates work,
and are saved as ordinary mlx-lm model directories loaded through mlx_lm.load.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from appliance.plan.resolve import EMBEDDED_MODEL

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _vocab() -> int:
    return json.loads((EMBEDDED_MODEL / "config.json").read_text())["vocab_size"]


def configs() -> dict[str, dict]:
    v = _vocab()
    common = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "vocab_size": v,
              "rope_theta": 10000.0, "max_position_embeddings": 4096,
              "tie_word_embeddings": True}
    return {
        "llama": {**common, "model_type": "llama", "num_hidden_layers": 2},
        # layers 0, 2 slide over 16 tokens; layers 1, 3 attend fully
        "gemma3_text": {**common, "model_type": "gemma3_text", "num_hidden_layers": 4,
                        "sliding_window": 16, "sliding_window_pattern": 2,
                        "query_pre_attn_scalar": 16, "rope_local_base_freq": 10000.0},
        # layers 0-2 are gated-delta recurrent, layer 3 full attention; dense MLPs
        "qwen3_next": {**common, "model_type": "qwen3_next", "num_hidden_layers": 4,
                       "linear_num_value_heads": 4, "linear_num_key_heads": 2,
                       "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                       "linear_conv_kernel_dim": 4, "num_experts": 0, "num_experts_per_tok": 1,
                       "decoder_sparse_step": 1, "shared_expert_intermediate_size": 128,
                       "mlp_only_layers": [0, 1, 2, 3], "moe_intermediate_size": 64,
                       "partial_rotary_factor": 0.5, "full_attention_interval": 4},
    }


def make_model(path: Path, arch: str, seed: int = 0) -> Path:
    """Write a random-weight `arch` model directory at `path` (deterministic in `seed`)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    config = {**configs()[arch], "eos_token_id": json.loads(
        (EMBEDDED_MODEL / "config.json").read_text()).get("eos_token_id")}
    path.mkdir(parents=True, exist_ok=True)
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=1))
    for name in TOKENIZER_FILES:
        if (EMBEDDED_MODEL / name).exists():
            shutil.copy(EMBEDDED_MODEL / name, path / name)
    return path
