"""The kernels' grids fit CUDA's limits however many sequences and heads there are (issue 42).

CUDA takes at most 2**31 - 1 programs along a grid's x axis and 65,535 along y and z (CUDA C++
programming guide, "Technical specifications per compute capability"). A grid with ``B·H`` (or
``B·H_kv``) on y fails to launch once that passes 65,535: a decode step of 2048 sequences with 32
key/value heads. In Triton's interpreter a grid is only a loop, so the launchers' grids are checked
here as they are computed, by kernels that record their launches instead of running: flash-decoding,
the forward and both backward paths at B = 2048 sequences of H = 32 heads, N = 1 (inputs expanded
from one row, so nothing large is allocated). The kernels' results on real launches, of every tile
of every head, are the other kernel tests' (``test_every_element_is_written`` and those against SDPA).
"""

import pytest
import torch

pytest.importorskip("triton")

from attn_course.flash import decode, launch, triton_attention  # noqa: E402
from attn_course.flash.configs import atomic_dq_config, kernel_config  # noqa: E402

X_LIMIT, YZ_LIMIT = 2**31 - 1, 65535        # CUDA's, not read from the code under test


class RecordingKernel:
    """A kernel as a launcher sees it, ``kernel[grid](...)``: records the grid, runs nothing."""

    def __init__(self, name, grids):
        self.name, self.grids = name, grids

    def __getitem__(self, grid):
        def run(*args, **options):
            self.grids.append((self.name, tuple(grid(options) if callable(grid) else grid)))
        return run


@pytest.fixture
def grids(monkeypatch):
    recorded = []
    for module in (launch, decode, triton_attention):
        monkeypatch.setattr(module, "kernel_function", lambda name: RecordingKernel(name, recorded))
    monkeypatch.setattr(launch, "runs_in_interpreter", lambda: True)     # CPU tensors are the kernels' inputs
    return recorded


def expanded(*shape):
    """A float16 tensor of ``shape`` that holds one row of ``d`` numbers (every other stride 0)."""
    return torch.randn(shape[-1]).half().expand(*shape)


def assert_within_cuda_limits(grids, programs_at_least):
    """Each recorded grid is within CUDA's limits and has at least ``programs_at_least[kernel]`` programs
    (one per unit of work the kernel's docstring gives it)."""
    assert grids
    for name, grid in grids:
        x, y, z = (*grid, 1, 1)[:3]
        assert x <= X_LIMIT and y <= YZ_LIMIT and z <= YZ_LIMIT, f"{name}: grid {grid} past CUDA's limits"
        assert x * y * z >= programs_at_least[name], f"{name}: grid {grid} has fewer programs than its work"


@pytest.mark.parametrize("num_splits", [None, 4])
def test_a_decode_step_of_2048_sequences_with_32_key_value_heads_fits_cudas_grid(grids, num_splits):
    batch, kv_heads, n_k = 2048, 32, 1024                                 # B·H_kv = 65,536 > 65,535
    q = expanded(batch, kv_heads, 1, 64)
    k = v = expanded(batch, kv_heads, n_k, 64)
    out, lse = decode.attention_decode_forward(q, k, v, num_splits=num_splits, config=kernel_config("decode", 64))
    assert out.shape == q.shape and lse.shape == q.shape[:3]
    assert [name for name, _ in grids] == ["attention_decode_kernel", "attention_decode_merge_kernel"]
    # One program per split of each (batch, key/value head); the merge: one per (batch, head, query) row.
    assert_within_cuda_limits(grids, {"attention_decode_kernel": batch * kv_heads * (num_splits or 1),
                                      "attention_decode_merge_kernel": batch * kv_heads})


def test_the_forward_and_both_backward_paths_of_2048_sequences_of_32_heads_fit_cudas_grid(grids):
    batch, heads = 2048, 32                                               # B·H = 65,536 > 65,535
    q = k = v = grad_out = expanded(batch, heads, 1, 64)
    out, lse = triton_attention.attention_forward(q, k, v, config=kernel_config("forward", 64))
    lse.zero_()
    for deterministic in (True, False):
        triton_attention.attention_backward(grad_out, q, k, v, out, lse, deterministic=deterministic,
                                            dkdv_config=atomic_dq_config(64),
                                            dq_config=kernel_config("backward_dq", 64))
    assert [name for name, _ in grids] == [
        "attention_forward_kernel", "attention_backward_delta_kernel", "attention_backward_dkdv_kernel",
        "attention_backward_dq_kernel", "attention_backward_delta_kernel", "attention_backward_dkdv_kernel"]
    assert_within_cuda_limits(grids, dict.fromkeys((name for name, _ in grids), batch * heads))


def test_program_grid_puts_tiles_and_pairs_on_x_and_refuses_what_cuda_cannot_launch():
    assert launch.program_grid(3, 65536) == (3 * 65536, 1, 1)
    assert launch.program_grid(4, 10, 2) == (40, 1, 2)
    with pytest.raises(ValueError, match=r"^program_grid: CUDA takes at most"):
        launch.program_grid(2**16, 2**16)                                    # 2**32 programs along x
    with pytest.raises(ValueError, match=r"^program_grid: CUDA takes at most"):
        launch.program_grid(1, 1, 65536)
    with pytest.raises(ValueError, match=r"^program_grid: batch_heads must be >= 1, got 0"):
        launch.program_grid(1, 0)
    with pytest.raises(TypeError, match=r"^program_grid: tiles must be an int, got float"):
        launch.program_grid(1.0, 1)
