"""MLX threads park instead of exiting, and the parked thread keeps nothing alive."""

import gc
import threading
import weakref

from appliance.engine import threads


class Work:
    def __init__(self):
        self.ran = False

    def __call__(self):
        self.ran = True


def test_a_finished_thread_parks_and_releases_its_work():
    work = Work()
    done = threads.start("t-park", work)
    assert done.wait(10) and work.ran
    ref = weakref.ref(work)
    del work
    gc.collect()
    assert ref() is None  # the parked thread holds no reference (e.g. to an engine and its model)
    assert any(t.name == "t-park" and t.is_alive() for t in threading.enumerate())


def test_a_failing_work_is_logged_and_still_signals_done(caplog):
    def boom():
        raise RuntimeError("boom")

    done = threads.start("t-boom", boom)
    assert done.wait(10)
    assert "thread t-boom failed" in caplog.text and "boom" in caplog.text


def test_a_steps_events_reach_the_loop_in_one_call_in_order():
    """Inside `outbox` (the engine thread's step), deliveries are held and handed to the
    event loop in one call, in order; a closed loop cancels its requests instead."""
    import asyncio

    from appliance.engine import GenerationRequest
    from appliance.engine.engine import RequestHandle, outbox

    class Loop:  # counts the calls; runs them as a loop would
        def __init__(self, closed=False):
            self.calls, self.closed = 0, closed

        def call_soon_threadsafe(self, f, *args):
            if self.closed:
                raise RuntimeError("Event loop is closed")
            self.calls += 1
            f(*args)

    loop, gone = Loop(), Loop(closed=True)
    req = GenerationRequest([1, 2], 4)
    a, b, c = RequestHandle(req, loop, 0), RequestHandle(req, loop, 1), RequestHandle(req, gone, 2)
    for h in (a, b, c):
        h._events = asyncio.Queue()  # (no running loop needed for put_nowait / get_nowait)
    with outbox():
        for i in range(3):
            a.deliver(f"a{i}")
            b.deliver(f"b{i}")
        c.deliver("c0")
        assert loop.calls == 0 and a._events.empty()  # held until the step ends
    assert loop.calls == 1
    assert [a._events.get_nowait() for _ in range(3)] == ["a0", "a1", "a2"]
    assert [b._events.get_nowait() for _ in range(3)] == ["b0", "b1", "b2"]
    assert c.cancelled and not a.cancelled
    a.deliver("a3")  # outside a step: at once
    assert loop.calls == 2 and a._events.get_nowait() == "a3"
