"""Typed schemas for every config group, registered in Hydra's ConfigStore.

Config is data: these dataclasses only say what a user may write. What the
values *mean* (validation, derived budgets, capabilities) is decided by
`appliance.plan.resolve`. One YAML per option lives under `conf/<group>/`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, is_dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class ModelConfig:
    """Which weights to serve."""

    source: str = "tiny"  # tiny (embedded) | local (model.path) | hf (model.repo) | synthetic
    path: str | None = None  # local: an mlx-lm model directory
    repo: str | None = None  # hf: a Hugging Face repo id
    revision: str | None = None  # hf: branch, tag or commit
    dtype: str = "auto"  # auto (checkpoint's) | float32 | bfloat16 | float16
    name: str | None = None  # id served by /v1/models; derived when unset
    shape: str | None = None  # synthetic: a named real shape, e.g. llama-3.2-1b
    bits: int | None = None  # synthetic: quantize the weights to 4 or 8 bits
    seed: int = 0  # synthetic: the random weights are a function of this seed
    # quantized weights held dense in `dtype` (more memory, faster batched matmuls): auto
    # (on CUDA when the dense copy fits; docs/defaults.md) | true | false
    dequantize: bool | str = "auto"


@dataclass
class KVConfig:
    """How the KV cache stores keys and values (`appliance/plan/kv.py` says what each means)."""

    scheme: str = "native"  # native (compute dtype) | affine (mx.quantize) | turboquant
    key_bits: float | None = None  # affine: 2-8; turboquant: 3, 3.5 or 4
    value_bits: float | None = None
    group_size: int = 64  # affine: elements sharing one scale and bias
    start: int = 0  # a row's KV stays native until it holds this many tokens
    keep_layers: list[int] | None = None  # attention layers kept native; null: derived
    rotation: str = "hadamard"  # turboquant: hadamard (randomized, two rounds) | orthogonal
    rotation_seed: int = 0  # turboquant


@dataclass
class DraftConfig:
    """Speculative decoding (`appliance/plan/draft.py` says which option reads what)."""

    kind: str = "none"  # none | lookup | model | mtp
    k: int = 0  # most tokens a row proposes per step
    adaptive: bool = True  # k shrinks, rows pause, the batch stops when drafts do not pay
    ngram_min: int | None = None  # lookup: shortest n-gram matched
    ngram_max: int | None = None  # lookup: longest n-gram matched (tried first)
    source: str | None = None  # model: embedded | local | hf
    path: str | None = None  # model, source=local: the draft model's directory
    repo: str | None = None  # model, source=hf
    revision: str | None = None  # model, source=hf
    head: str | None = None  # mtp: checkpoint (the model's own mtp.* weights) | a head file


@dataclass
class BatchConfig:
    """How requests share the engine."""

    mode: str = "continuous"  # continuous: rows decode together | serial: one at a time
    # auto: derived from the machine and the workload (docs/defaults.md says how and why)
    max_rows: int | str = "auto"  # rows decoded together (serial: 1)
    prefill_chunk: int | str = "auto"  # prompt tokens per forward pass; rows stall <= one chunk
    prefill_rows: int = 1  # waiting prompts prefilled together in one pass (each <= one chunk)
    # batched decode steps as one compiled graph (engine/compiled.py); off by default: see
    # docs/benchmarks.md "Compiled decode step" for why it does not pay yet
    compile_step: bool = False
    # CPU threads a decode step's attention is split over, by kv head (engine/kv/cores.py)
    attention_threads: int | str = "auto"
    kv_budget: str = "auto"  # bytes for live KV: auto (from the machine) or a size, e.g. 4GiB
    max_queue: int = 64  # requests waiting for a row before new ones get 429


@dataclass
class RamTierConfig:
    bytes: str = "auto"  # cap: auto (from the machine) or e.g. 4GiB; shares one ceiling


@dataclass
class SsdTierConfig:
    path: str = "~/.cache/appliance/prefix"  # one sub-directory per plan fingerprint
    bytes: str = "32GiB"  # cap on blob bytes


@dataclass
class CacheConfig:
    """Prefix-cache tiers."""

    kind: str = "auto"  # auto (ram; none with batch=serial) | none | ram | ssd | tiered
    ram: RamTierConfig = field(default_factory=RamTierConfig)
    ssd: SsdTierConfig = field(default_factory=SsdTierConfig)


@dataclass
class ServerConfig:
    """The HTTP service and the workload's generation defaults."""

    host: str = "127.0.0.1"
    api_key: str | None = None  # required on every endpoint but /health; e.g. ${oc.env:KEY}
    allow_unauthenticated: bool = False  # serve a non-loopback host without a key anyway
    port: int = 8080
    # prompt + completion tokens; auto: the model's trained positions capped by memory;
    # null: the model's trained positions
    max_context: int | str | None = "auto"
    # The workload the plan is sized for (auto knobs read them; nothing is enforced):
    clients: int = 8  # concurrent clients (agents) expected
    typical_context: int = 4096  # tokens a typical request holds (prompt + completion)
    default_max_tokens: int = 512  # when a request gives no max_tokens (mlx-lm server's default)
    default_temperature: float = 0.0
    default_top_p: float = 1.0
    log_level: str = "info"
    drain_seconds: float = 10.0  # on SIGTERM: in-flight requests' time to finish, then an error
    # a burst of the batch's shapes before serving (GPU kernels are built on first use);
    # auto: on for GPU backends, off on CPU
    warmup: bool | str = "auto"


