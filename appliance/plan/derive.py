"""The `auto` knobs: derived from the machine's facts and the workload, each with its reason.

One memory account, every part named (docs/memory.md explains each):

    usable = memory - headroom
           >= weights + activations + buffer_cache + hit_copy   (fixed, whatever the load)
              + kv_budget                                       (live KV, admission keeps it)
              + kv_budget                                       (copies: a row joining or
                                                                 leaving rebuilds the batch's
                                                                 buffers while the old live)
              + ram                                             (RAM tier, SSD-writer copies)

Then the knobs, in order (each explicit value wins and is only checked):
- prefill_chunk: 2048 on a GPU (mlx-lm's prefill step; big matmuls keep it busy), 256 on a
  CPU (compute-bound already; a smaller chunk stalls running rows less, and its unfused
  attention's score matrices stay small), halved while its activations would take more than
  2% of usable memory;
- max_context: the model's trained positions, capped so one row and its copy fit;
- max_rows: the fewer of two bounds: the workload's clients and the rows whose typical
  contexts (and their copies) fit in KV_SHARE of the room. Where batched decode stops being
  bandwidth-bound (a weight byte read once serves that many rows' FLOPs) is stated, not a
  cap: past it rows share compute rather than add throughput, but a client without a row
  waits for a whole reply before its first token (measured on CPU's fleet bench: 6 rows
  against 8 clients, TTFT p95 700-740 ms; 8 rows, 144-150 ms and 8% more tokens/s);
- kv_budget: max_rows typical contexts, or one max_context row if larger;
- cache.ram.bytes: RAM_SHARE of what is left; the rest absorbs what no account sees
  (allocator fragmentation, the OS).
Pure arithmetic: no MLX, unit-tested.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance import _mlx_env
from appliance.plan.kv import full_row_bytes, prefill_extra
from appliance.plan.machine import (
    DEFAULT_BANDWIDTH,
    DEFAULT_CUDA_TFLOPS,
    TFLOPS_PER_CORE,
    known_facts,
)
from appliance.plan.sizes import format_size

KV_SHARE = 0.5  # at most this share of the room goes to live KV (and its copies)
RAM_SHARE = 0.5  # the RAM tier takes this share of what live KV leaves
ACTIVATION_SHARE = 0.02  # prefill activations may take this share of usable memory
MIN_BUFFER_CACHE = 64 << 20  # MLX keeps at least this much of freed buffers for reuse
MAX_ROWS = 64
# On CPU a chunk's unfused attention holds a chunk x context score matrix per head: at 256
# rows of it an agents run and a cold 4k prompt both ran faster than at 512 (28th session)
GPU_CHUNK, CPU_CHUNK = 2048, 256
# mlx-lm's KV buffers grow 256 tokens at a time past wherever the last write ended: a row's
# buffers may hold up to two steps beyond its tokens (admission counts tokens exactly)
GROWTH_TOKENS = 2 * 256


@dataclass(frozen=True)
class Facts:
    """What derivation reads of the machine (stated by a profile, or detected)."""

    backend: str  # the backend the facts describe: metal | cuda | cpu
    usable: int  # memory - headroom
    bandwidth_gbs: float
    tflops: float
    sources: str  # where bandwidth and tflops came from (profile, data sheet, default)


@dataclass(frozen=True)
class Shape:
    """The model's arithmetic."""

    weights: int  # resident bytes (draft included)
    parameters: int
    per_token: int  # KV bytes per token, as stored (draft included)
    hidden: int
    intermediate: int
    heads: int  # attention (query) heads
    vocab: int
    act_bytes: int  # bytes per activation element (the compute dtype)
    trained: int | None  # max_position_embeddings
    layers: int = 1  # decoder layers
    fused_prefill: bool = True  # on CUDA a lone row's prefill attends fused (every layer
    #                             full attention, KV not split by kv.start: engine/step.py)
    native_per_token: int = 0  # before kv.start: native KV (an encoding scheme's rows)
    start: int = 0  # kv.start
    spec: int = 0  # draft.k
    prefill_rows: int = 1  # rows prefilled together

    def row(self, tokens: int, chunk: int = 0) -> int:
        """One row's most KV bytes, as admission counts them (engine/budget.py; `chunk`:
        with it, what the rows being prefilled may hold past kv.start natively)."""
        return (full_row_bytes(tokens, self.per_token, self.native_per_token, self.start,
                               self.spec)
                + self.prefill_rows * prefill_extra(self.per_token, self.native_per_token,
                                                    self.start, self.spec, chunk))


