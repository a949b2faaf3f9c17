"""CSV files written as the rows come, so that a run killed midway leaves its data."""

from __future__ import annotations

import csv
import dataclasses
import pathlib
from collections.abc import Sequence

__all__ = ["CsvStream", "write_table"]


class CsvStream:
    """A CSV with one dataclass's columns, each row flushed as it comes: a killed run leaves its data."""

    def __init__(self, path: pathlib.Path, kind: type):
        self.path = path
        self._handle = open(path, "w", newline="")
        self._writer = csv.DictWriter(self._handle, fieldnames=[f.name for f in dataclasses.fields(kind)])
        self._writer.writeheader()
        self._handle.flush()

    def write(self, row: object) -> None:
        self._writer.writerow(dataclasses.asdict(row))
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def write_table(path: pathlib.Path, kind: type, rows: Sequence[object]) -> None:
    """Write ``rows`` (instances of the dataclass ``kind``) to ``path``: the header even when there are none."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[f.name for f in dataclasses.fields(kind)])
        writer.writeheader()
        writer.writerows(dataclasses.asdict(row) for row in rows)
