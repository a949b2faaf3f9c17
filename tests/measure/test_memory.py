"""Tests for attn_course.measure.memory.peak_memory, against byte counts worked out by hand."""

from __future__ import annotations

import pytest
import torch

from attn_course.core.attention import self_attention
from attn_course.measure.memory import peak_memory

FLOAT32_BYTES = 4
MIB = 1024 * 1024
ONE_MIB_OF_FLOAT32 = MIB // FLOAT32_BYTES                           # 262144 elements


def test_zeros_1024_by_1024_float32_peaks_at_exactly_four_mib():
    result, peak = peak_memory(torch.zeros, 1024, 1024)
    assert peak == 1024 * 1024 * FLOAT32_BYTES
    assert result.shape == (1024, 1024)                             # fn's result comes back


def test_keyword_arguments_reach_fn():
    result, peak = peak_memory(torch.zeros, 10, dtype=torch.float64)
    assert result.dtype == torch.float64
    assert peak == 10 * 8


def test_memory_freed_before_the_next_allocation_is_not_counted_twice():
    def one_after_the_other():
        first = torch.ones(ONE_MIB_OF_FLOAT32)
        del first
        second = torch.ones(ONE_MIB_OF_FLOAT32)
        return second

    _, peak = peak_memory(one_after_the_other)
    assert peak == MIB


def test_freed_memory_is_subtracted_when_the_next_tensor_lands_elsewhere():
    # Two same-size tensors often share an address, which would hide a counter that never
    # subtracts freed storage; growing sizes make the allocator place each one anew.
    def growing_temporaries():
        for mebibytes in (1, 2, 3):
            temporary = torch.ones(mebibytes * ONE_MIB_OF_FLOAT32)
            del temporary

    _, peak = peak_memory(growing_temporaries)
    assert peak == 3 * MIB                                          # the largest, not the sum


def test_views_of_a_new_tensor_share_its_bytes():
    def one_tensor_many_views():
        base = torch.ones(ONE_MIB_OF_FLOAT32)
        return base[::2], base.view(2, -1), base.view(-1, 2).t(), base

    _, peak = peak_memory(one_tensor_many_views)
    assert peak == MIB


def test_memory_held_together_is_counted_together():
    def both_at_once():
        first = torch.ones(ONE_MIB_OF_FLOAT32)
        second = torch.ones(ONE_MIB_OF_FLOAT32)
        return first, second

    _, peak = peak_memory(both_at_once)
    assert peak == 2 * MIB


def test_inputs_do_not_count_but_new_results_do():
    big = torch.zeros(1024, 1024)
    _, peak = peak_memory(lambda x: x + 1, big)
    assert peak == 1024 * 1024 * FLOAT32_BYTES                      # the sum, not the input


def test_a_small_result_from_a_big_temporary_peaks_at_the_temporary():
    def reduce_a_temporary():
        temporary = torch.ones(ONE_MIB_OF_FLOAT32)
        return temporary.sum()

    _, peak = peak_memory(reduce_a_temporary)
    assert peak == MIB + FLOAT32_BYTES


@pytest.mark.parametrize(
    "fn",
    [lambda x: x[0], lambda x: x.t(), lambda x: x.detach(), lambda x: x.add_(1)],
    ids=["index", "transpose", "detach", "in-place-add"],
)
def test_views_and_in_place_updates_of_an_input_allocate_nothing(fn):
    _, peak = peak_memory(fn, torch.zeros(1024, 1024))
    assert peak == 0


def test_naive_attention_peak_grows_four_fold_when_n_doubles():
    generator = torch.Generator().manual_seed(0)
    peaks = []
    for n in (256, 512):
        q, k, v = torch.randn(3, n, 16, generator=generator).unbind(0)
        _, peak = peak_memory(self_attention, q, k, v)
        # At least the [N, N] float32 score matrix is alive at the peak.
        assert peak >= n * n * FLOAT32_BYTES
        peaks.append(peak)
    assert 3.5 <= peaks[1] / peaks[0] <= 4.5


@pytest.mark.parametrize("fn", [3, "torch.zeros", None])
def test_non_callable_fn_raises_type_error(fn):
    with pytest.raises(TypeError, match="peak_memory: fn must be callable"):
        peak_memory(fn)


def test_available_memory_bytes_reads_the_free_ram_and_refuses_other_devices(monkeypatch):
    import os

    from attn_course.measure.memory import available_memory_bytes

    pages = {"SC_PAGE_SIZE": 4096, "SC_AVPHYS_PAGES": 1000}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    assert available_memory_bytes() == available_memory_bytes("cpu") == 4096 * 1000
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (123, 456))     # free, total
    assert available_memory_bytes("cuda") == 123
    with pytest.raises(ValueError, match=r"^available_memory_bytes: device must be 'cpu' or 'cuda', got 'meta'"):
        available_memory_bytes("meta")
    with pytest.raises(TypeError, match=r"^available_memory_bytes: device must be a str or torch.device, got int"):
        available_memory_bytes(0)
