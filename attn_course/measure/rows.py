"""Benchmark rows (one dataclass instance per measurement): checked, written as CSV, plotted against N."""

from __future__ import annotations

import csv
import dataclasses
import os
import pathlib
from collections.abc import Sequence

from attn_course import _validate

__all__ = ["check_rows", "pyplot_for", "save_time_and_memory", "write_csv"]


def check_rows(where: str, rows: object, kinds: tuple[type, ...] | None = None) -> list:
    """``rows`` as a list: a non-empty sequence of instances of one dataclass (one of ``kinds`` if given), or the
    error naming ``where``.

    Raises:
        TypeError: not a sequence, a row that is not an accepted dataclass instance, or rows of different types.
        ValueError: no rows.

    Example:
        >>> @dataclasses.dataclass
        ... class Row:
        ...     n: int
        >>> check_rows("example", (Row(1), Row(2)))
        [Row(n=1), Row(n=2)]
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
    """Write rows (instances of one dataclass) to the CSV file ``path`` (parent folders created), one column per
    field in declared order; return ``path`` as a :class:`pathlib.Path`.

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


def pyplot_for(where: str, path: object, title: object):
    """Check a plot's ``path`` and ``title``; return the path and ``matplotlib.pyplot`` drawing off screen (Agg,
    unless a backend was chosen). matplotlib is imported only when a figure is asked for: a bare GPU image may
    lack it, and the CSVs suffice.

    Raises:
        TypeError: ``path`` not a str or path, ``title`` not a str.
        ImportError: matplotlib is not installed.
    """
    path = _validate.path(where, "path", path)
    if not isinstance(title, str):
        raise TypeError(f"{where}: title must be a str, got {type(title).__name__}")
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return path, plt


def save_time_and_memory(where: str, series: dict[str, list[tuple[int, float, float | None]]], path: object, *,
                         title: str, panels: tuple[str, str] = ("time", "peak memory")) -> None:
    """Save a PNG of two log-log panels against N, seconds and peak MiB, a line per series: ``series`` maps a label
    to its points ``(N, seconds, peak MiB)`` (a memory of None is not drawn). ``path`` and ``title`` are checked
    as :func:`pyplot_for` does."""
    path, plt = pyplot_for(where, path, title)
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for index, (label, points) in enumerate(series.items()):
        style = dict(marker="o", label=label, color=f"C{index}")        # one colour per series in both panels
        axes[0].plot([n for n, _, _ in points], [seconds for _, seconds, _ in points], **style)
        measured = [(n, mib) for n, _, mib in points if mib]
        if measured:
            axes[1].plot([n for n, _ in measured], [mib for _, mib in measured], **style)
    lengths = sorted({n for points in series.values() for n, _, _ in points})
    for axis, ylabel, panel in zip(axes, ("seconds (best)", "peak MiB"), panels):
        axis.set_xscale("log", base=2)
        axis.set_xticks(lengths, [str(n) for n in lengths])
        axis.minorticks_off()
        axis.set(yscale="log", xlabel="N", ylabel=ylabel, title=panel)
    axes[0].legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
