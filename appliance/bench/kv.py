"""bench=kv: what the plan's KV scheme buys and costs, against native KV in the same run.

The anchor is the same overrides resolved again with kv=native (same model, dtype,
machine), measured in the same process on the same loaded weights: a scheme changes
only the caches. For each of the two schemes:

1. capacity: at one fixed KV budget (`bench.kv_budget`; `auto`: the plan's
   batch.kv_budget_bytes), the rows of `c` tokens that `Budget.try_admit` accepts, for
   each c in `bench.kv_capacity_contexts` (bookkeeping on each plan's true stored bytes
   per token; no MLX);
2. decode: aggregate tok/s of the engine's batched step (`BatchStep`) with B rows of
   `bench.kv_context` prompt tokens each (distinct seeded random ids), for B in
   `bench.kv_batches`. Every row's prefill finishes first (untimed), then
   WARMUP_TICKS untimed ticks, then `bench.repeats` spans of `bench.decode_tokens`
   ticks, each timed alone: tok/s = B * ticks / seconds (every tick reads its tokens
   back, so the clock is synced). MLX's active, cache and peak memory after prefill
   stand beside the plan's predicted KV bytes for those rows and the layouts' own;
3. short rows: B=1 at `bench.kv_short_context` tokens, through the path a lone request
   runs (`runner.Decoder`, "solo") and through the batched step ("batched").

Rows never stop at EOS: the step gets no stop tokens (the fleet bans EOS with a logit
bias over HTTP; here that would add a per-row processor pass to every timed step).
All MLX work runs on one new stream of the default device, as on the engine thread.
"""

from __future__ import annotations

import gc
import math
import random
import time
from pathlib import Path

from appliance.engine.budget import Budget, KVShape
from appliance.plan import ExecutionPlan, PlanError

ANCHOR = "native"
WARMUP_TICKS = 3  # untimed decode steps before the first timed span
PREFILL_TOKENS = 16384  # prompt tokens per prefill forward at most (rows x prefill_chunk)
ARITHMETIC_ROWS = 20_000  # past this many rows, count them by division (try_admit is O(n^2))
NEVER = 1 << 30  # max_tokens of a benchmark row: the bench stops it, not the step


# -- the anchor plan --------------------------------------------------------------------
def _is_kv_override(o: str) -> bool:
    key = o.lstrip("+~").split("=", 1)[0]
    return key == "kv" or key.startswith("kv.")


