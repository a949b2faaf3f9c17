"""python -m benchmarks NAME: each command writes its CSV with its columns and refuses bad options."""

from __future__ import annotations

import os

import pytest
import torch
from made_up_rows import GPU_COLUMNS, read_csv

from attn_course.measure import variants
from benchmarks.__main__ import main

CPU_COLUMNS = ["method", "n", "seconds", "peak_mib", "max_difference"]
KV_CACHE_COLUMNS = ["new_tokens", "positions_without", "positions_with", "seconds_without", "seconds_with", "speedup"]


def test_main_kv_cache_writes_its_csv(tmp_path, capsys):
    assert main(["kv-cache", "--lengths", "2", "3", "--out", str(tmp_path)]) == 0
    columns, rows = read_csv(tmp_path / "kv-cache.csv")
    assert columns == KV_CACHE_COLUMNS and [row["new_tokens"] for row in rows] == ["2", "3"]
    out = capsys.readouterr().out
    assert out.startswith("# ") and "speed-up" in out and f"wrote {tmp_path / 'kv-cache.csv'}" in out


def test_main_flash_writes_csv_and_plot(tmp_path, capsys):
    assert main(["flash", "--lengths", "64", "128", "--out", str(tmp_path)]) == 0
    name, expected = ("flash-gpu", GPU_COLUMNS) if torch.cuda.is_available() else ("flash-cpu", CPU_COLUMNS)
    columns, rows = read_csv(tmp_path / f"{name}.csv")
    assert columns == expected and {row["n"] for row in rows} == {"64", "128"}
    assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert f"torch {torch.__version__}" in capsys.readouterr().out


def test_main_rejects_a_length_below_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["flash", "--lengths", "64", "0"])
    assert exit_info.value.code == 2 and "must be >= 1, got 0" in capsys.readouterr().err


VARIANT_COLUMNS = ["variant", "mode", "n", "seconds", "peak_bytes", "state_bytes", "max_difference"]


CROSSOVER_COLUMNS = ["softmax", "linear", "lengths", "time_n", "time_n_interpolated", "memory_n",
                     "memory_n_interpolated", "seconds_ratio", "memory_ratio"]


CACHE_BYTES_COLUMNS = ["variant", "elements_per_token", "bytes_per_token", "n", "bytes_at_n", "fixed", "formula"]


