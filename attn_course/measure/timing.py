"""What every benchmark shares: the timer, the machine it ran on, and the CSV of its rows.

A leaf module: it imports nothing else of the course but the input checks, so each
benchmark (and anything else) can import it without an import cycle.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import pathlib
import platform
import time
from collections.abc import Callable, Sequence

import torch

from attn_course import _validate
from attn_course._threads import one_thread

__all__ = ["best_time", "check_rows", "machine_description", "one_thread", "write_csv"]


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """The shortest of ``repeats`` wall-clock timings of ``fn()``, in seconds.

    The minimum, not the mean: noise from other processes only ever adds time.

    Args:
        fn: called with no arguments, ``repeats`` times.
        repeats: how many timings to take, at least 1.

    Returns:
        The best time in seconds.

    Raises:
        TypeError: ``fn`` not callable, or ``repeats`` not an int.
        ValueError: ``repeats`` below 1.

    Example:
        >>> best_time(lambda: sum(range(1000)), repeats=3) > 0
        True
    """
    where = "best_time"
    if not callable(fn):
        raise TypeError(f"{where}: fn must be callable, got {type(fn).__name__}")
    repeats = _validate.integer(where, "repeats", repeats, minimum=1)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def machine_description() -> str:
    """The processor or GPU, torch and Triton versions, for benchmark headers and plots.

    Returns:
        e.g. ``"x86_64 CPU, 2 threads; torch 2.13.0; Triton 3.5.0"``.
    """
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:   # pragma: no cover - Triton is a Linux-only dependency
        triton_version = "not installed"
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        device = f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"
    return f"{device}; torch {torch.__version__}; Triton {triton_version}"


def check_rows(where: str, rows: object, kinds: tuple[type, ...] | None = None) -> list:
    """Require a non-empty sequence of rows, all instances of one dataclass (one of ``kinds`` if given).

    Printers, plots and the CSV writer call this so that their errors name themselves.

    Args:
        where: the calling function's name, for the message.
        rows: what the caller was given.
        kinds: the row dataclasses accepted; None accepts any one dataclass.

    Returns:
        ``rows`` as a list.

    Raises:
        TypeError: not a sequence, a row that is not an accepted dataclass instance, or
            rows of different types.
        ValueError: no rows.
    """
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise TypeError(f"{where}: rows must be a sequence of benchmark rows, got {type(rows).__name__}")
    if not rows:
        raise ValueError(f"{where}: rows must not be empty")
    accepted = " or ".join(kind.__name__ for kind in kinds) if kinds else "a dataclass instance"
    for index, row in enumerate(rows):
        is_row = isinstance(row, kinds) if kinds else dataclasses.is_dataclass(row) and not isinstance(row, type)
        if not is_row:
            raise TypeError(f"{where}: rows[{index}] must be {accepted}, got {type(row).__name__}")
        if type(row) is not type(rows[0]):
            raise TypeError(
                f"{where}: rows[{index}] must be a {type(rows[0]).__name__} like rows[0], got {type(row).__name__}"
            )
    return list(rows)


def write_csv(rows: Sequence[object], path: str | os.PathLike) -> pathlib.Path:
    """Write benchmark rows (instances of one dataclass) to a CSV file, one column per field.

    The header is the dataclass's field names, in their declared order.

    Args:
        rows: a non-empty sequence of instances of one dataclass.
        path: the file to write; missing parent folders are created.

    Returns:
        ``path`` as a :class:`pathlib.Path`.

    Raises:
        TypeError: ``rows`` not a sequence of one dataclass's instances, or ``path`` not a path.
        ValueError: ``rows`` empty.
    """
    where = "write_csv"
    rows = check_rows(where, rows)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{where}: path must be a str or path, got {type(path).__name__}")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[field.name for field in dataclasses.fields(rows[0])])
        writer.writeheader()
        writer.writerows(dataclasses.asdict(row) for row in rows)
    return path
