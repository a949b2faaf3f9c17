"""attn_course.measure.flash: FlashAttention on the CPU, time and exact memory, its rows and tables."""

from __future__ import annotations

import pytest

from attn_course.measure import flash

CPU_COLUMNS = ["method", "n", "seconds", "peak_mib", "max_difference"]


@pytest.fixture(scope="module")
def cpu_rows():
    return flash.cpu_rows(lengths=(64, 128), head_dim=16, block=64, repeats=1)


def test_attention_flops_matches_a_hand_count():
    # B=2, H=3, N=5, d=8: q kᵀ and weights @ v are 5·5·8 = 200 multiply-adds each, 2 FLOPs per
    # multiply-add: 2 · 2 · 200 = 800 per head, 6 heads: 4800.
    assert flash.attention_flops(2, 3, 5, 8, causal=False, mode="forward") == 4800
    assert flash.attention_flops(2, 3, 5, 8, causal=True, mode="forward") == 2400
    assert flash.attention_flops(2, 3, 5, 8, causal=False, mode="backward") == 2.5 * 4800
    assert flash.attention_flops(2, 3, 5, 8, causal=True, mode="forward+backward") == 3.5 * 2400


@pytest.mark.parametrize("arguments, error, message", [
    ((1, 1, 0, 8, False, "forward"), ValueError, r"n must be >= 1, got 0"),
    ((1, 1.0, 4, 8, False, "forward"), TypeError, r"heads must be an int, got float"),
    ((1, 1, 4, 8, 1, "forward"), TypeError, r"causal must be a bool, got int"),
    ((1, 1, 4, 8, False, "sideways"), ValueError, r"mode must be one of \['backward', 'forward'"),
    ((1, 1, 4, 8, False, None), TypeError, r"mode must be a str, got NoneType"),
])
def test_attention_flops_rejects_bad_input(arguments, error, message):
    *sizes, causal, mode = arguments
    with pytest.raises(error, match=r"^attention_flops: " + message):
        flash.attention_flops(*sizes, causal=causal, mode=mode)


def test_cpu_rows_agree_with_sdpa_and_naive_memory_grows_as_n_squared(cpu_rows):
    assert all(isinstance(row, flash.CpuRow) for row in cpu_rows)
    assert [(r.method, r.n) for r in cpu_rows] == [(m, n) for n in (64, 128) for m in ("naive", "tiled", "sdpa")]
    assert all(r.max_difference < 1e-5 and r.seconds > 0 for r in cpu_rows)
    peak = {(r.method, r.n): r.peak_mib for r in cpu_rows}
    # Naive stores the 128 × 128 weights (64 KiB in float32) and the scores: doubling N ×4.
    assert 3.5 < peak["naive", 128] / peak["naive", 64] < 4.5
    assert peak["tiled", 128] < peak["naive", 128] / 2


@pytest.mark.parametrize("changes, error, message", [
    ({"lengths": (64, 0)}, ValueError, r"lengths\[1\] must be >= 1, got 0"),
    ({"lengths": (64, "128")}, TypeError, r"lengths\[1\] must be an int, got str"),
    ({"lengths": 64}, TypeError, r"lengths must be a sequence of ints, got int"),
    ({"lengths": ()}, ValueError, r"lengths must not be empty"),
    ({"block": 0}, ValueError, r"block must be >= 1, got 0"),
    ({"head_dim": None}, TypeError, r"head_dim must be an int, got NoneType"),
])
def test_cpu_rows_rejects_bad_input(changes, error, message):
    with pytest.raises(error, match=r"^cpu_rows: " + message):
        flash.cpu_rows(**{"lengths": (16,), "repeats": 1, **changes})


def test_the_plot_rejects_mixed_or_missing_rows(tmp_path):
    cpu = flash.CpuRow(method="naive", n=64, seconds=1.0, peak_mib=1.0, max_difference=0.0)
    training = flash.TrainingRow("naive", 64, 0.1, 40.0, 1e-7)
    with pytest.raises(TypeError, match=r"^plot_rows: rows\[1\] must be CpuRow, got TrainingRow"):
        flash.plot_rows([cpu, training], tmp_path / "x.png", title="t")
    with pytest.raises(ValueError, match=r"^plot_rows: rows must not be empty"):
        flash.plot_rows([], tmp_path / "x.png", title="t")
    with pytest.raises(TypeError, match=r"^plot_rows: title must be a str, got int"):
        flash.plot_rows([cpu], tmp_path / "x.png", title=3)


def test_plot_draws_the_cpu_rows(cpu_rows, tmp_path):
    flash.plot_rows(cpu_rows, tmp_path / "cpu.png", title="CPU")
    assert (tmp_path / "cpu.png").stat().st_size > 1000


def test_training_rows_measure_forward_and_backward_and_tiled_needs_less_memory():
    rows = flash.training_rows((128, 256), head_dim=16, block=32)
    assert [(r.method, r.n) for r in rows] == [(m, n) for n in (128, 256) for m in ("naive", "tiled")]
    assert all(isinstance(r, flash.TrainingRow) and r.max_grad_difference < 1e-5 and r.seconds > 0 for r in rows)
    peak = {(r.method, r.n): r.peak_mib for r in rows}
    assert peak["naive", 256] > 3 * peak["naive", 128]          # N² weights kept for the backward
    assert peak["tiled", 256] < 2.5 * peak["tiled", 128]        # O and the LSE only
    assert peak["naive", 256] > 2 * peak["tiled", 256]


def test_training_rows_reject_bad_input():
    with pytest.raises(ValueError, match=r"^training_rows: lengths must not be empty"):
        flash.training_rows(())


