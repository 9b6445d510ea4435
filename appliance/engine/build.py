"""build_engine(plan): the engine the plan describes, started and loaded."""

from __future__ import annotations

from appliance.engine.engine import Engine
from appliance.plan import ExecutionPlan


def build_engine(plan: ExecutionPlan) -> Engine:
    if plan.batch.mode != "serial":  # resolve() refuses these; this guards direct callers
        raise ValueError(f"batch.mode={plan.batch.mode!r} has no engine yet")
    m = plan.model
    return Engine(m.path, m.dtype, m.revision, plan.batch.prefill_chunk).start()
