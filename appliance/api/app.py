"""create_app(plan, engine): the Litestar application."""

from __future__ import annotations

import time

from litestar import Litestar
from litestar.datastructures import State
from litestar.openapi import OpenAPIConfig

from appliance import __version__
from appliance.api.errors import HANDLERS
from appliance.api.routes import ROUTES
from appliance.api.security import guard
from appliance.engine import Engine
from appliance.plan import ExecutionPlan


def create_app(plan: ExecutionPlan, engine: Engine) -> Litestar:
    """The service for `plan`, driving an already started `engine`.

    The OpenAPI schema is served at /schema (/schema/openapi.json).
    """
    state = State({"plan": plan, "engine": engine, "tokenizer": engine.tokenizer,
                   "started": int(time.time())})
    return Litestar(
        route_handlers=ROUTES,
        state=state,
        exception_handlers=HANDLERS,
        guards=[guard],
        openapi_config=OpenAPIConfig(title="appliance", version=__version__),
    )
