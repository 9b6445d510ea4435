"""Threads that run MLX work never end: once their work is done they park until exit.

MLX's Python binding keeps thread-local state whose destructor takes the GIL when the OS
thread exits. `Thread.join()` returns before that (it waits for the Python side only), so a
thread that finished just before interpreter shutdown could run those destructors while the
interpreter finalizes; CPython then ends the thread inside a noexcept destructor and the
process aborts ("terminate called without an active exception", SIGABRT after a clean stop).
A parked daemon thread never exits: the process ends around it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


def start(name: str, work: Callable[[], object]) -> threading.Event:
    """Run `work` on a daemon thread; the returned event is set once it has returned."""
    done = threading.Event()
    # `work` travels in a list the thread empties, so the parked thread holds no reference
    # to it (nor to the engine or tier it is bound to).
    threading.Thread(target=_run_then_park, args=([work], done), name=name, daemon=True).start()
    return done


def _run_then_park(box: list, done: threading.Event) -> None:
    work = box.pop()
    try:
        work()
    except Exception:
        log.exception("thread %s failed", threading.current_thread().name)
    finally:
        del work
        done.set()
    threading.Event().wait()
