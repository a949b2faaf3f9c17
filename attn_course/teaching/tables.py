"""A table in a chapter is a pandas ``DataFrame`` (Jupyter renders it), made here, one way for every chapter."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pandas as pd

from attn_course import _validate

__all__ = ["table"]


def table(rows: Sequence[object], *, columns: Mapping[str, str] | None = None,
          digits: int | Mapping[str, int] = 3) -> pd.DataFrame:
    """Rows as a ``DataFrame``: a row each, a column per field, the first column naming the rows.

    Args:
        rows: a non-empty sequence of dataclass instances (a measurement's rows) or of mappings
            from column to value, all with the same fields.
        columns: the fields to show, in order, each with its heading: ``{field: heading}``;
            by default every field, headed by its name.
        digits: the decimals floats are rounded to: one number for every column, or
            ``{heading: decimals}`` for some (the others are left as they are).

    Returns:
        The ``DataFrame``; its first column is the index, headed in the corner, so no row numbers show.

    Raises:
        TypeError: ``rows`` not a sequence of dataclass instances or mappings, ``columns`` not a
            mapping, ``digits`` not an int or mapping.
        ValueError: no rows, a field in ``columns`` that the rows lack, negative ``digits``.

    Example:
        >>> table([{"N": 256, "ms": 0.1234}, {"N": 512, "ms": 0.5}], digits=2)
        N      ms
        256  0.12
        512  0.50
    """
    where = "table"
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise TypeError(f"{where}: rows must be a sequence of dataclass instances or mappings, "
                        f"got {type(rows).__name__}")
    if not rows:
        raise ValueError(f"{where}: rows must not be empty")
    records = []
    for index, row in enumerate(rows):
        if dataclasses.is_dataclass(row) and not isinstance(row, type):
            records.append({field.name: getattr(row, field.name) for field in dataclasses.fields(row)})
        elif isinstance(row, Mapping):
            records.append(dict(row))
        else:
            raise TypeError(f"{where}: rows[{index}] must be a dataclass instance or a mapping, "
                            f"got {type(row).__name__}")
    frame = pd.DataFrame(records)
    if columns is not None:
        if not isinstance(columns, Mapping):
            raise TypeError(f"{where}: columns must be a mapping {{field: heading}}, got {type(columns).__name__}")
        missing = [name for name in columns if name not in frame.columns]
        if missing:
            raise ValueError(f"{where}: columns names {missing}, which the rows lack; they have {list(frame.columns)}")
        frame = frame[list(columns)].rename(columns=dict(columns))
    if isinstance(digits, Mapping):
        digits = {heading: _validate.integer(where, f"digits[{heading!r}]", value, minimum=0)
                  for heading, value in digits.items()}
    else:
        digits = _validate.integer(where, "digits", digits, minimum=0)
    frame = frame.round(digits)
    first = frame.columns[0]
    frame = frame.set_index(first)
    frame.index.name, frame.columns.name = None, first   # the first column's heading sits in the corner
    return frame
