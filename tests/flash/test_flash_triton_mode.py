"""Importing the package decides nothing: Triton's mode is chosen by one explicit call, on first use.

Each check runs in a fresh Python process with ``TRITON_INTERPRET`` removed from its environment
(``tests/conftest.py`` sets it for the test process itself on machines without a GPU), so what is
tested is the package alone: imports change no environment variable and import no Triton; the
kernels still run, compared with float64 math; a notebook's own ``@triton.jit`` cell works after
``use_interpreter_without_gpu()``.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from helpers import ROOT

pytest.importorskip("triton")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is chosen on machines without a GPU")


def run_without_triton_interpret(code: str) -> str:
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                            timeout=300, cwd=ROOT)        # the checkout: gpu_tools is not installed
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_imports_change_no_environment_variable_and_import_no_triton():
    out = run_without_triton_interpret("""
        import os, sys
        before = dict(os.environ)
        import attn_course, attn_course.flash, attn_course.checks, attn_course.measure
        import attn_course.flash.accuracy, attn_course.flash.small_kernel, gpu_tools.aot
        import attn_course.checks.flash
        print(dict(os.environ) == before, "triton" in sys.modules)
    """)
    assert out.split() == ["True", "False"]


@pytest.mark.slow
def test_flash_attention_runs_in_the_interpreter_with_nothing_set():
    out = run_without_triton_interpret("""
        import os
        before = dict(os.environ)
        import torch
        import attn_course
        from attn_course.flash import flash_attention
        from attn_course.flash.accuracy import plain_attention
        from attn_course.flash.launch import runs_in_interpreter
        generator = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 4, n, 32, generator=generator, dtype=torch.float64)
                   for n in (40, 70, 70))
        k, v = k[:, :2], v[:, :2]                                   # grouped-query, bottom-right causal
        out = flash_attention(q.float(), k.float(), v.float(), causal=True)
        expected, _ = plain_attention(q, k, v, causal=True)
        print((out.double() - expected).abs().max().item() < 1e-5, runs_in_interpreter(),
              dict(os.environ) == before)
    """)
    assert out.split() == ["True", "True", "True"]


@pytest.mark.slow
def test_a_notebook_kernel_runs_after_the_explicit_call():
    out = run_without_triton_interpret("""
        import os
        from attn_course.flash import use_interpreter_without_gpu
        before = dict(os.environ)
        print(use_interpreter_without_gpu(), dict(os.environ) == before)
        import torch
        import triton
        import triton.language as tl

        @triton.jit
        def double(X, Y, N: tl.constexpr):
            offsets = tl.arange(0, N)
            tl.store(Y + offsets, 2 * tl.load(X + offsets))

        x = torch.arange(16.0)
        y = torch.empty_like(x)
        double[(1,)](x, y, N=16)
        print(torch.equal(y, 2 * x))
    """)
    assert out.split() == ["True", "True", "True"]


@pytest.mark.slow
def test_triton_imported_first_in_gpu_mode_is_refused_with_what_to_do():
    out = run_without_triton_interpret("""
        import triton, torch
        from attn_course.flash import flash_attention
        q = torch.randn(1, 1, 8, 16)
        try:
            flash_attention(q, q, q)
        except RuntimeError as error:
            print("use_interpreter_without_gpu()" in str(error) and "TRITON_INTERPRET=1" in str(error))
    """)
    assert out.split() == ["True"]
