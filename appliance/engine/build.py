"""build_engine(plan): the engine the plan describes, started and loaded."""

from __future__ import annotations

from appliance.engine.budget import Budget, KVShape
from appliance.engine.engine import Engine
from appliance.plan import ExecutionPlan


def _recurrent_bytes(model) -> int:
    """Constant per-row state of recurrent layers, measured once on a 1-token forward."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, make_prompt_cache

    cache = make_prompt_cache(model)
    if not any(isinstance(c, ArraysCache) for c in cache):
        return 0
    model(mx.array([[0]]), cache=cache)
    mx.eval([c.state for c in cache])
    return sum(c.nbytes for c in cache if isinstance(c, ArraysCache))


def _prefix(plan: ExecutionPlan):
    """The plan's prefix cache (RAM tier, SSD tier), or None for cache=none."""
    from appliance.engine.prefix_cache import PrefixCache, RamTier
    from appliance.engine.ssd_tier import SsdTier

    c = plan.cache
    if c.kind == "none":
        return None
    start = plan.kv.start  # (encoded entries are cut only from here: `cut_from`)
    return PrefixCache(
        ram=RamTier(c.ram_bytes, encoded_from=start) if c.kind in ("ram", "tiered") else None,
        ssd=SsdTier(c.ssd_path, c.ssd_bytes, plan.fingerprint, encoded_from=start)
        if c.kind in ("ssd", "tiered") else None)


def make_drafter(draft, model, dtype: str, chunk: int, model_dir: str | None = None):
    """(drafter, control) for the plan's draft section; (None, None) for draft=none."""
    from appliance.engine.speculate import Control, LookupDrafter, ModelDrafter

    if draft.kind == "none":
        return None, None
    if draft.kind == "lookup":
        drafter = LookupDrafter(draft.ngram_min, draft.ngram_max)
    elif draft.kind == "model":
        from appliance.engine import runner

        drafter = ModelDrafter(runner.load(draft.path, dtype)[0], chunk)
    else:  # mtp
        from appliance.engine.runner import DTYPES
        from appliance.engine.speculate import MTPDrafter
        from appliance.models.mtp import load_mtp

        head_file = None if draft.head == "checkpoint" else draft.path
        head = load_mtp(model_dir, model, head_file=head_file)
        head.set_dtype(DTYPES[dtype])
        drafter = MTPDrafter(head, model, chunk)
    return drafter, Control(draft.k, draft.adaptive)


def build_engine(plan: ExecutionPlan) -> Engine:
    from appliance.engine import runner

    m, b = plan.model, plan.batch
    budget = Budget(b.kv_budget_bytes, KVShape.for_plan(plan))

    def load():
        from appliance.models import materialize

        path = m.path if m.source == "hf" else str(materialize(m))
        load.path = path  # where an MTP head in the checkpoint is read from
        return runner.load(path, m.dtype, m.revision, dequantize=m.dequantized)

    def make_scheduler(model, eos_ids, _stream):  # the engine thread runs on it
        from appliance.engine.kv import Scheme, cores

        cores.use(b.attention_threads)

        budget.shape = KVShape(**{**budget.shape.__dict__, "recurrent": _recurrent_bytes(model)})
        scheme = Scheme.from_plan(plan.kv)
        ctl = None  # (serial: no draft)
        if b.mode == "serial":
            from appliance.engine.serial import SerialScheduler

            def new(cached: bool, control):
                return SerialScheduler(model, eos_ids, b.prefill_chunk, scheme)
        else:
            from appliance.engine.continuous import ContinuousScheduler

            drafter, ctl = make_drafter(plan.draft, model, m.dtype, b.prefill_chunk,
                                        model_dir=load.path)

            def new(cached: bool, control):
                return ContinuousScheduler(model, eos_ids, b.max_rows, b.prefill_chunk, budget,
                                           prefix=_prefix(plan) if cached else None,
                                           ceiling=plan.memory.kv_and_cache_bytes,
                                           scheme=scheme, prefill_rows=b.prefill_rows,
                                           drafter=drafter, control=control,
                                           compile_step=b.compile_step)
        warmed = 0.0
        if plan.server.warmup:  # a throwaway scheduler: no cache entries, no counters
            from appliance.engine.warmup import Alternating, burst, warm_up

            rows = b.max_rows if b.mode == "continuous" else 1
            warmed = warm_up(new(False, ctl and Alternating(ctl.k)),
                             burst(rows, b.prefill_chunk, m.vocab_size, eos_ids,
                                   plan.server.max_context))
        s = new(True, ctl)
        s.counters.warmup_seconds = warmed
        return s

    mem = plan.memory  # MLX's limits come from the plan's one account (docs/memory.md)
    return Engine(load, make_scheduler, mode=b.mode, max_rows=b.max_rows,
                  max_queue=b.max_queue, budget=budget, vocab_size=m.vocab_size,
                  memory_limit=mem.ceiling_bytes or None,
                  cache_limit=mem.buffer_cache_bytes or None).start()