def compose_plan(overrides: list[str]) -> ExecutionPlan:
    """The plan the CLI would resolve for `overrides` (inside a Hydra job or outside one)."""
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra

    from appliance.cli import _profiles
    from appliance.plan import resolve

    if GlobalHydra.instance().is_initialized():  # inside `appliance` (a run or a sweep cell)
        cfg = compose("config", overrides=overrides)
    else:
        from hydra import initialize_config_dir

        from appliance.config.hydra_setup import conf_dir, setup

        setup()
        with initialize_config_dir(str(conf_dir()), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
    return resolve(cfg, profiles=_profiles(overrides))


def anchor_plan(plan: ExecutionPlan, overrides: list[str]) -> ExecutionPlan:
    """`overrides` with every kv override replaced by kv=native; the plan itself if native."""
    if plan.kv.scheme == ANCHOR:
        return plan
    keep = [o for o in overrides if not _is_kv_override(o)] + [f"kv={ANCHOR}"]
    try:
        anchor = compose_plan(keep)
    except PlanError as e:
        raise PlanError([f"the anchor (kv={ANCHOR} with the same overrides) does not resolve: "
                         f"{p}" for p in e.problems]) from None
    if anchor.model != plan.model:
        raise PlanError([f"the overrides {overrides} with kv={ANCHOR} make model "
                         f"{anchor.model.id} ({anchor.model.dtype}), not the benchmarked "
                         f"{plan.model.id} ({plan.model.dtype}): pass the command line's "
                         "overrides"])
    return anchor


def scheme_name(kv) -> str:
    """The conf/kv option a KVPlan came from (native, affine8, k8v4, ...), else its bits."""
    if kv.scheme == "native":
        return "native"
    try:
        from appliance.plan.kv import OPTIONS
    except ImportError:
        OPTIONS = {}  # noqa: N806
    for name, o in OPTIONS.items():
        if o.get("scheme") == kv.scheme and o.get("key_bits") == kv.key_bits \
                and o.get("value_bits") == kv.value_bits:
            return name
    bits = [f"{n}{b:g}" for n, b in (("k", kv.key_bits), ("v", kv.value_bits)) if b is not None]
    return "-".join([kv.scheme, *bits])


def budget_bytes(plan: ExecutionPlan, cfg) -> int:
    from appliance.plan.sizes import parse_size

    return plan.batch.kv_budget_bytes if str(cfg.kv_budget) == "auto" \
        else parse_size(cfg.kv_budget)


# -- 1. capacity ------------------------------------------------------------------------
def admitted_rows(budget: int, shape: KVShape, context: int) -> int:
    """Rows of `context` tokens (no completion) `Budget.try_admit` takes, one after another."""
    b = Budget(budget, shape)
    cost = b.cost(context, 0)
    if cost <= 0:
        raise ValueError(f"a row of {context} tokens costs {cost} bytes: rows are unbounded")
    if b.room // cost > ARITHMETIC_ROWS:
        return b.room // cost  # what the loop below would count, without its n^2 sums
    n = 0
    while b.try_admit(n, context, 0):
        n += 1
    return n


def _capacity(plans: dict, budget: int, contexts: list[int], recurrent: int) -> list[dict]:
    rows = []
    for c in contexts:
        anchor = admitted_rows(budget, KVShape.for_plan(plans[ANCHOR], recurrent), c)
        for name, p in plans.items():
            shape = KVShape.for_plan(p, recurrent)
            n = admitted_rows(budget, shape, c)
            rows.append({"scheme": name, "context": c, "row_bytes": shape.row_bytes(c),
                         "rows": n, "ratio_to_native": round(n / anchor, 3) if anchor else None})
    return rows


# -- 2. and 3. decode -------------------------------------------------------------------
def _prompts(seed: int, rows: int, context: int, vocab: int) -> list[list[int]]:
    """Distinct seeded random token ids: the same prompts for every scheme at one (B, c)."""
    rng = random.Random(f"{seed}/{rows}/{context}")
    return [[rng.randrange(vocab) for _ in range(context)] for _ in range(rows)]


def _prefill_rows(rows: int, chunk: int) -> int:
    return max(1, min(rows, PREFILL_TOKENS // max(1, chunk)))


def row_tokens_bound(rows: int, context: int, chunk: int, ticks: int) -> int:
    """Most tokens one row's KV holds in a run: its prompt, the decode steps it runs while
    later rows prefill, the warm-up and the timed ticks."""
    groups = math.ceil(rows / _prefill_rows(rows, chunk))
    return context + groups * (math.ceil(context / chunk) + 1) + WARMUP_TICKS + ticks + 1


def _release() -> None:
    import mlx.core as mx

    gc.collect()
    mx.clear_cache()


def _memory(mx, base_active: int) -> dict:
    mx.synchronize()
    active = mx.get_active_memory()
    return {"active_bytes": active, "cache_bytes": mx.get_cache_memory(),
            "peak_bytes": mx.get_peak_memory(), "active_over_weights_bytes": active - base_active}


def _timed(tick, n: int, repeats: int, per_tick: int) -> list[float]:
    for _ in range(WARMUP_TICKS):
        tick()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            tick()
        runs.append(per_tick * n / (time.perf_counter() - t0))
    return runs


def batched_decode(model, plan: ExecutionPlan, rows: int, context: int, n: int, repeats: int,
                   seed: int, recurrent: int = 0) -> dict:
    """B=`rows` rows through BatchStep under `plan.kv`: tok/s runs and memory after prefill."""
    import mlx.core as mx

    from appliance.engine.compiled import CompiledDecode
    from appliance.engine.kv import Scheme, cores
    from appliance.engine.sampling import make_sampler
    from appliance.engine.step import BatchStep
    from appliance.engine.types import SamplingParams

    chunk = plan.batch.prefill_chunk
    cores.use(plan.batch.attention_threads)  # as the engine thread does
    step = BatchStep(model, set(), rows, chunk, Scheme.from_plan(plan.kv),
                     prefill_rows=_prefill_rows(rows, chunk),
                     compiled=CompiledDecode(model) if plan.batch.compile_step else None)
    sampler = make_sampler(SamplingParams(temperature=0.0))
    prompts = _prompts(seed, rows, context, plan.model.vocab_size)
    _release()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    uids = [step.insert([p], NEVER, sampler) for p in prompts]
    del prompts
    decoded = dict.fromkeys(uids, 0)
    started, t0 = 0, time.perf_counter()
    while started < rows:
        prompt_events, events = step.tick()
        started += sum(e.end_of_prompt for e in prompt_events)
        for e in events:
            decoded[e.uid] += 1
    memory = _memory(mx, base)
    prefill_s = time.perf_counter() - t0
    shape = KVShape.for_plan(plan, recurrent)
    memory["kv_bytes_predicted"] = sum(shape.row_bytes(context + k) for k in decoded.values())
    memory["kv_bytes_held"] = step.nbytes  # the layouts' arrays (growth slack included)

    def tick():
        prompt_events, events = step.tick()
        if prompt_events or len(events) != rows or any(e.finish_reason for e in events):
            raise RuntimeError(f"a timed tick ran {len(prompt_events)} prefill events and "
                               f"{len(events)} of {rows} tokens")

    runs = _timed(tick, n, repeats, rows)
    step = None  # frees the rows' KV before the next run
    _release()
    return {"prefill_s": round(prefill_s, 3), "runs": runs, "memory": memory}


def solo_decode(model, plan: ExecutionPlan, context: int, n: int, repeats: int,
                seed: int) -> dict:
    """One row through runner.Decoder (what a lone request runs) under `plan.kv`."""
    from appliance.engine.kv import Scheme
    from appliance.engine.runner import Decoder
    from appliance.engine.types import SamplingParams

    prompt = _prompts(seed, 1, context, plan.model.vocab_size)[0]
    _release()
    d = Decoder(model, prompt, SamplingParams(temperature=0.0), plan.batch.prefill_chunk,
                scheme=Scheme.from_plan(plan.kv))
    runs = _timed(d.next, n, repeats, 1)
    del d
    _release()
    return {"runs": runs}


def _summarize(rec: dict, anchor: dict | None) -> dict:
    from appliance.bench.stats import median

    med = median(rec["runs"])
    rec["tok_s_median"] = round(med, 2)
    rec["runs"] = [round(x, 2) for x in rec["runs"]]
    rec["ratio_to_native"] = 1.0 if anchor is None else round(med / anchor["_median"], 3)
    rec["_median"] = med
    return rec


# -- the workload -----------------------------------------------------------------------
def check_fits(plans: dict, cfg) -> list[str]:
    """Runs whose native KV alone would exceed the memory left after the weights."""
    anchor = plans[ANCHOR]
    room = anchor.memory.kv_and_cache_bytes
    shape = KVShape.for_plan(anchor)
    ticks = cfg.decode_tokens * cfg.repeats
    problems = []
    for rows, context in [(b, cfg.kv_context) for b in cfg.kv_batches] + \
            [(1, cfg.kv_short_context)]:
        need = rows * shape.row_bytes(row_tokens_bound(rows, context, anchor.batch.prefill_chunk,
                                                       ticks))
        if need > room:
            problems.append(f"bench=kv: {rows} rows of {context} tokens need {need:,} bytes of "
                            f"native KV, more than the {room:,} left after the weights; lower "
                            "bench.kv_batches or bench.kv_context")
    return problems


def run_kv(plan: ExecutionPlan, cfg, path: Path, overrides: list[str]) -> dict:
    import mlx.core as mx

    from appliance.bench.progress import bar
    from appliance.engine import runner
    from appliance.engine.build import _recurrent_bytes

    anchor = anchor_plan(plan, overrides)
    plans = {ANCHOR: anchor}
    plans.setdefault(scheme_name(plan.kv), plan)
    if problems := check_fits(plans, cfg):
        raise PlanError(problems)
    budget = budget_bytes(plan, cfg)
    n, repeats, seed = cfg.decode_tokens, max(1, cfg.repeats), cfg.seed
    decode, short = [], []
    runs = (len(cfg.kv_batches) + 2) * len(plans)  # (minutes at the defaults: a bar says so)
    with mx.stream(mx.new_stream(mx.default_device())), \
            bar(f"kv: {' vs '.join(plans)}", runs, cfg.progress) as advance:
        model, _ = runner.load(str(path), plan.model.dtype, plan.model.revision,
                               dequantize=plan.model.dequantized)
        recurrent = _recurrent_bytes(model)
        capacity = _capacity(plans, budget, list(cfg.kv_capacity_contexts), recurrent)
        for rows in cfg.kv_batches:
            first = None
            for name, p in plans.items():
                rec = batched_decode(model, p, rows, cfg.kv_context, n, repeats, seed, recurrent)
                rec = _summarize({"scheme": name, "batch": rows, "context": cfg.kv_context,
                                  **rec}, first)
                first = first or rec
                decode.append(rec)
                advance()
        for kind in ("solo", "batched"):
            first = None
            for name, p in plans.items():
                if kind == "solo":
                    rec = solo_decode(model, p, cfg.kv_short_context, n, repeats, seed)
                else:
                    rec = batched_decode(model, p, 1, cfg.kv_short_context, n, repeats, seed,
                                         recurrent)
                rec = _summarize({"scheme": name, "path": kind, "batch": 1,
                                  "context": cfg.kv_short_context, **rec}, first)
                first = first or rec
                short.append(rec)
                advance()
        del model
        _release()
    for rec in decode + short:
        rec.pop("_median")
    return {
        "anchor": ANCHOR, "scheme": scheme_name(plan.kv),
        "schemes": [{"name": name, "fingerprint": p.fingerprint, "scheme": p.kv.scheme,
                     "key_bits": p.kv.key_bits, "value_bits": p.kv.value_bits,
                     "group_size": p.kv.group_size, "quantized_layers": list(p.kv.quantized_layers),
                     "bytes_per_token": p.kv.bytes_per_token,
                     "native_bytes_per_token": p.kv.native_bytes_per_token,
                     "sliding_bytes_per_token": p.kv.sliding_bytes_per_token}
                    for name, p in plans.items()],
        "kv_budget_bytes": budget, "recurrent_bytes_per_row": recurrent,
        "decode_tokens": n, "repeats": repeats, "warmup_ticks": WARMUP_TICKS,
        "capacity": capacity, "decode": decode, "short": short,
        "plan_rows_at_max_context": dict(plan.memory.rows_at_max_context),
        "max_context": plan.server.max_context,
    }
