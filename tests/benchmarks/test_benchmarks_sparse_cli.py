"""python -m benchmarks sparse: its CSVs, the crossovers and the options it takes."""

from __future__ import annotations

import pytest
from made_up_rows import read_csv

from attn_course.measure import sparse_timing
from benchmarks.__main__ import main


def test_main_sparse_writes_counts_accuracy_times_and_crossovers(tmp_path, capsys):
    assert main(["sparse", "--quick", "--lengths", "32", "64", "--out", str(tmp_path)]) == 0
    columns, rows = read_csv(tmp_path / "sparse.csv")
    assert columns == ["variant", "n", "keys_per_query", "seconds", "max_difference"]
    assert [(row["variant"], row["n"]) for row in rows] == [
        (name, n) for n in ("32", "64") for name in sparse_timing.SPARSE_VARIANTS]
    columns, crossovers = read_csv(tmp_path / "sparse-crossover.csv")
    assert [row["sparse"] for row in crossovers] == list(sparse_timing.SPARSE_VARIANTS[1:])
    columns, counts = read_csv(tmp_path / "sparse-score-counts.csv")
    assert [(row["scheme"], row["n"]) for row in counts][:3] == [("dense", "1024"), ("top-k", "1024"),
                                                                 ("MoBA blocks", "1024")]
    columns, accuracy = read_csv(tmp_path / "sparse-retrieval.csv")
    assert columns == ["selection", "budget", "keys_read", "needle_kept", "accuracy"] and accuracy
    assert (tmp_path / "sparse.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert out.startswith("# ") and "dense sdpa" in out and f"wrote {tmp_path / 'sparse.csv'}" in out


@pytest.mark.parametrize("argv, message", [
    (["sparse", "--threads", "0"], "must be >= 1, got 0"),
    (["sparse", "--dry-run"], "--dry-run, --max-minutes and --profile are options of flash"),
    (["kv-cache", "--threads", "1"], "--quick and --threads are options of variants, sparse and serving"),
])
def test_main_sparse_refuses_what_is_not_its_option(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
