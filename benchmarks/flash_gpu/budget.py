"""Running under a time budget: a deadline no new measurement starts after, and SIGTERM as a clean stop."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

__all__ = ["TIME_BUDGET_SPENT", "Terminated", "past", "sigterm_stops"]

TIME_BUDGET_SPENT = "time budget spent (max_minutes): not measured"


def past(deadline: float | None) -> bool:
    """Whether ``deadline`` (a ``time.monotonic()`` value, or None for no limit) has passed."""
    return deadline is not None and time.monotonic() > deadline


class Terminated(BaseException):
    """SIGTERM (``timeout``) during the run: stop measuring, write what there is."""


@contextlib.contextmanager
def sigterm_stops() -> Iterator[None]:
    """Inside the block, SIGTERM raises :class:`Terminated` instead of killing the process; the
    previous handler comes back after it. Only the main thread can set a handler: elsewhere
    (a test runner's thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