@dataclass
class MachineConfig:
    """Facts about the machine. `auto` detects them; a profile may state them."""

    name: str = "auto"
    backend: str = "auto"  # auto | metal | cuda | cpu
    chip: str | None = None
    memory_gb: float | None = None  # unified / system memory
    gpu_cores: int | None = None
    bandwidth_gbs: float | None = None
    tflops: float | None = None  # dense 16-bit matmul throughput (GPU) or fp32 (CPU)
    headroom_gb: float = 2.0  # kept free for the OS and other programs
    headroom_fraction: float = 0.1  # ... or this fraction of memory, whichever is larger


@dataclass
class BenchConfig:
    """mode=bench: a workload run against the plan's engine through a real HTTP server."""

    workload: str = "fleet"  # fleet: N agents sharing a system prompt | decode: B=1 decode speed
    target: str = "self"  # self (this plan, in-process server) | mlx_lm (mlx_lm.server) | a URL
    clients: int = 8  # concurrent agents
    requests_per_client: int = 1  # turns each agent sends, one after another
    system_tokens: int = 1024  # shared system prompt length (tokens)
    user_tokens: int = 64  # distinct user turn length (tokens)
    max_tokens: int = 128  # completion length (EOS is banned so every request runs to it)
    stagger_s: float = 0.25  # agent i starts at i * stagger_s ...
    jitter_s: float = 0.1  # ... plus uniform [0, jitter_s)
    seed: int = 0
    warmup: int = 1  # untimed requests first (JIT, caches)
    decode_tokens: int = 256  # decode workload: tokens per run
    repeats: int = 3  # decode workload: runs per contender
    prefix_tokens: list[int] = field(default_factory=lambda: [2048, 8192])  # bench=prefix
    mlx_lm_args: str = ""  # target=mlx_lm: extra mlx_lm.server flags, e.g. "--prompt-cache-size 0"
    # bench=kv: the plan's KV scheme against kv=native, measured in the same run
    kv_budget: str = "auto"  # fixed KV budget for capacity: auto (the plan's) | e.g. 4GiB
    kv_capacity_contexts: list[int] = field(default_factory=lambda: [4096, 32768])  # row sizes
    kv_batches: list[int] = field(default_factory=lambda: [8, 32])  # rows decoded together
    kv_context: int = 4096  # prompt tokens per row for the batched decode
    kv_short_context: int = 128  # prompt tokens of the B=1 short row
    # bench=spec: the plan's draft against draft=none, in the same run
    spec_workloads: list[str] = field(default_factory=lambda: ["edit", "free"])
    spec_batches: list[int] = field(default_factory=lambda: [1, 4, 16])  # rows together
    spec_context: int = 512  # prompt tokens per row (a held-out stdlib file's)
    spec_verify_cost: bool = False  # also time verify passes of 1 + k tokens per row
    # a second draft=none engine in the same runs (A/A): the ratio a contender reads against
    # an equal one, so a draft's ratio is read against the runs' own spread
    spec_control: bool = True
    # bench=agents: growing multi-turn conversations (system_tokens is the shared system
    # prompt, user_tokens the task; max_tokens, stagger_s, jitter_s, seed, warmup as above)
    agents: int = 8  # concurrent agents
    turns: int = 3  # requests per agent; each later turn appends the reply and a tool output
    tool_tokens: int = 256  # tool output per later turn (held-out stdlib source)
    think_s: float = 0.5  # mean think time before each later turn (uniform 0..2x, seeded)
    anchor: str = "mlx_lm"  # also measured in the same run, for ratios: mlx_lm | none
    progress: bool = True  # rich progress bars on stderr (only when stderr is a terminal)
    keep_ssd: bool = False  # keep the SSD-tier directories a bench made (else removed at end)


