"""Progress for long benches: rich bars on stderr, only when stderr is a terminal.

Off in pipes, CI logs and tests (nothing to redraw there), and with bench.progress=false.
stdout stays the table and the BENCH line, whatever happens here.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator


def _on(enabled: bool) -> bool:
    return enabled and sys.stderr.isatty()


@contextlib.contextmanager
def bar(description: str, total: int, enabled: bool = True) -> Iterator[Callable[[], None]]:
    """Yields `advance()`: one call per finished unit of `total` (a request)."""
    if not _on(enabled):
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as p:
        task = p.add_task(description, total=total)
        yield lambda: p.advance(task)


@contextlib.contextmanager
def status(text: str, enabled: bool = True) -> Iterator[None]:
    """A spinner while something without a count runs (a server loading its model)."""
    if not _on(enabled):
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(text):
        yield
