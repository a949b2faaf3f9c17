"""The optional five-product backward: dQ added by the dK/dV kernel with atomic float32 adds.

``attention_backward(..., deterministic=False)`` is FlashAttention-2's backward: the dK/dV kernel
also adds each tile's ``scale · dS K`` into a float32 dQ, so the dQ kernel (which recomputes
``P`` and ``dP``) does not run: five matrix products per pair of tiles instead of seven. It is
judged here like the default path, by the FlashAttention rule against float64
(:mod:`attn_course.flash.accuracy`), in Triton's interpreter without a GPU, with grouped-query
heads, bottom-right causal masks and lengths that are not tile multiples.
"""

import pytest
import torch

pytest.importorskip("triton")

from attn_course.flash.configs import atomic_dq_config  # noqa: E402
from attn_course.flash.triton_attention import attention_backward, attention_forward  # noqa: E402

from support.flash_rule import DEVICE, DTYPES, assert_flash_rule, random_inputs  # noqa: E402


class AtomicDqAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal):
        out, lse = attention_forward(q, k, v, causal=causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return *attention_backward(grad_out, *ctx.saved_tensors, causal=ctx.causal, deterministic=False), None


def atomic_dq_kernel(q, k, v, *, causal, scale=None):
    assert scale is None            # the kernels' default 1 / sqrt(d), as the reference's
    return AtomicDqAttention.apply(q, k, v, causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(128, 128), (100, 100), (70, 150)],
                         ids=["tile_multiple", "partial_tile", "fewer_queries"])
def test_matches_float64_by_the_flash_rule(n_q, n_k, causal, dtype):
    assert_flash_rule(*random_inputs(1, 4, 2, n_q, n_k, 32, dtype, seed=n_q + causal), causal=causal,
                      kernel=atomic_dq_kernel)


def test_multi_query_heads_and_a_wide_head_dim():
    assert_flash_rule(*random_inputs(2, 4, 1, 90, 90, 128, DTYPES[0], seed=5), causal=True, kernel=atomic_dq_kernel)


def test_dk_dv_are_those_of_the_deterministic_path_and_dq_agrees():
    q, k, v, grad_out = random_inputs(1, 4, 2, 100, 130, 64, DTYPES[0], seed=9)
    out, lse = attention_forward(q, k, v, causal=True)
    config = atomic_dq_config(64)           # the same tiles on both paths, so the same sums for dK, dV
    assert config.block_n == 128            # the widest key tile: the fewest atomic adds per element of dQ
    deterministic = attention_backward(grad_out, q, k, v, out, lse, causal=True, dkdv_config=config)
    atomic = attention_backward(grad_out, q, k, v, out, lse, causal=True, deterministic=False)
    for name, fixed, added in zip(("dq", "dk", "dv"), deterministic, atomic):
        assert added.dtype == fixed.dtype and added.shape == fixed.shape and added.is_contiguous(), name
        assert torch.isfinite(added).all(), name
    # dK and dV are summed in the same order on both paths (bit for bit in the interpreter; on a GPU
    # the two builds are different programs); dQ in another order, and in float32 throughout.
    exact = {"atol": 0, "rtol": 0} if DEVICE == "cpu" else {"atol": 1e-3, "rtol": 1e-3}
    torch.testing.assert_close(atomic[1], deterministic[1], **exact)
    torch.testing.assert_close(atomic[2], deterministic[2], **exact)
    torch.testing.assert_close(atomic[0].float(), deterministic[0].float(), atol=2e-3, rtol=0)


def test_deterministic_must_be_a_bool():
    q, k, v, grad_out = random_inputs(1, 2, 2, 8, 8, 16, DTYPES[0])
    out, lse = attention_forward(q, k, v)
    with pytest.raises(TypeError, match="attention_backward: deterministic must be a bool, got int"):
        attention_backward(grad_out, q, k, v, out, lse, deterministic=0)
