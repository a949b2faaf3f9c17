"""A table in a chapter is a pandas ``DataFrame`` (Jupyter renders it), made here, one way for every chapter."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from attn_course import _validate

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["table"]


def table(rows: Sequence[object] | torch.Tensor, *, columns: Mapping[str, str] | Sequence[str] | None = None,
          index: Sequence[object] | None = None, corner: str | None = None,
          digits: int | str | Mapping[object, int | str] = 3) -> pd.DataFrame:
    """Records or a matrix as a ``DataFrame``, the rows named in the first column, floats rounded.

    Args:
        rows: records, a row each: dataclass instances (a measurement's rows) or mappings from
            column to value, all with the same fields, the first naming the row; or a matrix, a
            2-D tensor, a row for each label in ``index``.
        columns: for records, the fields to show, in order, each with its heading:
            ``{field: heading}`` (default: every field, headed by its name); for a matrix, the
            columns' headings (default ``0, 1, ...``).
        index: for a matrix, the rows' labels (default ``0, 1, ...``).
        corner: the heading above the row labels (for records, default the first field's heading).
        digits: how floats are shown: an int rounds them to that many decimals, a format
            specification writes them so (``".3g"``: three significant figures, ``".1e"``; a
            missing value is left blank); one for every column, or ``{heading: digits}`` for some
            (the others are left as they are).

    Returns:
        The ``DataFrame``.

    Raises:
        TypeError: ``rows`` neither records nor a 2-D tensor, ``columns`` of the wrong kind,
            ``digits`` not an int or mapping.
        ValueError: no rows, a field in ``columns`` that the records lack, labels that do not
            fit the matrix, negative ``digits``.

    Example:
        >>> table([{"N": 256, "ms": 0.1234}, {"N": 512, "ms": 0.5}], digits=2)
        N      ms
        256  0.12
        512  0.50
        >>> table(torch.eye(2), index=["bank", "river"], columns=["thing", "nature"], corner="token", digits=1)
        token  thing  nature
        bank     1.0     0.0
        river    0.0     1.0
    """
    where = "table"
    if isinstance(rows, torch.Tensor):
        records, corner = _matrix(where, rows, columns, index), "" if corner is None else corner
    else:
        records = _records(where, rows, columns)
    headings = list(records[0])
    if isinstance(digits, Mapping):
        chosen = {heading: _digits(where, f"digits[{heading!r}]", shown) for heading, shown in digits.items()}
    else:
        chosen = dict.fromkeys(headings, _digits(where, "digits", digits))
    for heading, shown in chosen.items():
        if heading not in headings:
            raise ValueError(f"{where}: digits names the column {heading!r}, which the table lacks")
        for record in records:
            record[heading] = _shown(record[heading], shown)
    # Imported here, not at the top: a process that imports the course but shows no table (a notebook graded
    # in the sandbox, a tool) does not pay for pandas, 0.4 s of import.
    import pandas as pd

    frame = pd.DataFrame(records).set_index(headings[0])
    frame.index.name, frame.columns.name = None, headings[0] if corner is None else corner   # heading in the corner
    return frame


def _digits(where: str, name: str, digits: object) -> int | str:
    """``digits`` checked: decimals (an int >= 0) or a format specification for floats."""
    if isinstance(digits, str):
        try:
            format(1.0, digits)
        except ValueError:
            raise ValueError(f"{where}: {name} must be decimals or a format specification such as '.3g', "
                             f"got {digits!r}") from None
        return digits
    return _validate.integer(where, name, digits, minimum=0)


def _shown(value: object, digits: int | str) -> object:
    """A float rounded to ``digits`` decimals, or written by the format specification ``digits``; else ``value``."""
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        value = value.item()
    if isinstance(digits, str):
        return "" if value is None else format(value, digits) if isinstance(value, float) else value
    return round(value, digits) if isinstance(value, float) else value


def _records(where: str, rows: object, columns: object) -> list[dict]:
    records = _validate.sequence(where, "rows", rows, of="dataclass instances or mappings, or a 2-D tensor")
    if not records:
        raise ValueError(f"{where}: rows must not be empty")
    for position, row in enumerate(records):
        if dataclasses.is_dataclass(row) and not isinstance(row, type):
            records[position] = {field.name: getattr(row, field.name) for field in dataclasses.fields(row)}
        elif isinstance(row, Mapping):
            records[position] = dict(row)
        else:
            raise TypeError(f"{where}: rows[{position}] must be a dataclass instance or a mapping, "
                            f"got {type(row).__name__}")
    if columns is None:
        return records
    if not isinstance(columns, Mapping):
        raise TypeError(f"{where}: columns must be a mapping {{field: heading}} for records, "
                        f"got {type(columns).__name__}")
    missing = [name for name in columns if name not in records[0]]
    if missing:
        raise ValueError(f"{where}: columns names {missing}, which the rows lack; they have {list(records[0])}")
    return [{heading: record[field] for field, heading in columns.items()} for record in records]


def _matrix(where: str, values: torch.Tensor, columns: object, index: object) -> list[dict]:
    if values.dim() != 2:
        raise ValueError(f"{where}: a matrix must be 2-D, got shape {_validate.shape_str(values)}")
    for name, labels, size in (("index", index, values.shape[0]), ("columns", columns, values.shape[1])):
        if labels is not None and len(_validate.sequence(where, name, labels, of="labels")) != size:
            raise ValueError(f"{where}: {name} must hold {size} labels for a matrix of shape "
                             f"{_validate.shape_str(values)}, got {len(labels)}")
    index = range(values.shape[0]) if index is None else index
    columns = range(values.shape[1]) if columns is None else columns
    return [{"": label, **dict(zip(columns, row))} for label, row in zip(index, values.detach().cpu().tolist())]
