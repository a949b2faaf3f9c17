"""Ahead-of-time compilation of every FlashAttention kernel configuration for sm_80 and sm_90.

Triton's interpreter (what the other flash tests use without a GPU) does not enforce dot
shapes, dtypes or shared-memory limits; the real compiler does. This needs no GPU.
Triton fixes its mode at import, so compilation runs in subprocesses with
``TRITON_INTERPRET=0``, two shards in parallel. The compiling tests are marked slow.
"""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from attn_course.flash.aot import SHARED_MEMORY_LIMIT, all_cases  # noqa: E402

SHARDS = 2


@pytest.fixture(scope="module")
def compile_report():
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1", "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen([sys.executable, "-m", "attn_course.flash.aot", f"{shard}/{SHARDS}"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for shard in range(SHARDS)
    ]
    lines, errors = [], []
    for process in processes:
        stdout, stderr = process.communicate(timeout=900)
        lines += stdout.splitlines()
        if process.returncode not in (0, 1):   # 1 means "compiled, but something is too big"
            errors.append(stderr[-3000:])
    assert not errors, "\n".join(errors)
    return lines


@pytest.mark.slow
def test_every_configuration_compiles_for_sm80_and_sm90(compile_report):
    assert len(compile_report) == len(all_cases())
    for kernel, head_dim, dtype, causal, capability in all_cases():
        expected = f"{kernel} d={head_dim} {dtype} causal={causal} sm_{capability}:"
        assert any(line.startswith(expected) for line in compile_report), expected


@pytest.mark.slow
def test_shared_memory_fits_each_gpu(compile_report):
    too_big = [line for line in compile_report if not line.endswith(" OK")]
    assert not too_big, too_big
    for line in compile_report:
        shared, limit = map(int, re.search(r"shared (\d+) limit (\d+)", line).groups())
        assert 0 < shared <= limit
        assert limit == SHARED_MEMORY_LIMIT[int(re.search(r"sm_(\d+)", line).group(1))]


def test_compile_kernel_refuses_interpreter_mode():
    from attn_course.flash import aot
    from attn_course.flash.triton_attention import runs_in_interpreter

    if not runs_in_interpreter():
        pytest.skip("Triton is in GPU mode in this process")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=0"):
        aot.compile_kernel("forward", 64, "float16", False, 90)
