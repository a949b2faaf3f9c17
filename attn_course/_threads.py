"""How many CPU threads torch uses, for a block of code: the course's small models run faster on one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["one_thread", "threads"]


@contextlib.contextmanager
def threads(count: int | None) -> Iterator[None]:
    """Run torch on ``count`` CPU threads inside the block, then restore the previous setting.

    Also a decorator (``@threads(2)``), as every ``contextlib.contextmanager``.

    Args:
        count: threads for torch's intra-op pool, at least 1; None leaves the setting as it is.

    Raises:
        TypeError: ``count`` not an int or None.
        ValueError: ``count`` below 1.

    Example:
        >>> before = torch.get_num_threads()
        >>> with threads(1):
        ...     torch.get_num_threads()
        1
        >>> torch.get_num_threads() == before
        True
    """
    if count is not None:
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"threads: count must be an int or None, got {type(count).__name__}")
        if count < 1:
            raise ValueError(f"threads: count must be >= 1, got {count}")
    previous = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def one_thread() -> contextlib.AbstractContextManager[None]:
    """Run torch on one CPU thread inside the block (``with one_thread():`` or ``@one_thread()``).

    The course's models are tiny (64 wide), so splitting each operation across threads
    costs more in synchronisation than it gains; when other programs load the CPU, a
    second thread that must wait for a busy core made training about 10× slower
    (0.76 s against 0.06 s per step, measured on a 2-core machine).

    Example:
        >>> with one_thread():
        ...     torch.get_num_threads()
        1
    """
    return threads(1)
