"""create_app(plan, engine): the Litestar application."""

from __future__ import annotations

import time

from litestar import Litestar
from litestar.datastructures import State
from litestar.openapi import OpenAPIConfig

from appliance import __version__
from appliance.api.errors import HANDLERS
from appliance.api.metrics import Metrics, arrival, metrics_endpoint
from appliance.api.openapi import document
from appliance.api.routes import ROUTES
from appliance.api.security import guard
from appliance.engine import Engine
from appliance.plan import ExecutionPlan


def create_app(plan: ExecutionPlan, engine: Engine) -> Litestar:
    """The service for `plan`, driving an already started `engine`.

    The OpenAPI schema is served at /schema (/schema/openapi.json), Prometheus metrics at
    /metrics (appliance.api.metrics).
    """
    metrics = Metrics(engine)
    state = State({"plan": plan, "engine": engine, "tokenizer": engine.tokenizer,
                   "started": int(time.time()), "metrics": metrics})
    app = Litestar(
        route_handlers=[*ROUTES, metrics_endpoint],
        state=state,
        exception_handlers=HANDLERS,
        guards=[guard],
        middleware=[arrival],
        before_send=[metrics.before_send],
        openapi_config=OpenAPIConfig(title="appliance", version=__version__),
    )
    document(app, plan)
    return app