@dataclass(frozen=True)
class Workload:
    clients: int
    typical_context: int


@dataclass(frozen=True)
class Derived:
    max_rows: int
    prefill_chunk: int
    max_context: int
    kv_budget: int
    ram: int
    activations: int
    buffer_cache: int
    hit_copy: int
    copies: int
    reasons: dict[str, str]


def machine_facts(mach, here, usable: int) -> Facts:
    """The machine facts the auto knobs read: a profile's, else KNOWN's, else defaults.
    A profile describing another machine (e.g. an Apple chip, planned on Linux) is planned
    as that machine: its backend (metal) is KNOWN's, or metal for any Apple chip."""
    stated = bool(mach.chip) and mach.chip != here.chip
    known = known_facts(mach.chip or here.chip)
    backend = here.backend
    if stated and known:
        backend = known[0]
    elif stated and "apple" in mach.chip.lower():
        backend = "metal"
    src = []
    if mach.bandwidth_gbs:
        bw = float(mach.bandwidth_gbs)
    elif known:
        bw = known[1]
        src.append("bandwidth from the data sheet")
    else:
        bw = DEFAULT_BANDWIDTH[backend]
        src.append(f"bandwidth {bw:g} GB/s assumed for {backend}; state machine.bandwidth_gbs")
    if mach.tflops:
        tf = float(mach.tflops)
    elif known:
        tf = known[2]
    elif backend == "cuda":
        tf = DEFAULT_CUDA_TFLOPS
        src.append(f"{tf:g} TFLOPs assumed; state machine.tflops")
    else:
        cores = mach.gpu_cores if backend == "metal" and mach.gpu_cores else here.cpu_cores
        tf = cores * TFLOPS_PER_CORE[backend]
        src.append(f"{tf:g} TFLOPs from {cores} {'GPU' if backend == 'metal' else 'CPU'} cores")
    return Facts(backend=backend, usable=usable, bandwidth_gbs=bw, tflops=tf,
                 sources="; ".join(src))


GRID = 256  # a lone row's fused prefill pass on CUDA starts at a multiple (engine/step.py)