@dataclass
class TuneConfig:
    """mode=tune: search batch and cache knobs on bench=agents (Hydra's Optuna sweeper)."""

    profile: str = "tuned"  # the best trial becomes profiles/<profile>.yaml
    profiles_dir: str = "profiles"  # where it is written (relative: to the working directory)
    trials: int = 20
    ttft_p95_ms: float = 5000.0  # bound on TTFT p95: a trial above it is infeasible
    seed: int = 0  # the sampler's
    # candidates per knob (one value: fixed; empty: not searched)
    max_rows: list[int] = field(default_factory=lambda: [2, 4, 8, 16])
    prefill_chunk: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])
    ram_bytes: list[str] = field(default_factory=lambda: ["1GiB", "4GiB", "16GiB"])


@dataclass
class AppConfig:
    """The whole configuration. `mode` picks what the CLI does with the plan."""

    mode: str = "serve"  # serve | plan | bench | tune
    model: ModelConfig = field(default_factory=ModelConfig)
    kv: KVConfig = field(default_factory=KVConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    machine: MachineConfig = field(default_factory=MachineConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)


GROUPS = {
    "model": ModelConfig,
    "kv": KVConfig,
    "draft": DraftConfig,
    "batch": BatchConfig,
    "cache": CacheConfig,
    "server": ServerConfig,
    "machine": MachineConfig,
}


def register() -> None:
    """Register the schema so that every option YAML is type-checked."""
    ConfigStore.instance().store(name="appliance_schema", node=AppConfig)


def unknown_keys(cfg, schema: type = AppConfig, prefix: str = "") -> list[str]:
    """One sentence per key of a composed config that no schema declares: Hydra's `+key=`
    (which its own error message suggests for a typo) adds such keys, and nothing would
    read them. Each names the nearest valid key."""
    from omegaconf import DictConfig

    defaults = schema()
    problems = []
    for key in cfg.keys():
        if not prefix and key == "hydra":
            continue
        path = f"{prefix}{key}"
        if not hasattr(defaults, key):
            valid = [f"{prefix}{k}" for k in vars(defaults)]
            near = difflib.get_close_matches(path, valid, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            problems.append(f"{path} is not a setting of appliance; {hint}valid keys here: "
                            f"{', '.join(valid)}")
            continue
        value = getattr(defaults, key)
        if is_dataclass(value) and isinstance(cfg[key], DictConfig):
            problems += unknown_keys(cfg[key], type(value), f"{path}.")
    return problems
