"""The IO model of chapter 06: hand counts of FLOPs and HBM bytes."""

from __future__ import annotations

import pytest

from attn_course.flash.io_model import GPUS, Step, fused_forward_step, naive_forward_steps, step_time, training_traffic


def test_naive_steps_count_the_n_by_n_matrices_by_hand():
    scores, softmax, product = naive_forward_steps(8, 2, bytes_per_number=1)
    assert (scores.flops, scores.bytes) == (2 * 64 * 2, 2 * 16 + 64)
    assert (softmax.flops, softmax.bytes) == (5 * 64, 128)
    assert (product.flops, product.bytes) == (256, 64 + 32)


def test_fused_intensity_grows_as_n_over_two_in_float16():
    for n in (1024, 4096, 16384):
        assert fused_forward_step(n, 64).intensity == pytest.approx(n / 2, rel=0.05)


def test_fused_kernel_is_compute_bound_and_naive_softmax_memory_bound_on_both_gpus():
    for gpu in GPUS.values():
        assert step_time(fused_forward_step(4096, 64), gpu)[1] == "compute"
        assert step_time(naive_forward_steps(4096, 64)[1], gpu)[1] == "memory"
    assert GPUS["H100 SXM"].ridge == pytest.approx(295, abs=1)


def test_training_traffic_flash1_grows_as_n_squared_and_flash2_as_n():
    small, large = training_traffic(1, 1, 4096, 64), training_traffic(1, 1, 8192, 64)
    assert large["naive"] / small["naive"] == pytest.approx(4, rel=0.01)
    assert large["flash1"] / small["flash1"] == pytest.approx(4, rel=0.1)
    assert large["flash2"] / small["flash2"] == pytest.approx(2)
    assert small["naive"] > small["flash1"] > small["flash2"]


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: naive_forward_steps(0, 64), ValueError, "naive_forward_steps: n must be >= 1"),
    (lambda: training_traffic(1, 1, 8, 8, mask_and_dropout="yes"), TypeError, "training_traffic: mask_and_dropout"),
    (lambda: step_time("S", GPUS["H100 SXM"]), TypeError, "step_time: step must be a Step"),
    (lambda: step_time(Step("x", 1, 1), "H100"), TypeError, "step_time: gpu must be a Gpu"),
])
def test_bad_arguments_are_named(call, error, message):
    with pytest.raises(error, match="^" + message):
        call()


@pytest.mark.parametrize("n, d, block_q, size", [(4096, 64, 128, 2), (1000, 128, 64, 2), (300, 64, 128, 4)])
def test_fused_forward_bytes_re_reads_k_and_v_once_per_query_tile(n, d, block_q, size):
    from attn_course.flash.io_model import fused_forward_bytes

    programs = -(-n // block_q)                          # ceil, by hand
    q_and_o = 2 * n * d * size
    k_and_v = programs * 2 * n * d * size
    assert fused_forward_bytes(n, d, block_q, bytes_per_number=size) == q_and_o + k_and_v + 4 * n
    # one tile holding every query: the L2 model's count (K and V once)
    assert fused_forward_bytes(n, d, n, bytes_per_number=size) == fused_forward_step(n, d, bytes_per_number=size).bytes


def test_fused_forward_bytes_rejects_a_bad_tile():
    from attn_course.flash.io_model import fused_forward_bytes

    with pytest.raises(ValueError, match="block_q"):
        fused_forward_bytes(128, 64, 0)
