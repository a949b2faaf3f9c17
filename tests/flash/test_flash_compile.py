"""Ahead-of-time compilation of the FlashAttention kernels for sm_80 and sm_90.

Triton's interpreter (what the other flash tests use without a GPU) does not enforce dot
shapes, dtypes or shared-memory limits; the real compiler does. This needs no GPU. The cases
are :func:`~gpu_tools.aot.essential_cases`: every kernel path for every head dim,
causal flag and GPU, and every autotuning candidate at least once
(``python -m gpu_tools.aot --all`` compiles the full product).
A process has one Triton mode (:mod:`attn_course.flash.triton_mode`), so compilation runs in
subprocesses with ``TRITON_INTERPRET=0``, two shards in parallel. The compiling tests are marked slow.
"""

import re

import pytest

pytest.importorskip("triton")

from gpu_tools.aot import SHARED_MEMORY_LIMIT, Case, compile_case, essential_cases  # noqa: E402

from helpers import run_aot_shards  # noqa: E402

SHARDS = 2


@pytest.fixture(scope="module")
def compile_report():
    return run_aot_shards(shards=SHARDS)


@pytest.mark.slow
def test_every_configuration_compiles_for_sm80_and_sm90(compile_report):
    cases = essential_cases()
    assert len(compile_report) == len(cases)
    for case in cases:
        assert any(line.startswith(f"{case.name}:") for line in compile_report), case.name
    # Every candidate configuration of every kernel is among them, for both GPUs.
    from attn_course.flash.configs import CONFIGS
    for (kernel, head_dim), candidates in CONFIGS.items():
        for index in range(len(candidates)):
            for capability in SHARED_MEMORY_LIMIT:
                assert any(c.kernel == kernel and c.config == index and c.capability == capability
                           and (c.head_dim == head_dim or len(candidates) == 1) for c in cases)


@pytest.mark.slow
def test_hopper_code_uses_warp_group_matrix_multiplies(compile_report):
    # On sm_90 every tile product of 64 rows or more must become wgmma (Hopper's tensor-core
    # instruction); mma.sync alone would leave much of an H100/H200 unused. The decode kernel's
    # 16-row tiles are below wgmma's 64-row minimum; the merge and the backward's Δ kernel have
    # no matrix product.
    for line in compile_report:
        wide_tiles = not line.startswith(("decode[", "decode_merge", "backward_delta")) or "block_m=64" in line
        if "sm_90" in line and wide_tiles:
            assert "wgmma=True" in line, line
        if "sm_80" in line:
            assert "wgmma=False" in line, line


@pytest.mark.slow
def test_shared_memory_fits_each_gpu(compile_report):
    too_big = [line for line in compile_report if not line.endswith(" OK")]
    assert not too_big, too_big
    for line in compile_report:
        shared, limit = map(int, re.search(r"shared (\d+) limit (\d+)", line).groups())
        assert 0 < shared <= limit
        assert limit == SHARED_MEMORY_LIMIT[int(re.search(r"sm_(\d+)", line).group(1))]


def test_compile_case_refuses_interpreter_mode():
    from attn_course.flash.launch import runs_in_interpreter

    if not runs_in_interpreter():
        pytest.skip("Triton is in GPU mode in this process")
    for kernel in ("forward", "forward_tma"):
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=0"):
            compile_case(Case(kernel, 0, 64, "float16", False, 90))
