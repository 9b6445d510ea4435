"""mode=serve: build the engine the plan describes and serve it with uvicorn (one worker).

Stopping (SIGTERM, Ctrl-C): the listening socket closes at once; requests in flight, queued
ones included, get `server.drain_seconds` to finish. Then the engine ends what is left with
an error saying the server is shutting down (a stream gets an error event and `[DONE]`, a
plain request a 503), and the process exits 0.

A failed engine (it cannot go on: `/health` answers 503) stops the server the same way, and
the process exits EXIT_ENGINE_FAILED for its supervisor to restart it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

from appliance.plan import ExecutionPlan

log = logging.getLogger("appliance")

EXIT_ENGINE_FAILED = 3  # 2 is a plan error
GRACE_SECONDS = 5.0  # after the drain: for the last events to reach their clients


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn, plus the drain and a watch on the engine's health."""

        def __init__(self, config, engine, drain_seconds: float):
            super().__init__(config)
            self.engine, self.drain_seconds = engine, drain_seconds
            self.engine_failed = False

        async def on_tick(self, counter: int) -> bool:
            if self.engine.failure is not None and not self.engine_failed:
                self.engine_failed = True
                log.error("the engine has failed (%s); stopping with exit code %d",
                          self.engine.failure, EXIT_ENGINE_FAILED)
                self.should_exit = True
            return await super().on_tick(counter)

        async def shutdown(self, sockets=None) -> None:
            loop = asyncio.get_running_loop()
            timer = loop.call_later(self.drain_seconds, self._end_the_rest, loop)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

        def _end_the_rest(self, loop) -> None:
            if self.server_state.connections:
                log.warning("drain time (server.drain_seconds=%g) is up: ending the "
                            "requests of %d connection(s)", self.drain_seconds,
                            len(self.server_state.connections))
            # stop() waits for the engine thread (and the SSD tier's writes): not on the loop
            from appliance.api.errors import SHUTTING_DOWN

            loop.run_in_executor(None, self.engine.stop, SHUTTING_DOWN)

    return Server


def _cannot_listen(host: str, port: int) -> str | None:
    """Why the server could not bind host:port (None: it can), as uvicorn will bind it."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(infos[0][4])
    except OSError as e:
        return e.strerror or str(e)
    return None


def serve(plan: ExecutionPlan) -> int:
    """Serve until stopped; returns the exit code (0, or EXIT_ENGINE_FAILED)."""
    import uvicorn

    from appliance.api import create_app
    from appliance.engine import build_engine

    if (why := _cannot_listen(plan.server.host, plan.server.port)) is not None:
        from appliance.plan import PlanError  # (a setting to change: exit 2, not 3's failed
        #                                       engine, and before the model loads)
        print(PlanError([f"server.port={plan.server.port}: cannot listen on "
                         f"{plan.server.host}:{plan.server.port} ({why}); choose another "
                         "port, or stop what holds it"]).render(), file=sys.stderr)
        return 2
    log.info("plan %s: %s (%s, %s) on %s", plan.fingerprint, plan.model.id,
             plan.model.architecture, plan.model.dtype, plan.machine.backend)
    engine = build_engine(plan)
    # uvicorn re-raises the signal that stopped it once it has shut down; with the default
    # SIGTERM action the process would die there, before the engine stops and the SSD tier
    # finishes its pending writes. Ours only notes it: the `finally` below then runs.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: log.info("stopping (%s)", signal.Signals(signum).name))
    server = None
    try:
        app = create_app(plan, engine)
        log.info("serving on http://%s:%d/v1", plan.server.host, plan.server.port)
        config = uvicorn.Config(app, host=plan.server.host, port=plan.server.port,
                                log_level=plan.server.log_level, workers=1,
                                http="httptools", loop="uvloop",  # (pyproject.toml: why)
                                timeout_graceful_shutdown=plan.server.drain_seconds
                                + GRACE_SECONDS)
        server = _server_class()(config, engine, plan.server.drain_seconds)
        # what startup built (model, tokenizer, app: ~140k objects) lives as long as the
        # process: out of the collector's sight, a full collection no longer stops the event
        # loop (and /health) for ~70 ms scanning it
        gc.freeze()
        server.run()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second signal: stop now
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        engine.stop()
        log.info("stopped")
    return EXIT_ENGINE_FAILED if server.engine_failed else 0
