"""How many CPU threads torch uses, for a block of code: the course's small models train faster on one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["one_thread"]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one CPU thread inside the block, then restore the previous setting.

    This model's matrices are tiny (64 wide), so splitting each operation across threads
    costs more in synchronisation than it gains; when other programs load the CPU, a
    second thread that must wait for a busy core made training about 10× slower
    (0.76 s against 0.06 s per step, measured on a 2-core machine).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
