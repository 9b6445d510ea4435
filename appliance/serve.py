"""mode=serve: build the engine the plan describes and serve it with uvicorn (one worker)."""

from __future__ import annotations

import logging
import signal

from appliance.plan import ExecutionPlan

log = logging.getLogger("appliance")


def serve(plan: ExecutionPlan) -> None:
    import uvicorn

    from appliance.api import create_app
    from appliance.engine import build_engine

    log.info("plan %s: %s (%s, %s) on %s", plan.fingerprint, plan.model.id,
             plan.model.architecture, plan.model.dtype, plan.machine.backend)
    engine = build_engine(plan)
    # uvicorn re-raises the signal that stopped it once it has shut down; with the default
    # SIGTERM action the process would die there, before the engine stops and the SSD tier
    # finishes its pending writes. Ours only notes it: the `finally` below then runs.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: log.info("stopping (%s)", signal.Signals(signum).name))
    try:
        app = create_app(plan, engine)
        log.info("serving on http://%s:%d/v1", plan.server.host, plan.server.port)
        uvicorn.run(app, host=plan.server.host, port=plan.server.port,
                    log_level=plan.server.log_level, workers=1, timeout_graceful_shutdown=10)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second signal: stop now
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        engine.stop()
        log.info("stopped")