def test_main_variants_writes_one_row_per_variant_and_n_and_the_crossovers(tmp_path, capsys):
    assert main(["variants", "--quick", "--lengths", "16", "48", "--out", str(tmp_path)]) == 0
    columns, rows = read_csv(tmp_path / "variants.csv")
    assert columns == VARIANT_COLUMNS
    expected = [(name, n) for n in ("16", "48") for name in variants.PREFILL_VARIANTS + variants.DECODE_VARIANTS]
    assert [(row["variant"], row["n"]) for row in rows] == expected
    assert {row["mode"] for row in rows if row["variant"].startswith("decode")} == {"decode"}
    assert [row["peak_bytes"] for row in rows if row["variant"] == "flex eager"] == ["", ""]   # not measurable
    columns, crossovers = read_csv(tmp_path / "variants-crossover.csv")
    assert columns == CROSSOVER_COLUMNS
    assert [row["softmax"] for row in crossovers] == ["softmax sdpa", "softmax self_attention"]
    columns, cache = read_csv(tmp_path / "variants-cache-bytes.csv")
    assert columns == CACHE_BYTES_COLUMNS and [row["variant"] for row in cache] == [
        "MHA", "GQA", "MQA", "MLA", "sliding window (MHA)", "linear"]
    assert (tmp_path / "variants.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert out.startswith("# ") and "linear chunked" in out and f"wrote {tmp_path / 'variants.csv'}" in out


@pytest.mark.parametrize("argv, message", [
    (["variants", "--lengths", "0"], "must be >= 1, got 0"),
    (["kv-cache", "--quick"], "--quick and --threads are options of variants"),
    (["variants", "--threads", "0"], "must be >= 1, got 0"),
    (["variants", "--dry-run"], "--dry-run, --max-minutes and --profile are options of flash"),
    (["kv-cache", "--profile", "long"], "--dry-run, --max-minutes and --profile are options of flash"),
    (["flash", "--profile", "short"], "invalid choice: 'short'"),
    (["distributed", "--threads", "2"], "--threads is an option of variants"),
    (["kv-cache", "--quick"], "--quick also of distributed"),
])
def test_main_refuses_an_option_of_another_command(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


TRAFFIC_COLUMNS = ["method", "scaling", "world_size", "n", "n_local", "batch", "heads", "head_dim", "kv_heads",
                   "forward_bytes", "wire_forward_bytes", "forward_formula", "total_bytes", "wire_total_bytes",
                   "total_formula", "matches"]


MEMORY_COLUMNS = ["method", "world_size", "n", "n_local", "peak_bytes", "shard_bytes", "scores_bytes"]


TIME_COLUMNS = ["method", "world_size", "n", "seconds", "median_seconds", "min_seconds", "max_seconds",
                "ratio_to_one_rank", "oversubscribed", "max_difference"]


@pytest.mark.slow
def test_main_distributed_quick_writes_the_csvs_and_ring_memory_follows_n_over_p(tmp_path, capsys):
    """Seven processes in three launches; every rank's first peak_memory call imports torch._dynamo (seconds)."""
    assert main(["distributed", "--quick", "--out", str(tmp_path)]) == 0
    columns, traffic = read_csv(tmp_path / "distributed-traffic.csv")
    assert columns == TRAFFIC_COLUMNS and {row["matches"] for row in traffic} == {"True"}
    assert [int(row["world_size"]) for row in traffic] == [p for _ in range(2) for p in (1, 2, 4) for _ in range(4)]
    columns, grouped = read_csv(tmp_path / "distributed-traffic-gqa.csv")
    assert columns == TRAFFIC_COLUMNS and {row["matches"] for row in grouped} == {"True"}
    assert {(row["heads"], row["kv_heads"]) for row in grouped} == {("16", "4")}
    columns, memory = read_csv(tmp_path / "distributed-memory.csv")
    assert columns == MEMORY_COLUMNS
    peak = {(row["method"], int(row["world_size"]), int(row["n"])): int(row["peak_bytes"]) for row in memory}
    # N/P fixed at 32 (N=32 on one rank, N=64 on two): ring's per-rank memory stays about the same,
    # Ulysses' grows with N (its ordinary attention holds [B, H/P, N, N] scores).
    assert peak["ring", 2, 64] / peak["ring", 1, 32] < 1.5 < peak["ulysses", 2, 64] / peak["ulysses", 1, 32]
    for method in ("ring", "ring zigzag", "ring striped", "ulysses"):      # N fixed: more ranks, less each
        assert peak[method, 4, 64] < peak[method, 2, 64] < peak[method, 1, 64], method
    columns, timing = read_csv(tmp_path / "distributed-time.csv")
    assert columns == TIME_COLUMNS and all(float(row["max_difference"]) < 1e-5 for row in timing)
    assert [row["ratio_to_one_rank"] for row in timing if row["world_size"] == "1"] == ["1.0"] * 4
    for row in timing:                                          # the best is the smallest of the repeats
        assert float(row["min_seconds"]) == float(row["seconds"]) <= float(row["median_seconds"]) <= float(
            row["max_seconds"])
    assert (tmp_path / "distributed.png").stat().st_size > 1000
    cores = os.cpu_count() or 1
    assert [row["oversubscribed"] for row in timing] == [str(int(row["world_size"]) > cores) for row in timing]
    out = capsys.readouterr().out
    assert "fwd tapped" in out and "oversubscribed" in out                  # the tables, as DataFrames
    assert f"wrote {tmp_path / 'distributed-traffic.csv'}" in out
