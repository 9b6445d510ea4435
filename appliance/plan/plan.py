"""The ExecutionPlan: one frozen, validated description of what will run.

Nothing downstream of `resolve()` sees a DictConfig. Every field here is a
decision or a fact; measurements taken at run time live elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field

from appliance.plan.draft import DraftPlan
from appliance.plan.kv import KVPlan


@dataclass(frozen=True)
class ModelPlan:
    source: str  # tiny | local | hf
    id: str  # the id served by /v1/models and echoed in responses
    path: str  # directory (or hf repo id) handed to mlx_lm.load
    revision: str | None
    architecture: str  # mlx-lm model_type
    layer_kinds: tuple[str, ...]  # per layer: full | sliding | recurrent
    sliding_window: int | None
    vocab_size: int
    hidden_size: int | None
    num_kv_heads: int | None
    head_dim: int | None
    max_position_embeddings: int | None
    parameters: int
    checkpoint_dtype: str
    dtype: str  # compute dtype the weights are cast to at load
    quantization: str | None
    weight_bytes_on_disk: int
    weight_bytes: int  # resident, after any dtype cast
    config_sha256: str
    weights_sha256: str  # the weights' content (model_info.weights_digest)
    synthetic: dict | None = None  # {shape, bits, seed} for model=synthetic, else None
    dequantized: bool = False  # quantized layers held dense in `dtype` (model.dequantize)




@dataclass(frozen=True)
class BatchPlan:
    mode: str  # continuous | serial
    max_rows: int  # rows decoded together (1 for serial)
    prefill_chunk: int  # prompt tokens per prefill pass (a running row stalls <= one chunk)
    prefill_rows: int  # prompts prefilled together, right-padded into one pass
    compile_step: bool  # batched decode steps run as one compiled graph where layers allow
    attention_threads: int  # CPU streams a decode step's attention is split over (by kv head)
    kv_budget_bytes: int  # live KV of all rows together; admission keeps within it
    max_queue: int  # waiting requests before 429
    placement: dict[str, str]  # per layer kind present: how its rows are held
    lone_row: str  # how a request alone on the engine is decoded


@dataclass(frozen=True)
class CachePlan:
    kind: str  # none | ram | ssd | tiered
    ram_bytes: int  # effective RAM tier cap (0: no RAM tier)
    ssd_bytes: int  # effective SSD tier cap (0: no SSD tier)
    ssd_path: str | None  # the root; entries live under <root>/<fingerprint>/


def is_loopback(host: str) -> bool:
    """Whether a bind address (or a Host header's name) is this machine only."""
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")


@dataclass(frozen=True)
class ServerPlan:
    host: str
    port: int
    api_key: str | None = field(repr=False)  # never shown: to_dict says only whether set
    max_context: int  # prompt + completion tokens per request
    default_max_tokens: int
    default_temperature: float
    default_top_p: float
    log_level: str
    drain_seconds: float = 10.0  # on SIGTERM: time for in-flight requests, then they end
    clients: int = 8  # the workload the auto knobs were sized for: concurrent clients ...
    typical_context: int = 4096  # ... of this many tokens each
    warmup: bool = False  # a burst of the batch's shapes before serving (engine/warmup.py)


@dataclass(frozen=True)
class MachinePlan:
    name: str  # auto or the profile's name
    backend: str  # metal | cuda | cpu (always detected: it is where MLX runs)
    chip: str
    memory_bytes: int
    gpu_cores: int | None
    bandwidth_gbs: float | None
    headroom_bytes: int
    blas: str  # Linux CPU: the BLAS MLX's matmuls bind to
    planned_for: str = ""  # the backend the facts describe (a Mac profile planned on Linux: metal)
    tflops: float | None = None  # the compute the auto knobs assumed (stated, data sheet or guess)


@dataclass(frozen=True)
class MemoryPlan:
    """One account of what MLX holds; each part is checked against what MLX reports
    (tests/test_memory.py) and the sum is MLX's memory limit (docs/memory.md)."""

    usable_bytes: int  # memory - headroom
    weights_bytes: int
    kv_budget_bytes: int  # live KV of all rows (left-padded to the longest); admission
    kv_and_cache_bytes: int  # kv budget + RAM tier: the pool live KV, SSD-writer copies and
    #                          the RAM tier share (the tier trims itself to what rows leave)
    kv_bytes_at_max_context: int  # one request at max_context
    rows_at_max_context: dict  # per KV option: rows of max_context (and their copies) that
    #                            fit in memory with no RAM tier (kv_budget when explicit)
    activations_bytes: int = 0  # one step's transients: a prefill chunk, the decode logits
    buffer_cache_bytes: int = 0  # freed buffers MLX keeps for reuse (mx.set_cache_limit)
    copies_bytes: int = 0  # a batch rebuilt on join/leave (<= kv budget) + a hit's copy
    ram_bytes: int = 0  # the RAM tier's cap
    ceiling_bytes: int = 0  # the sum of all parts with the weights: mx.set_memory_limit


@dataclass(frozen=True)
class ExecutionPlan:
    model: ModelPlan
    kv: KVPlan
    draft: DraftPlan
    batch: BatchPlan
    cache: CachePlan
    server: ServerPlan
    machine: MachinePlan
    memory: MemoryPlan
    profiles: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # facts worth a look that are not errors
    derived: dict[str, str] = field(default_factory=dict)  # auto knob -> its value and why
    fingerprint: str = field(default="")

    def to_dict(self, public: bool = False) -> dict:
        """The plan as data; the API key only as set or not. `public`: also without
        absolute paths (what an unauthenticated /v1/plan shows)."""
        d = asdict(self)
        d["server"]["api_key"] = "<set>" if self.server.api_key else None
        d = {"fingerprint": d.pop("fingerprint"), **d}
        return without_paths(d) if public else d

    def to_yaml(self) -> str:
        import yaml

        d = _plain(self.to_dict())
        derived = d.pop("derived")  # sentences: one per line reads better than a flow map
        return (yaml.safe_dump(d, sort_keys=False, default_flow_style=None, width=100)
                + yaml.safe_dump({"derived": derived}, sort_keys=False,
                                 default_flow_style=False, width=100))


# An absolute path: a '/' not inside a word ("tok/s", "1/2"), then at least one directory
_ABSOLUTE = re.compile(r"(?<![\w.~])/(?:[\w.+-]+/)+([\w.+-]*)")


def without_paths(x):
    """`x` (data) with every absolute path in its strings cut to its last part, sentences
    included (the model's, the SSD tier's, the BLAS library's): what a reader without the
    API key sees."""
    if isinstance(x, dict):
        return {k: without_paths(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [without_paths(v) for v in x]
    return _ABSOLUTE.sub(r"\1", x) if isinstance(x, str) else x


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def fingerprint(model: ModelPlan, kv: KVPlan, draft: DraftPlan) -> str:
    """Hash of exactly the fields that change KV bytes or output tokens.

    Serving address, budgets and batch size are not in it: they change speed,
    not bits (batched bf16 reductions are gated by parity tests instead).
    """
    key = {
        # Content, not location: the same weights under another path hash the same.
        "model": [model.architecture, model.config_sha256, model.weights_sha256,
                  model.weight_bytes_on_disk, model.parameters, model.revision,
                  model.synthetic],
        "dtype": model.dtype,
        "quantization": model.quantization,
        "kv": kv.fingerprint_key(),
        # (stored entries hold the model's layers only, but where kernels are not batch-
        # invariant, CUDA, a verify pass's shape can move a sampled token: docs/speculation.md)
        "draft": draft.kind if not draft.content else [draft.kind, draft.content],
    }
    if model.dequantized:  # dense matmuls round differently (absent otherwise: old keys hold)
        key["dequantized"] = True
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return "fp_" + digest[:16]
