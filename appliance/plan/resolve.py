"""resolve(cfg) -> ExecutionPlan: validate everything, derive the rest, refuse clearly.

Every problem is collected and raised together as one PlanError.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from appliance import _blas, _mlx_env
from appliance.config.schema import RamTierConfig, ServerConfig, SsdTierConfig
from appliance.plan.derive import Shape, Workload, attention_threads, derive, machine_facts
from appliance.plan.draft import resolve_draft
from appliance.plan.errors import PlanError, unread
from appliance.plan.kv import check_scheme, resolve_kv, rows_per_option
from appliance.plan.machine import GiB, detect
from appliance.plan.model_info import COMPUTE_BYTES, inspect_config, inspect_model
from appliance.plan.plan import (
    BatchPlan,
    CachePlan,
    ExecutionPlan,
    MachinePlan,
    MemoryPlan,
    ModelPlan,
    ServerPlan,
    fingerprint,
    is_loopback,
)
from appliance.plan.sizes import parse_size
from appliance.plan.source import (
    SOURCES,
    config_dict,
    dense_bytes,
    dequantize,
    locate_model,
    synthetic_dtype,
    weights_resident,
)

TIERS = {"ram": RamTierConfig, "ssd": SsdTierConfig}  # each tier's fields and unset values
WORKLOAD = {f: getattr(ServerConfig, f) for f in ("clients", "typical_context")}  # unset

# uvicorn's log levels (it raises a KeyError at start-up on any other)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

# What is implemented today. Later capabilities extend these sets.
DTYPES = ("auto", "float32", "bfloat16", "float16")
BATCH_MODES = ("continuous", "serial")
# How each layer kind's rows are held when batched (mlx-lm's batch cache classes).
PLACEMENT = {
    "full": "engine/kv layout: rows left-padded to one write cursor, each row's length apart "
            "(native, or encoded per kv.quantized_layers); per-row rollback",
    "sliding": "engine/kv SlidingLayout (mlx-lm's rotation): each row keeps its last "
               "sliding_window tokens, native",
    "recurrent": "engine/kv RecurrentLayout: constant-size state per row, native",
}
CACHES = ("auto", "none", "ram", "ssd", "tiered")
BACKENDS = ("auto", "metal", "cuda", "cpu")


def _choice(problems: list[str], field: str, value: Any, valid: tuple) -> None:
    if value not in valid:
        problems.append(f"{field}={value!r} is not supported; valid choices: {', '.join(valid)}")


def _auto_int(problems: list[str], field: str, value: Any, least: int = 1) -> int | None:
    """An `auto`-or-integer knob: None for auto (derived later), else the integer."""
    if value == "auto":
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        problems.append(f"{field}={value!r} is not a number; write an integer >= {least}, "
                        "or auto")
        return None
    if n < least:
        problems.append(f"{field}={value} must be >= {least}")
    return n


def resolve(cfg: Any, profiles: tuple[str, ...] = ()) -> ExecutionPlan:
    """Turn a composed config (DictConfig or equivalent attribute tree) into a plan."""
    problems: list[str] = [_mlx_env.PROBLEM] if _mlx_env.PROBLEM else []
    notes: list[str] = []
    m, srv, mach = cfg.model, cfg.server, cfg.machine
    from omegaconf import DictConfig

    if isinstance(cfg, DictConfig):  # never accept and ignore a key (e.g. +batch.max_row=4)
        from appliance.config.schema import unknown_keys

        problems += unknown_keys(cfg)

    _choice(problems, "model.source", m.source, SOURCES)
    _choice(problems, "model.dtype", m.dtype, DTYPES)
    check_scheme(cfg.kv.scheme, problems)
    _choice(problems, "batch.mode", cfg.batch.mode, BATCH_MODES)
    _choice(problems, "cache.kind", cfg.cache.kind, CACHES)
    _choice(problems, "machine.backend", mach.backend, BACKENDS)
    b = cfg.batch
    chunk_set = _auto_int(problems, "batch.prefill_chunk", b.prefill_chunk)
    rows_set = _auto_int(problems, "batch.max_rows", b.max_rows)
    threads_set = _auto_int(problems, "batch.attention_threads", b.attention_threads)
    if b.prefill_rows < 1 or (rows_set and rows_set >= 1 and b.prefill_rows > rows_set):
        problems.append(f"batch.prefill_rows={b.prefill_rows} must be in 1..batch.max_rows "
                        f"({b.max_rows})")
    if b.mode == "serial" and rows_set not in (None, 1):
        problems.append(f"batch.max_rows={b.max_rows} with batch=serial: serial runs one row "
                        "at a time; use batch=continuous to decode rows together")
    if b.mode == "serial":  # the workload sizes the batch's rows and budget: serial has none
        problems += unread("server", srv, dict.fromkeys(WORKLOAD, ("continuous",)), WORKLOAD,
                           "batch", "serial")
    cache_kind = cfg.cache.kind
    if cache_kind == "auto":  # a RAM prefix cache, as mlx_lm.server keeps a prompt cache
        cache_kind = "none" if b.mode == "serial" else "ram"
    if cache_kind != "none" and b.mode == "serial":
        problems.append(f"cache={cfg.cache.kind} with batch=serial: the serial pin prefills every "
                        "prompt from scratch; use batch=continuous, or cache=none")
    compile_step = bool(getattr(b, "compile_step", False))
    if b.max_queue < 0:
        problems.append(f"batch.max_queue={b.max_queue} must be >= 0")
    ram_cap, ssd_cap = 0, 0  # ram_cap None: auto (derived below)
    for tier, kinds in (("ram", ("ram", "tiered")), ("ssd", ("ssd", "tiered"))):
        section = getattr(cfg.cache, tier)
        if cache_kind not in kinds:  # a tier's field set without the tier: refused
            chosen = cfg.cache.kind + ("" if cache_kind == cfg.cache.kind
                                       else f" (here {cache_kind})")
            unset = vars(TIERS[tier]())
            problems += unread(f"cache.{tier}", section, dict.fromkeys(unset, kinds), unset,
                               "cache", cache_kind, chosen)
            continue
        if tier == "ram" and section.bytes == "auto":
            ram_cap = None
            continue
        try:
            size = parse_size(section.bytes)
        except ValueError as e:
            problems.append(f"cache.{tier}.bytes: {e}")
            continue
        if tier == "ram":
            ram_cap = size
        else:
            ssd_cap = size
    kv_budget = None
    if b.kv_budget != "auto":
        try:
            kv_budget = parse_size(b.kv_budget)
        except ValueError as e:
            problems.append(f"batch.kv_budget: {e}")
    try:  # e.g. server.api_key='${oc.env:APPLIANCE_API_KEY}' with the variable unset
        api_key = srv.api_key
    except Exception as e:
        problems.append(f"server.api_key: {str(e).splitlines()[0]}")
        api_key = None
    if api_key is not None and not str(api_key).strip():
        problems.append("server.api_key is empty; set a key, or leave it null")
    if not is_loopback(srv.host) and not api_key and not srv.allow_unauthenticated:
        problems.append(f"server.host={srv.host} serves beyond this machine without a key; set "
                        "server.api_key (e.g. server.api_key='${oc.env:APPLIANCE_API_KEY}'), "
                        "or say server.allow_unauthenticated=true")
    elif srv.allow_unauthenticated and (api_key or is_loopback(srv.host)):  # it permits nothing
        problems.append("server.allow_unauthenticated=true has no effect " + (
            "beside server.api_key (every request needs the key)" if api_key else
            f"on the loopback host {srv.host} (it opens a non-loopback host without a key)"))
    if str(srv.log_level).lower() not in LOG_LEVELS:
        problems.append(f"server.log_level={srv.log_level!r}; valid choices: "
                        + ", ".join(LOG_LEVELS))
    # (the defaults a request without these fields gets: in the range a request may ask)
    if not 0 <= srv.default_temperature <= 2:
        problems.append(f"server.default_temperature={srv.default_temperature} must be in 0..2")
    if not 0 < srv.default_top_p <= 1:
        problems.append(f"server.default_top_p={srv.default_top_p} must be in (0, 1]")
    for key in ("memory_gb", "gpu_cores", "bandwidth_gbs", "tflops"):
        if getattr(mach, key) is not None and getattr(mach, key) <= 0:
            problems.append(f"machine.{key}={getattr(mach, key)} must be > 0, or null to "
                            "detect it")
    if mach.headroom_gb < 0:
        problems.append(f"machine.headroom_gb={mach.headroom_gb} must be >= 0")
    if not 0 < srv.port < 65536:
        problems.append(f"server.port={srv.port} must be in 1..65535")
    if srv.default_max_tokens < 1:
        problems.append(f"server.default_max_tokens={srv.default_max_tokens} must be >= 1")
    if not 0 <= srv.drain_seconds <= 3600:
        problems.append(f"server.drain_seconds={srv.drain_seconds} must be in 0..3600")
    if srv.warmup not in ("auto", True, False):
        problems.append(f"server.warmup={srv.warmup!r}; valid choices: auto, true, false")
    ctx_set = None if srv.max_context is None else _auto_int(problems, "server.max_context",
                                                              srv.max_context, least=2)
    if srv.clients < 1 or srv.typical_context < 1:
        problems.append(f"server.clients={srv.clients} and server.typical_context="
                        f"{srv.typical_context} must be >= 1")
    if not 0 <= mach.headroom_fraction < 1:
        problems.append(f"machine.headroom_fraction={mach.headroom_fraction} must be in [0, 1)")

    info = None
    path, model_id = locate_model(m, problems) if m.source in SOURCES else (None, "")
    if path is not None:
        try:
            if m.source == "synthetic":  # described from its config: nothing is built here
                from appliance.models.synthetic import config_for

                info = inspect_config(config_for(m.shape, synthetic_dtype(m), m.bits))
            else:
                info = inspect_model(path)
        except PlanError as e:
            problems += e.problems

    here = detect()
    if mach.backend not in ("auto", here.backend) and mach.backend in BACKENDS:
        problems.append(f"machine.backend={mach.backend!r} but MLX here runs on {here.backend!r}; "
                        f"valid choices on this machine: auto, {here.backend}")
    if mach.chip and mach.chip != here.chip:
        stated = f"profile {mach.name!r}" if mach.name in profiles else "the machine.* settings"
        memory = "" if mach.memory_gb else \
            f"; memory: this machine's {here.memory_bytes / GiB:.1f} GiB"
        notes.append(f"machine facts come from {stated} ({mach.chip}{memory}); "
                     f"MLX actually runs on {here.backend} ({here.chip})")
    if problems or info is None:
        raise PlanError(problems or ["model: could not be inspected"])

    memory = int(mach.memory_gb * GiB) if mach.memory_gb else here.memory_bytes
    headroom = max(int(mach.headroom_gb * GiB), int(mach.headroom_fraction * memory))
    facts = machine_facts(mach, here, memory - headroom)
    derived_why: dict[str, str] = {}
    dtype = m.dtype
    if m.dtype == "auto":
        dtype = info.checkpoint_dtype
        # where MLX really runs (a Mac profile planned on Linux still computes here)
        if here.backend == "cpu" and platform.system() == "Linux" and dtype != "float32":
            dtype = "float32"  # MLX's bf16/fp16 matmuls on CPU are scalar loops
            derived_why["model.dtype"] = (
                f"dtype=float32 (the checkpoint is {info.checkpoint_dtype}): on Linux CPU, "
                f"float32 matmuls run through {_blas.ACTIVE} BLAS, several times faster than "
                "16-bit ones; tokens equal mlx-lm's at float32")
    dense = dequantize(m.dequantize, info, dtype, here.backend, facts.usable, derived_why,
                       problems)
    cfg_dict = config_dict(m, path)
    trained = info.max_position_embeddings
    model = ModelPlan(
        source=m.source, id=model_id, path=str(path if m.source != "hf" else m.repo),
        revision=m.revision, architecture=info.architecture, layer_kinds=info.layer_kinds,
        sliding_window=info.sliding_window, vocab_size=info.vocab_size,
        hidden_size=info.hidden_size, num_kv_heads=info.num_kv_heads, head_dim=info.head_dim,
        max_position_embeddings=info.max_position_embeddings, parameters=info.parameters,
        checkpoint_dtype=info.checkpoint_dtype, dtype=dtype, quantization=info.quantization,
        weight_bytes_on_disk=info.weight_bytes,
        weight_bytes=dense_bytes(info, dtype) if dense else weights_resident(info, dtype),
        config_sha256=info.config_sha256, weights_sha256=info.weights_sha256,
        synthetic={"shape": m.shape, "bits": m.bits, "seed": m.seed}
        if m.source == "synthetic" else None, dequantized=dense,
    )

    threads, derived_why["batch.attention_threads"], problem = attention_threads(
        threads_set, here.backend, here.cpu_cores, info.num_kv_heads)
    problems += [problem] if problem else []
    if here.backend == "cpu":  # (engine/kv/cores.py: how its softmax runs here)
        derived_why["batch.attention_threads"] += (
            "; softmax: its exp compiled by MLX's JIT with FMA (appliance/_mlx_env.py: "
            "bit-equal, ~4x)"
            if _mlx_env.JIT and dtype == "float32" else
            "; softmax: MLX's own (" + ("not float32" if _mlx_env.JIT else
                                        "MLX's JIT has no FMA here: appliance/_mlx_env.py") + ")")
    # KV bytes per token do not depend on max_context (only its checks do: run them below)
    kv = resolve_kv(cfg.kv, info, dtype, here.backend, ctx_set or trained or 4096, [])
    draft = resolve_draft(cfg.draft, path, info, dtype, b.mode, problems)
    if kv is None or draft is None or problems:
        resolve_kv(cfg.kv, info, dtype, here.backend, ctx_set or trained or 4096, problems)
        raise PlanError(problems)
    per_tok = kv.bytes_per_token + draft.kv_bytes_per_token

    machine = MachinePlan(
        name=mach.name, backend=here.backend, chip=mach.chip or here.chip, memory_bytes=memory,
        gpu_cores=mach.gpu_cores, bandwidth_gbs=facts.bandwidth_gbs, headroom_bytes=headroom,
        blas=_blas.ACTIVE if here.backend == "cpu" else "n/a", planned_for=facts.backend,
        tflops=facts.tflops,
    )
    usable = facts.usable
    weights = model.weight_bytes + draft.weight_bytes  # the draft model or MTP head too
    if weights >= usable:
        raise PlanError([f"weights need {weights / GiB:.2f} GiB but only "
                         f"{usable / GiB:.2f} GiB is usable on {machine.name} "
                         f"(memory {memory / GiB:.1f} GiB - headroom {headroom / GiB:.1f} GiB); "
                         "pick a smaller or quantized model, or lower machine.headroom_gb"])
    heads = int(cfg_dict.get("num_attention_heads") or max(1, (info.hidden_size or 64) // 64))
    shape = Shape(weights=weights, parameters=max(1, info.parameters), per_token=max(1, per_tok),
                  hidden=info.hidden_size or 0,
                  intermediate=int(cfg_dict.get("intermediate_size") or
                                   4 * (info.hidden_size or 0)),
                  heads=heads, vocab=info.vocab_size, act_bytes=COMPUTE_BYTES.get(dtype, 4),
                  trained=trained, layers=len(info.layer_kinds),
                  fused_prefill=set(info.layer_kinds) <= {"full"}
                  and not (kv.quantized_layers and kv.start > 0),
                  native_per_token=kv.native_bytes_per_token + draft.kv_bytes_per_token,
                  start=kv.start, spec=draft.k, prefill_rows=b.prefill_rows)
    d = derive(facts, shape, Workload(srv.clients, srv.typical_context),
               max_rows=rows_set, prefill_chunk=chunk_set, max_context=ctx_set,
               trained_context=srv.max_context is None, kv_budget=kv_budget,
               ram=ram_cap, prefill_rows=b.prefill_rows, serial=b.mode == "serial")
    max_ctx, ram_cap = d.max_context, d.ram if ram_cap is None else ram_cap
    if cfg.cache.kind == "auto":
        derived_why["cache"] = (
            "cache=none: batch=serial prefills every prompt from scratch" if b.mode == "serial"
            else "cache=ram: prompts sharing a prefix (system prompt, earlier turns) reuse its "
                 "KV; SSD stays opt-in (cache=tiered)")
    derived_why.update(d.reasons)
    warmup = srv.warmup is True
    if srv.warmup == "auto":
        warmup = here.backend != "cpu"
        derived_why["server.warmup"] = (
            f"warmup={str(warmup).lower()}: " + (
                "a GPU builds kernels the first time it meets a shape; a burst of the batch's "
                "shapes before serving keeps that out of the first clients' time (a fresh "
                "H200 stalled them ~45 s)" if warmup else
                "no first-shape stall was measured on CPU; serving starts at once"))
    if compile_step:
        uncompiled = [why for bad, why in (
            (b.mode != "continuous", "batch=serial decodes unbatched"),
            (set(info.layer_kinds) != {"full"}, "the model has layers other than full attention"),
            (cfg.kv.scheme != "native", f"kv={cfg.kv.scheme} attends over codes"),
            (draft.kind == "mtp", "draft=mtp reads hidden states the traced step does not keep"),
        ) if bad]
        if uncompiled:  # (it would run uncompiled: refused, not taken and dropped)
            problems.append("batch.compile_step=true compiles batched decode over native "
                            "full-attention layers only, and here "
                            + "; ".join(uncompiled) + "; valid choices: batch.compile_step="
                            "false, or a plan it applies to")
    if b.prefill_rows > d.max_rows:
        problems.append(f"batch.prefill_rows={b.prefill_rows} must be in 1..batch.max_rows "
                        f"({d.max_rows})")
    resolve_kv(cfg.kv, info, dtype, here.backend, max_ctx, problems)
    if trained and max_ctx > trained:
        notes.append(f"server.max_context={max_ctx} exceeds the model's trained positions "
                     f"({trained}); quality may degrade past them")
    ceiling = (weights + d.activations + d.buffer_cache + d.kv_budget + d.copies + ram_cap)
    mem = MemoryPlan(usable_bytes=usable, weights_bytes=weights, kv_budget_bytes=d.kv_budget,
                     kv_and_cache_bytes=d.kv_budget + ram_cap,
                     kv_bytes_at_max_context=per_tok * max_ctx,
                     rows_at_max_context=rows_per_option(  # live KV and its copy
                         info, dtype, here.backend, cfg.kv, kv_budget or max(
                             0, usable - weights - d.activations - d.buffer_cache
                             - d.hit_copy) // 2, max_ctx),
                     activations_bytes=d.activations, buffer_cache_bytes=d.buffer_cache,
                     copies_bytes=d.copies, ram_bytes=ram_cap, ceiling_bytes=ceiling)
    if kv_budget is not None and kv_budget < shape.row(max_ctx, d.prefill_chunk):
        problems.append(f"batch.kv_budget={b.kv_budget} holds less than one row of "  # (no
                        f"server.max_context={max_ctx} ({shape.row(max_ctx, d.prefill_chunk):,} "
                        "bytes of KV); raise it, or lower server.max_context")  # row fills it)
    left = usable - ceiling  # < 0: the parts do not fit; say which knob to lower
    fixed = weights + d.activations + d.buffer_cache + d.hit_copy
    if ctx_set is not None and 3 * per_tok * max_ctx > usable - fixed + d.hit_copy:
        need = 3 * per_tok * max_ctx / GiB
        problems.append(f"server.max_context={max_ctx} needs {need:.2f} GiB of KV (the row, "
                        f"its copy on a hit, its rebuild copy) but only "
                        f"{(usable - fixed + d.hit_copy) / GiB:.2f} GiB is left after the "
                        "weights and activations; lower server.max_context")
    elif kv_budget is not None and left < 0 and kv_budget > (usable - fixed - ram_cap) // 2:
        problems.append(f"batch.kv_budget={b.kv_budget} is more than the "
                        f"{max(0, usable - fixed - ram_cap) / 2 / GiB:.2f} GiB left (with its "
                        "copies) after the weights, activations and the RAM tier; lower it or "
                        "use auto")
    elif left < 0 and cfg.cache.ram.bytes != "auto" and cache_kind in ("ram", "tiered"):
        problems.append(f"cache.ram.bytes={cfg.cache.ram.bytes} is more than the "
                        f"{(usable - fixed - 2 * d.kv_budget) / GiB:.2f} GiB left after the "
                        "weights, activations, live KV and its copies; lower it")
    elif left < 0:
        problems.append(f"the plan needs {ceiling / GiB:.2f} GiB (weights {weights / GiB:.2f}, "
                        f"live KV {d.kv_budget / GiB:.2f} and its copies {d.copies / GiB:.2f}, "
                        f"activations {d.activations / GiB:.2f}, MLX buffer cache "
                        f"{d.buffer_cache / GiB:.2f}) but {usable / GiB:.2f} GiB is usable; "
                        "lower batch.max_rows, server.max_context or batch.prefill_chunk")
    if problems:
        raise PlanError(problems)
    server = ServerPlan(host=srv.host, port=srv.port, api_key=api_key or None,
                        max_context=max_ctx,
                        default_max_tokens=srv.default_max_tokens,
                        default_temperature=srv.default_temperature,
                        default_top_p=srv.default_top_p, log_level=srv.log_level,
                        drain_seconds=float(srv.drain_seconds), clients=srv.clients,
                        typical_context=srv.typical_context, warmup=warmup)
    kinds = dict.fromkeys(info.layer_kinds)
    unbatchable = [k for k in kinds if k not in PLACEMENT]
    if b.mode == "continuous" and unbatchable:
        raise PlanError([f"batch=continuous: layer kind(s) {unbatchable} of {info.architecture} "
                         "cannot be batched; valid choices for this model: batch=serial"])
    placement = ({k: PLACEMENT[k] for k in kinds} if b.mode == "continuous"
                 else dict.fromkeys(kinds, "one row at a time"))
    lone_row = ("unbatched (generate_step arithmetic, no padding or mask) until a second "
                "row is admitted; then its cache joins the batch" if b.mode == "continuous"
                else "unbatched, always")
    if draft.kind != "none":
        lone_row = ("in the batched step, as a batch of one, where it speculates; unbatched "
                    "(as without a draft) where the control measured plain steps faster at "
                    "one row, and when seeded")
    if b.mode == "continuous" and kv.quantized_layers and kv.start > 0:
        placement["full"] += (f"; kv.start={kv.start} holds per row: in a batch, a row's "
                              "quantized layers stay native until it holds that many tokens "
                              "(its prefill chunks stop there), then are encoded once")
    batch = BatchPlan(mode=b.mode, max_rows=d.max_rows, prefill_chunk=d.prefill_chunk,
                      prefill_rows=b.prefill_rows, compile_step=compile_step,
                      attention_threads=threads,
                      kv_budget_bytes=d.kv_budget, max_queue=b.max_queue,
                      placement=placement, lone_row=lone_row)
    return ExecutionPlan(
        model=model, kv=kv, draft=draft, batch=batch,
        cache=CachePlan(kind=cache_kind, ram_bytes=ram_cap, ssd_bytes=ssd_cap,
                        ssd_path=str(Path(cfg.cache.ssd.path).expanduser()) if ssd_cap else None),
        server=server,
        machine=machine, memory=mem,
        profiles=tuple(profiles), notes=tuple(notes), derived=derived_why,
        fingerprint=fingerprint(model, kv, draft),
    )
