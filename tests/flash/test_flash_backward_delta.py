"""The backward's first kernel: Δ = rowsum(dO ∘ O) and the base-2 log-sum-exp, against float64.

Both backward kernels read these two numbers per query row. One small Triton kernel
(:func:`~attn_course.flash.triton_attention.attention_backward_delta`) computes them in a pass
over ``O`` and ``dO`` in their own dtype and strides, accumulating in float32; here it runs in
Triton's interpreter without a GPU (on a GPU, in float16 and bfloat16). The sm_80/sm_90 builds
are in ``test_flash_compile.py`` and ``test_flash_spills.py``.
"""

import math

import pytest
import torch

pytest.importorskip("triton")

from attn_course.flash.triton_attention import attention_backward_delta  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = (torch.float16, torch.bfloat16) if ON_GPU else (torch.float16, torch.float32)


def random_rows(batch, heads, n_q, head_dim, dtype, *, seed):
    generator = torch.Generator().manual_seed(seed)
    out, grad_out = (torch.randn(batch, heads, n_q, head_dim, generator=generator).to(DEVICE, dtype) for _ in range(2))
    lse = (3 * torch.randn(batch, heads, n_q, generator=generator)).to(DEVICE)
    return out, grad_out, lse


def assert_matches_float64(out, grad_out, lse):
    delta, lse_base2 = attention_backward_delta(grad_out, out, lse)
    exact = (grad_out.double() * out.double()).sum(dim=-1)                  # of the same rounded inputs
    # A float32 sum of d products: error at most about d · 2⁻²⁴ · Σ|products|.
    bound = out.shape[-1] * 2.0 ** -24 * (grad_out.double() * out.double()).abs().sum(dim=-1) + 1e-30
    assert delta.dtype == lse_base2.dtype == torch.float32 and delta.is_contiguous() and lse_base2.is_contiguous()
    assert delta.shape == lse_base2.shape == out.shape[:3]
    assert ((delta.double() - exact).abs() <= bound).all(), (delta.double() - exact).abs().max()
    torch.testing.assert_close(lse_base2.double(), lse.double() / math.log(2), rtol=2e-7, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_q", [1, 64, 100], ids=["one_row", "tile_multiple", "partial_tile"])
def test_delta_and_base2_lse_match_float64(n_q, dtype):
    assert_matches_float64(*random_rows(2, 3, n_q, 64, dtype, seed=n_q))


@pytest.mark.parametrize("head_dim", [16, 32, 128])
def test_every_supported_head_dim(head_dim):
    assert_matches_float64(*random_rows(1, 2, 70, head_dim, DTYPES[0], seed=head_dim))


def test_strided_inputs_give_the_contiguous_result():
    # [B, N, H, d] viewed as [B, H, N, d], as after a projection; the kernel reads them in place.
    out, grad_out, lse = random_rows(2, 4, 90, 32, DTYPES[0], seed=7)
    strided_out, strided_grad = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (out, grad_out))
    assert not strided_out.is_contiguous()
    for strided, contiguous in zip(attention_backward_delta(strided_grad, strided_out, lse),
                                   attention_backward_delta(grad_out, out, lse)):
        torch.testing.assert_close(strided, contiguous, atol=0, rtol=0)


def test_clear_errors():
    out, grad_out, lse = random_rows(1, 2, 8, 16, DTYPES[0], seed=1)
    with pytest.raises(ValueError, match=r"attention_backward_delta: grad_out must be shaped like out \[1, 2, 8, 16\]"):
        attention_backward_delta(grad_out[:, :, :4], out, lse)
    with pytest.raises(ValueError, match=r"lse must be float32 \[B, H, N_q\] = \[1, 2, 8\]"):
        attention_backward_delta(grad_out, out, lse.double())
    with pytest.raises(ValueError, match=r"lse must be float32 \[B, H, N_q\]"):
        attention_backward_delta(grad_out, out, lse[:, :, :4])
    with pytest.raises(ValueError, match="head dimension d must be one of"):
        attention_backward_delta(grad_out[..., :8], out[..., :8], lse)
    with pytest.raises(TypeError, match="attention_backward_delta: lse must be a torch.Tensor"):
        attention_backward_delta(grad_out, out, None)
    with pytest.raises((TypeError, ValueError), match="attention_backward_delta"):
        attention_backward_delta(grad_out.float() if DTYPES[0] != torch.float32 else grad_out.half(), out, lse)
