"""attn_course.measure.rows: the row checks every printer uses, and the CSV writer."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from attn_course.measure import flash, kv_cache
from attn_course.measure.rows import check_rows, write_csv
from attn_course.measure.variants import VariantRow

VARIANT_COLUMNS = ["variant", "mode", "n", "seconds", "peak_bytes", "state_bytes", "max_difference"]


def test_write_csv_has_one_column_per_field_and_none_as_an_empty_cell(tmp_path):
    rows = [VariantRow("flex eager", "prefill", 64, 0.5, None, 1024, 1e-7),
            VariantRow("softmax sdpa", "prefill", 64, 0.25, 2048, 1024, 0.0)]
    path = write_csv(rows, tmp_path / "deeper" / "rows.csv")
    assert path == tmp_path / "deeper" / "rows.csv"
    with open(path) as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == VARIANT_COLUMNS
        assert [(row["variant"], row["peak_bytes"], row["seconds"]) for row in reader] == [
            ("flex eager", "", "0.5"), ("softmax sdpa", "2048", "0.25")]


def test_write_csv_rejects_mixed_empty_or_plain_rows(tmp_path):
    cpu = flash.CpuRow(method="naive", n=64, seconds=1.0, peak_mib=1.0, max_difference=0.0)
    kv = kv_cache.KvCacheRow(new_tokens=2, positions_without=7, positions_with=4, seconds_without=1.0,
                             seconds_with=0.5, speedup=2.0)
    with pytest.raises(TypeError, match=r"^write_csv: rows\[1\] must be a KvCacheRow like rows\[0\], got CpuRow"):
        write_csv([kv, cpu], tmp_path / "x.csv")
    with pytest.raises(TypeError, match=r"^write_csv: rows\[0\] must be a dataclass instance, got dict"):
        write_csv([{"n": 1}], tmp_path / "x.csv")
    with pytest.raises(ValueError, match=r"^write_csv: rows must not be empty"):
        write_csv([], tmp_path / "x.csv")
    with pytest.raises(TypeError, match=r"^write_csv: path must be a str or path, got int"):
        write_csv([cpu], 3)


def test_check_rows_names_its_caller_and_the_kinds_it_accepts():
    cpu = flash.CpuRow(method="naive", n=64, seconds=1.0, peak_mib=1.0, max_difference=0.0)
    assert check_rows("here", (cpu,)) == [cpu]
    with pytest.raises(TypeError, match=r"^here: rows\[0\] must be TrainingRow or KvCacheRow, got CpuRow"):
        check_rows("here", [cpu], (flash.TrainingRow, kv_cache.KvCacheRow))
    with pytest.raises(TypeError, match=r"^here: rows must be a sequence of benchmark rows, got str"):
        check_rows("here", "rows")
    with pytest.raises(TypeError, match=r"^here: rows\[0\] must be a dataclass instance, got type"):
        check_rows("here", [dataclasses.make_dataclass("Row", ["n"])])


def test_a_plot_names_a_bad_path_or_title_before_importing_matplotlib(tmp_path):
    from attn_course.measure.rows import pyplot_for

    with pytest.raises(TypeError, match=r"^plot_x: path must be a str or pathlib.Path, got int"):
        pyplot_for("plot_x", 3, title="t")
    with pytest.raises(TypeError, match=r"^plot_x: title must be a str, got NoneType"):
        pyplot_for("plot_x", tmp_path / "x.png", title=None)
    path, plt = pyplot_for("plot_x", str(tmp_path / "x.png"), title="t")
    assert path == tmp_path / "x.png" and callable(plt.subplots)
