"""config -> ExecutionPlan. `resolve` is the only way in."""

from appliance.plan.errors import PlanError
from appliance.plan.plan import ExecutionPlan
from appliance.plan.resolve import resolve

__all__ = ["ExecutionPlan", "PlanError", "resolve"]
