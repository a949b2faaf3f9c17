import dataclasses

import pandas as pd
import pytest
import torch

from attn_course.teaching.tables import table


@dataclasses.dataclass
class Row:
    method: str
    n: int
    seconds: float


ROWS = [Row("naive", 256, 0.123456), Row("tiled", 256, 1.5)]


def test_dataclass_rows_become_columns_with_the_first_naming_the_rows():
    frame = table(ROWS)
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.index) == ["naive", "tiled"]
    assert frame.columns.name == "method" and list(frame.columns) == ["n", "seconds"]
    assert frame.loc["naive", "seconds"] == 0.123


def test_columns_choose_order_and_headings_and_digits_apply_per_heading():
    frame = table(ROWS, columns={"n": "N", "method": "method", "seconds": "time (s)"}, digits={"time (s)": 1})
    assert frame.columns.name == "N" and list(frame.columns) == ["method", "time (s)"]
    assert list(frame["time (s)"]) == [0.1, 1.5]


def test_mappings_are_rows_too_and_ints_are_not_rounded_into_floats():
    frame = table([{"N": 1024, "ratio": 2.0 / 3}], digits=2)
    assert frame.loc[1024, "ratio"] == 0.67


@pytest.mark.parametrize(("rows", "error", "words"), [
    ([], ValueError, "must not be empty"),
    ("abc", TypeError, "rows must be a sequence"),
    ([Row("a", 1, 1.0), 3], TypeError, r"rows\[1\] must be a dataclass instance or a mapping, got int"),
])
def test_bad_rows_are_named(rows, error, words):
    with pytest.raises(error, match=words):
        table(rows)


def test_a_column_the_rows_lack_and_negative_digits_are_named():
    with pytest.raises(ValueError, match=r"columns names \['speed'\]"):
        table(ROWS, columns={"speed": "x"})
    with pytest.raises(ValueError, match="digits must be >= 0, got -1"):
        table(ROWS, digits=-1)


def test_a_matrix_gets_its_labels_and_a_heading_in_the_corner():
    frame = table(torch.tensor([[1.0, 0.25], [0.0, 2.0]]), index=["bank", "river"], columns=["thing", "nature"],
                  corner="token", digits=1)
    assert list(frame.index) == ["bank", "river"] and list(frame.columns) == ["thing", "nature"]
    assert frame.columns.name == "token" and frame.loc["bank", "nature"] == 0.2


def test_a_matrix_that_is_not_2d_or_labels_that_do_not_fit_are_named():
    with pytest.raises(ValueError, match=r"a matrix must be 2-D, got shape \[3\]"):
        table(torch.zeros(3))
    with pytest.raises(ValueError, match=r"index must hold 2 labels for a matrix of shape \[2, 3\], got 1"):
        table(torch.zeros(2, 3), index=["a"])


def test_a_format_specification_writes_floats_and_leaves_missing_ones_blank():
    frame = table([{"d_k": 16, "gradient": 0.199, "growth": None}, {"d_k": 1024, "gradient": 2.18e-05, "growth": 4.0}],
                  digits={"gradient": ".3g", "growth": ".2f"})
    assert list(frame["gradient"]) == ["0.199", "2.18e-05"] and list(frame["growth"]) == ["", "4.00"]
    with pytest.raises(ValueError, match=r"digits\['gradient'\] must be decimals or a format specification"):
        table([{"d_k": 16, "gradient": 0.2}], digits={"gradient": "%x"})
    with pytest.raises(ValueError, match=r"digits names the column 'speed', which the table lacks"):
        table([{"d_k": 16, "gradient": 0.2}], digits={"speed": 1})


def test_a_matrix_without_column_headings_numbers_its_columns():
    frame = table(torch.tensor([[4, 7], [-100, 4]]), index=["tokens", "previous token"], corner="position")
    assert list(frame.columns) == [0, 1] and frame.loc["previous token", 0] == -100
