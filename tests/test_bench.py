"""attn_course.bench: the benchmarks run and report sane rows (no timing assertions)."""

from __future__ import annotations

import csv

import pytest

from attn_course import bench


def test_kv_cache_benchmark_reports_one_row_per_length():
    rows = bench.kv_cache_speedup(new_tokens=(2, 4), prompt_length=3, embed_dim=16, num_layers=1)
    assert [row["new_tokens"] for row in rows] == [2, 4]
    for row in rows:
        assert row["seconds_without"] > 0 and row["seconds_with"] > 0
        assert row["speedup"] == pytest.approx(row["seconds_without"] / row["seconds_with"])


def test_kv_cache_benchmark_rejects_bad_sizes():
    with pytest.raises(ValueError, match="prompt_length"):
        bench.kv_cache_speedup(prompt_length=0)


def test_command_line_writes_a_csv(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        bench, "kv_cache_speedup",
        lambda repeats: [{"new_tokens": 1, "seconds_without": 2.0, "seconds_with": 1.0, "speedup": 2.0}],
    )
    assert bench.main(["kv-cache", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "kv-cache.csv") as handle:
        assert list(csv.DictReader(handle))[0]["speedup"] == "2.0"
    assert "2.0x" in capsys.readouterr().out
