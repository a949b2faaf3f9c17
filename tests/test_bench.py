"""attn_course.bench: the benchmarks run and report sane rows (no timing assertions)."""

from __future__ import annotations

import csv

import pytest
import torch

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


# --- flash ---------------------------------------------------------------------------------

from attn_course.flash import benchmark  # noqa: E402


def test_attention_flops_counts_two_matrix_products():
    # q kᵀ is [N, d] x [d, N] and weights @ v is [N, N] x [N, d]: N·N·d multiply-adds each,
    # two FLOPs per multiply-add, per batch element and head.
    batch, heads, n, d = 2, 3, 5, 8
    one_product = 2 * n * n * d
    full = benchmark.attention_flops(batch, heads, n, d, causal=False, mode="forward")
    assert full == batch * heads * 2 * one_product
    assert benchmark.attention_flops(batch, heads, n, d, causal=True, mode="forward") == full / 2
    forward = benchmark.attention_flops(1, 1, n, d, causal=False, mode="forward")
    assert benchmark.attention_flops(1, 1, n, d, causal=False, mode="forward+backward") == 3.5 * forward
    with pytest.raises(ValueError, match="mode must be one of"):
        benchmark.attention_flops(1, 1, n, d, causal=False, mode="sideways")
    with pytest.raises(ValueError, match="n"):
        benchmark.attention_flops(1, 1, 0, d, causal=False, mode="forward")


def test_cpu_rows_show_quadratic_naive_memory_and_agree_with_sdpa():
    rows = benchmark.cpu_rows(lengths=(256, 512), head_dim=16, block=64, repeats=1)
    assert {(r["method"], r["n"]) for r in rows} == {(m, n) for m in ("naive", "tiled", "sdpa") for n in (256, 512)}
    peak = {(r["method"], r["n"]): r["peak_mib"] for r in rows}
    # Naive stores the 512x512 weights (1 MiB in float32) and more; doubling N quadruples them.
    assert peak["naive", 512] >= 1.0 and peak["naive", 512] / peak["naive", 256] > 3.5
    assert peak["tiled", 512] < peak["naive", 512] / 2
    assert all(r["max_difference"] < 1e-5 and r["seconds"] > 0 for r in rows)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_gpu_rows_need_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        benchmark.gpu_rows()


def test_command_line_flash_writes_csv_and_plot(tmp_path, capsys):
    assert bench.main(["flash", "--lengths", "128", "256", "--out", str(tmp_path)]) == 0
    name = "flash-gpu" if torch.cuda.is_available() else "flash-cpu"
    with open(tmp_path / f"{name}.csv") as handle:
        assert {row["n"] for row in csv.DictReader(handle)} == {"128", "256"}
    assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert "torch" in capsys.readouterr().out
