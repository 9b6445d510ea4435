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