def activations(s: Shape, chunk: int, rows: int, prefill_rows: int, context: int,
                backend: str, whole_pass: bool = True) -> int:
    """Peak transient bytes of one step: a prefill chunk's layer activations (residual, the
    normed input, q/k/v, the MLP's gate, up and product), plus, where MLX's attention is
    not fused (CPU; CUDA for rows prefilled together, which need an array mask, and for
    models whose layers are not all full attention), the chunk's score and softmax
    matrices against `context` keys; and the decode step's
    logits (float32 logits, log-probabilities, sampling) for `rows`. On CUDA a pass's
    temporaries live until the pass completes (`whole_pass`: every layer's at once):
    measured on an H200, a 2048-token chunk of the 16-layer 1B shape peaked at 1.1-2.0 GiB
    against 0.13 GiB for one layer's (not measured on Metal: counted per layer there)."""
    per_token = 3 * s.hidden + 2 * s.heads * (s.hidden // max(1, s.heads)) + 3 * s.intermediate
    fed = prefill_rows * chunk
    if backend == "cuda" and s.fused_prefill:  # a lone row's fused pass starts on a grid
        fed = max(fed, chunk + GRID)  # (up to GRID cached tokens fed again)
    prefill = fed * per_token * s.act_bytes
    if backend == "cpu" or (backend == "cuda" and (prefill_rows > 1 or not s.fused_prefill)):
        # MLX's softmax works in place; a compiled one (CPU, float32: engine/kv/cores.py)
        # holds the scores, their exp and the result at once (measured with MLX's peak)
        held = 3 if backend == "cpu" and _mlx_env.JIT and s.act_bytes == 4 else 2
        prefill += held * prefill_rows * s.heads * chunk * (context + chunk) * s.act_bytes
    if backend == "cuda" and whole_pass:
        prefill *= max(1, s.layers)
    decode = rows * 3 * s.vocab * 4
    return prefill + decode


def ridge_rows(f: Facts, s: Shape) -> float:
    """Rows up to which batched decode is bandwidth-bound: each step reads every weight byte
    once and does 2 FLOPs per parameter per row, so rows stay nearly free until
    rows * 2 * parameters / FLOPs reaches weights / bandwidth."""
    return (f.tflops * 1e12) * (s.weights / max(1, s.parameters)) / (2 * f.bandwidth_gbs * 1e9)


def derive(f: Facts, s: Shape, w: Workload, *, max_rows: int | None, prefill_chunk: int | None,
           max_context: int | None, trained_context: bool, kv_budget: int | None,
           ram: int | None, prefill_rows: int, serial: bool) -> Derived:
    """The knobs given as None are derived; the others are taken as given."""
    why: dict[str, str] = {}
    gib = format_size
    free = f.usable - s.weights  # what live KV, copies, the RAM tier and transients share
    trained = s.trained or 4096
    rows_hint = 1 if serial else max_rows or min(w.clients, MAX_ROWS)  # serial: one row

    if prefill_chunk is None:
        chunk = CPU_CHUNK if f.backend == "cpu" else GPU_CHUNK
        base = chunk
        while chunk > 128 and activations(s, chunk, rows_hint, prefill_rows,
                                          max_context or trained, f.backend,
                                          whole_pass=False) > ACTIVATION_SHARE * f.usable:
            chunk //= 2
        why["batch.prefill_chunk"] = (
            f"prefill_chunk={chunk}: " + ("on a GPU, mlx-lm's prefill step keeps its matmuls "
                                          "large" if f.backend != "cpu" else
                                          "on CPU prefill is compute-bound at small chunks, a "
                                          "smaller chunk stalls running rows less, and its "
                                          "unfused attention's score matrices stay small")
            + (f"; halved from {base} to keep activations under "
               f"{ACTIVATION_SHARE:.0%} of usable memory" if chunk < base else ""))
    else:
        chunk = prefill_chunk

    def fixed(ctx: int, rows: int) -> tuple[int, int, int]:
        act = activations(s, chunk, rows, prefill_rows, ctx, f.backend)
        return act, max(MIN_BUFFER_CACHE, act), ctx * s.per_token  # act, cache, hit copy

    if max_context is None:
        if trained_context:  # server.max_context=null: the trained positions, unchecked here
            ctx = trained
            why["server.max_context"] = f"max_context={ctx}: the model's trained positions"
        else:
            # one row at ctx, its rebuild copy and a hit's copy: 3 * ctx * per_token, in
            # what the weights and a prefill chunk's activations over ctx keys leave (those
            # at ctx, not at the trained length: a 2048-token chunk's CPU scores over 131k
            # keys once capped the 1B shape at 256 tokens)
            def fits(t: int) -> bool:
                act, cache, _ = fixed(t, 1)
                return 3 * t * s.per_token <= KV_SHARE * (free - act - cache)

            lo, hi = 1, trained // 256  # the largest multiple of 256 that fits (at least 256)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if fits(mid * 256) else (lo, mid - 1)
            ctx = trained if fits(trained) else lo * 256
            act, cache, _ = fixed(ctx, 1)
            why["server.max_context"] = (
                f"max_context={ctx}: the model's trained positions ({trained})"
                + (f", capped so one row, its copy on a hit and its rebuild copy fit in "
                   f"{KV_SHARE:.0%} of the {gib(max(0, free - act - cache))} left after the "
                   f"weights and a prefill chunk's activations over {ctx} keys and the buffer "
                   f"cache ({gib(act + cache)})" if ctx < trained
                   else f"; one such row and its copies ({gib(3 * ctx * s.per_token)}) fit "
                        f"easily in the {gib(free)} left after the weights"))
            if kv_budget is not None and s.row(ctx, chunk) > kv_budget:
                held = next((t for t in range(ctx // 256 * 256, 0, -256)
                             if s.row(t, chunk) <= kv_budget), 0)
                if held >= 256:  # (below: a plan error, resolve.py)
                    ctx = held
                    why["server.max_context"] += (f"; then capped at {ctx}, what one row "
                                                  f"may hold in batch.kv_budget="
                                                  f"{gib(kv_budget)}")
    else:
        ctx = max_context
    typical = min(w.typical_context, ctx)
    act, cache, hit = fixed(ctx, rows_hint)
    room = free - act - cache - hit

    if max_rows is None:
        by_mem = int(KV_SHARE * room) // max(1, 2 * s.per_token * typical)
        ridge = ridge_rows(f, s)
        rows = max(1, min(w.clients, by_mem, MAX_ROWS))
        limits = [(w.clients, f"the workload's {w.clients} clients"),
                  (by_mem, f"memory: {by_mem} contexts of {typical} tokens "
                           f"({gib(s.per_token * typical)} each, twice with its copy) fit in "
                           f"{KV_SHARE:.0%} of the {gib(room)} room"),
                  (MAX_ROWS, f"the cap of {MAX_ROWS}")]
        limits.sort(key=lambda x: x[0])
        bound = (f"past ~{ridge:.0f} rows decode is compute-bound ({f.tflops:g} TFLOPs / "
                 f"{f.bandwidth_gbs:g} GB/s at {s.weights / s.parameters:.2f} bytes per "
                 "parameter): rows then share compute rather than add throughput, which beats "
                 "a client waiting for a whole reply before its first token"
                 if ridge < rows else f"decode stays bandwidth-bound up to ~{ridge:.0f} rows")
        why["batch.max_rows"] = (
            f"max_rows={rows}: set by {limits[0][1]}; then "
            + "; ".join(text for _, text in limits[1:]) + f"; {bound}"
            + (f" ({f.sources})" if f.sources else ""))
    else:
        rows = max_rows
    if serial:
        rows = 1
    act, cache, hit = fixed(ctx, rows)  # now for the rows decided

    if kv_budget is None:  # (prefill chunks past kv.start, encoded schemes: on top)
        budget = max(rows * s.row(typical), s.row(ctx)) + s.row(0, chunk)
        why["batch.kv_budget"] = (
            f"kv_budget={gib(budget)}: " + (f"{rows} rows of {typical} tokens"
                                            if rows > 1 and rows * typical >= ctx else
                                            f"one row of max_context={ctx} tokens")
            + f" at {s.per_token:,} bytes per token; admission queues beyond it")
    else:
        budget = kv_budget
    # the batch rebuilt on a join or leave, a hit's copy, buffers' growth steps past tokens
    copies = budget + hit + rows * GROWTH_TOKENS * s.per_token

    if ram is None:
        left = free - act - cache - budget - copies
        size = max(0, int(RAM_SHARE * left))
        why["cache.ram.bytes"] = (
            f"ram={gib(size)}: {RAM_SHARE:.0%} of the {gib(max(0, left))} left after the weights,"
            f" live KV and its copies, activations and MLX's buffer cache; the rest absorbs "
            "what no account sees (fragmentation, the OS)")
    else:
        size = ram
    return Derived(max_rows=rows, prefill_chunk=chunk, max_context=ctx, kv_budget=budget,
                   ram=size, activations=act, buffer_cache=cache, hit_copy=hit, copies=copies,
                   reasons=why)


def attention_threads(setting: int | None, backend: str, cores: int,
                      kv_heads: int | None) -> tuple[int, str, str | None]:
    """(threads attention is split over, why, a problem or None).

    On the CPU backend MLX runs each op on one thread and only BLAS uses every core, so
    attention over long contexts (mostly its softmax) leaves the other cores idle; split by
    kv head over streams it runs on several at once, bit-exact (engine/kv/cores.py: decode
    steps and long prefill chunks). A GPU runs attention on the device: 1 there."""
    heads = max(1, kv_heads or 1)
    if backend != "cpu":
        if setting not in (None, 1):
            return 1, "", (f"batch.attention_threads={setting} applies to the CPU backend; MLX "
                           f"runs attention on the {backend} device here; valid choices: auto, 1")
        return 1, f"attention_threads=1: attention runs on the {backend} device", None
    if setting is not None:
        if setting > heads:
            return 1, "", (f"batch.attention_threads={setting} exceeds the model's {heads} kv "
                           f"heads (attention splits by kv head); valid choices: auto, "
                           f"1..{heads}")
        return setting, (f"attention_threads={setting} (set): decode steps and prefill chunks "
                         "of 128+ tokens; encoded KV layers keep their codec's one-thread "
                         "kernel"), None
    n = max(1, min(cores, heads))
    return n, (f"attention_threads={n}: MLX's CPU ops run on one thread each, BLAS alone on "
               f"every core; attention (decode steps, prefill chunks of 128+ tokens) split "
               f"by kv head runs on min({cores} cores, {heads} kv heads) at once, bit-exact "
               "(measured on a 2-core EPYC: a B=16 step over 2.5k-token rows 56-75 ms on one "
               "thread, 35 ms on two); encoded KV layers keep their codec's one-thread kernel"
               ), None
