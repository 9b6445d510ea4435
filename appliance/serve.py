"""mode=serve: build the engine the plan describes and serve it with uvicorn (one worker)."""

from __future__ import annotations

import logging

from appliance.plan import ExecutionPlan

log = logging.getLogger("appliance")


def serve(plan: ExecutionPlan) -> None:
    import uvicorn

    from appliance.api import create_app
    from appliance.engine import build_engine

    log.info("plan %s: %s (%s, %s) on %s", plan.fingerprint, plan.model.id,
             plan.model.architecture, plan.model.dtype, plan.machine.backend)
    engine = build_engine(plan)
    try:
        app = create_app(plan, engine)
        log.info("serving on http://%s:%d/v1", plan.server.host, plan.server.port)
        uvicorn.run(app, host=plan.server.host, port=plan.server.port,
                    log_level=plan.server.log_level, workers=1, timeout_graceful_shutdown=10)
    finally:
        engine.stop()
