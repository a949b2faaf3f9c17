"""Every autotuning candidate computes the same attention, in Triton's interpreter and on a GPU.

On a GPU the autotuner may pick any entry of ``CONFIGS``; the interpreter runs only the first
unless told otherwise. So each other candidate is run here explicitly (``config=`` and friends),
bottom-right causal with grouped-query heads at lengths that are not multiples of its tiles,
and judged against float64 by the FlashAttention rule. (``tests/flash/test_flash_compile.py``
compiles each of them for sm_80 and sm_90.)

This is also the one place where autotuning itself runs on a GPU
(:func:`test_the_autotuned_launch_runs`): everywhere else the kernel tests pin the default
configuration (``gpu_setup.pinned_configs``), so that each kernel compiles once.
"""

import pytest
import torch

pytest.importorskip("triton")

# On a GPU the kernels not under test run in their default configuration (see gpu_setup).
from gpu_setup import PRECISE_DTYPE, autotuned_kernel, pinned_configs, round_off  # noqa: E402, F401

from attn_course.flash.configs import CONFIGS, kernel_configs  # noqa: E402
from attn_course.flash.decode import attention_decode_forward  # noqa: E402
from attn_course.flash.launch import program_grid  # noqa: E402
from attn_course.flash.triton_attention import attention_backward, attention_forward  # noqa: E402

from support.flash_rule import DEVICE, assert_flash_rule, random_inputs  # noqa: E402

OTHER_CANDIDATES = [(kernel, head_dim, index) for (kernel, head_dim), candidates in sorted(CONFIGS.items())
                    for index in range(1, len(candidates))]


def with_config(kernel, config):
    """``(output, lse)`` with ``kernel`` in ``config`` (the others at their defaults), differentiable."""
    forward_config = config if kernel == "forward" else None
    backward_configs = {f"{kernel[len('backward_'):]}_config": config} if kernel.startswith("backward") else {}

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal):
            if kernel == "decode":
                out, lse = attention_decode_forward(q, k, v, causal=causal, num_splits=2, config=config)
            else:
                out, lse = attention_forward(q, k, v, causal=causal, config=forward_config)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.causal = causal
            return out, lse

        @staticmethod
        def backward(ctx, grad_out, grad_lse):
            grads = attention_backward(grad_out, *ctx.saved_tensors, causal=ctx.causal, **backward_configs)
            return *grads, None

    def run(q, k, v, *, causal, scale=None):
        assert scale is None            # the kernels' default 1 / sqrt(d), as the reference's
        return Attention.apply(q, k, v, causal)
    return run


@pytest.mark.parametrize("kernel, head_dim, index", OTHER_CANDIDATES,
                         ids=[f"{kernel}-d{head_dim}-{index}" for kernel, head_dim, index in OTHER_CANDIDATES])
def test_each_candidate_matches_float64_by_the_flash_rule(kernel, head_dim, index):
    config = kernel_configs(kernel, head_dim)[index]
    n_q = 5 if kernel == "decode" else 150           # decoding: a few queries
    inputs = random_inputs(1, 2, 1, n_q, 300, head_dim, torch.float16, seed=index)
    assert_flash_rule(*inputs, causal=True, kernel=with_config(kernel, config),
                      gradients=kernel.startswith("backward"))


def test_there_are_candidates_to_tune_over():
    assert {kernel for kernel, _, _ in OTHER_CANDIDATES} == {"forward", "backward_dkdv", "backward_dq", "decode"}


@pytest.mark.parametrize("kernel", ["forward", "decode"])
def test_the_autotuned_launch_runs(kernel):
    # The launcher wraps each kernel in triton.autotune over its candidates. On a GPU, at d = 64
    # (three forward candidates, two decode ones) the autotuner compiles and times every candidate
    # and launches the fastest. The interpreter cannot time candidates, but with a head dim that
    # has one candidate the same wrapper runs without timing. Either way this checks the wrapper's
    # key names and the grid it is given, against the default configuration's result.
    head_dim = 64 if DEVICE == "cuda" else 16
    candidates = kernel_configs(kernel, head_dim)
    assert len(candidates) > 1 if DEVICE == "cuda" else len(candidates) == 1
    q, k, v, _ = random_inputs(1, 2, 1, 3 if kernel == "decode" else 70, 90, head_dim, PRECISE_DTYPE, seed=3)
    scale = head_dim ** -0.5
    tuned = autotuned_kernel(kernel, head_dim)       # the real autotuner, never the tests' pinned stand-in
    # The reference: the pointer forward in its default configuration (on a GPU not the TMA kernel).
    expected, expected_lse = attention_forward(q, k, v, causal=True, config=kernel_configs("forward", head_dim)[0])
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device)
    strides = (*q.stride(), *k.stride(), *v.stride())
    if kernel == "forward":
        tuned[lambda meta: program_grid(-(-70 // meta["BLOCK_M"]), 2)](
            q, k, v, out, lse, *strides, *out.stride(), 2, 2, 70, 90, scale, HEAD_DIM=head_dim, CAUSAL=True)
    else:
        partial_out = torch.empty(2, 1, 3, head_dim, device=q.device)
        partial_lse = torch.empty(2, 1, 3, device=q.device)
        tuned[lambda meta: (1, 1, 1)](q, k, v, partial_out, partial_lse, *strides, 2, 2, 3, 90, scale, 1,
                                      HEAD_DIM=head_dim, CAUSAL=True, BLOCK_M=16)
        out = partial_out.view(1, 2, 3, head_dim).to(q.dtype)
        lse = partial_lse.view(1, 2, 3) * 0.6931471805599453          # base 2 -> natural
    # Another candidate sums in other tiles: round-off apart (float16 on a GPU), in float32 exactly the
    # same tiles (one candidate).
    torch.testing.assert_close(out, expected, atol=round_off(q.dtype), rtol=0)
    torch.testing.assert_close(lse, expected_lse, atol=1e-5 if q.dtype == torch.float32 else 1e-4, rtol=0)
