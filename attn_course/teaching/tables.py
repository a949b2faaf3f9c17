"""A table in a chapter is a pandas ``DataFrame`` (Jupyter renders it), made here, one way for every chapter."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pandas as pd
import torch

from attn_course import _validate

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
    frame = _matrix(where, rows, columns, index) if isinstance(rows, torch.Tensor) else _records(where, rows, columns)
    chosen = digits.items() if isinstance(digits, Mapping) else [(column, digits) for column in frame.columns]
    for column, shown in chosen:
        if column not in frame.columns:
            raise ValueError(f"{where}: digits names the column {column!r}, which the table lacks")
        if frame[column].dtype.kind == "f" or frame[column].map(lambda v: isinstance(v, float)).any():
            frame[column] = _shown(where, frame[column], shown, column)
    if not isinstance(rows, torch.Tensor):
        corner = frame.columns[0] if corner is None else corner
        frame = frame.set_index(frame.columns[0])
    frame.index.name, frame.columns.name = None, corner    # the corner heading sits above the row labels
    return frame


def _shown(where: str, values: pd.Series, digits: object, column: object) -> pd.Series:
    """A column of floats rounded to ``digits`` decimals, or written by the format specification ``digits``."""
    if isinstance(digits, str):
        try:
            format(1.0, digits)
        except ValueError:
            raise ValueError(f"{where}: digits for {column!r} must be decimals or a format specification "
                             f"such as '.3g', got {digits!r}") from None
        return values.map(lambda v: "" if v is None or v != v else format(v, digits))
    return values.round(_validate.integer(where, f"digits for {column!r}", digits, minimum=0))


def _records(where: str, rows: object, columns: object) -> pd.DataFrame:
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
    frame = pd.DataFrame(records)
    if columns is None:
        return frame
    if not isinstance(columns, Mapping):
        raise TypeError(f"{where}: columns must be a mapping {{field: heading}} for records, "
                        f"got {type(columns).__name__}")
    missing = [name for name in columns if name not in frame.columns]
    if missing:
        raise ValueError(f"{where}: columns names {missing}, which the rows lack; they have {list(frame.columns)}")
    return frame[list(columns)].rename(columns=dict(columns))


def _matrix(where: str, values: torch.Tensor, columns: object, index: object) -> pd.DataFrame:
    if values.dim() != 2:
        raise ValueError(f"{where}: a matrix must be 2-D, got shape {_validate.shape_str(values)}")
    for name, labels, size in (("index", index, values.shape[0]), ("columns", columns, values.shape[1])):
        if labels is not None and len(_validate.sequence(where, name, labels, of="labels")) != size:
            raise ValueError(f"{where}: {name} must hold {size} labels for a matrix of shape "
                             f"{_validate.shape_str(values)}, got {len(labels)}")
    return pd.DataFrame(values.detach().cpu().tolist(), index=index, columns=columns)
