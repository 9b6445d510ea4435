"""Driving a scheduler directly, step by step, on the test thread (deterministic schedules)."""

from __future__ import annotations

import itertools

from appliance.engine import Finished, GenerationRequest

_ids = itertools.count(1)


class Collector:
    """A submitter that records what the scheduler delivers (what RequestHandle does,
    minus the asyncio hop)."""

    def __init__(self, request: GenerationRequest):
        self.request, self.id = request, next(_ids)
        self.tokens: list[int] = []
        self.events: list = []
        self.finished: Finished | None = None
        self.cancelled = False
        self.fail_delivery = False

    def cancel(self) -> None:
        self.cancelled = True

    def deliver(self, event) -> None:
        if self.fail_delivery:
            raise RuntimeError("consumer is gone")
        self.events.append(event)
        if isinstance(event, Finished):
            self.finished = event
        else:
            self.tokens.append(event.id)


def drive(scheduler, events: list[tuple[int, str, str]], rows: dict[str, Collector],
          max_ticks: int = 10_000) -> None:
    """Apply (tick, insert|remove, row) events before each tick's step, as the oracle does."""
    events = sorted(events, key=lambda e: (e[0], e[1] != "remove"))
    for tick in range(max_ticks):
        while events and events[0][0] == tick:
            _, what, r = events.pop(0)
            if what == "remove":
                rows[r].cancel()
            else:
                scheduler.add(rows[r])
        if not events and not scheduler.has_work():
            return
        scheduler.step()
        scheduler.check_integrity()
    raise AssertionError("schedule did not finish")


def cuda_shape_policy(monkeypatch) -> None:
    """Run CUDA's shape policy here (`speculate.shapes.WHOLE_BUFFER`): every engine module
    that reads the flag when it runs, by its own name."""
    from appliance.engine import prefill, rows, step, verify
    from appliance.engine.speculate import drafters, mtp_drafter

    for mod in (prefill, rows, step, verify, drafters, mtp_drafter):
        monkeypatch.setattr(mod, "WHOLE_BUFFER", True)
