"""Chapter 07's first kernel, one program for all the queries of a head: equal to attention in float64."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.flash.triton_mode import triton_installed, use_interpreter_without_gpu

pytestmark = pytest.mark.skipif(not triton_installed(), reason="needs Triton (Linux)")


@pytest.mark.parametrize(("n_q", "n_k", "d"), [(16, 16, 16), (16, 40, 32), (32, 70, 16)])
def test_the_one_program_kernel_is_attention_and_ends_at_each_rows_maximum(n_q, n_k, d):
    use_interpreter_without_gpu()
    from attn_course.flash.one_program_kernel import one_program_attention_kernel
    from attn_course.flash.small_kernel import launch_small_attention

    generator = torch.Generator().manual_seed(n_k)
    q, k, v = (torch.randn(n, d, generator=generator) for n in (n_q, n_k, n_k))
    k[-1] *= 5                                                   # the largest scores in the last tile
    out, row_max = launch_small_attention(one_program_attention_kernel, q, k, v)
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(out.cpu().double(), expected, atol=1e-5, rtol=1e-5)
    base_2 = q.double() @ k.double().T / math.sqrt(d) * math.log2(math.e)
    torch.testing.assert_close(row_max.cpu().double(), base_2.amax(-1), atol=1e-4, rtol=1e-5)
