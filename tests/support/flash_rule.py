"""The Triton kernels' tests judge them by the one FlashAttention rule, :func:`attn_course.flash.accuracy.flash_rule`.

Its reference, :func:`~attn_course.flash.accuracy.plain_attention` in float64, takes grouped-query
heads and the bottom-right causal mask; a kernel's error against it may be at most
``factor · (plain attention's error in the same dtype) + floor``. Here: the inputs and the one
assertion the kernel test files share.
"""

import torch

from attn_course.flash.accuracy import flash_rule
from attn_course.flash.triton_attention import attention_forward, flash_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float16, torch.bfloat16) if DEVICE == "cuda" else (torch.float16, torch.float32)


def flash_kernel(q, k, v, *, causal, scale=None):
    """The autograd wrapper's output, and the forward kernel's log-sum-exp for the same inputs."""
    out = flash_attention(q, k, v, causal=causal, scale=scale)
    _, lse = attention_forward(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale)
    return out, lse


def random_inputs(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, *, seed=0, logit_scale=1.0):
    """``q [B, H, N_q, d]``, ``k``, ``v [B, H_kv, N_k, d]``, ``grad_out [B, H, N_q, d]``, drawn in
    float64 on the CPU, then cast and moved (``logit_scale`` multiplies ``q``)."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads, n_q, head_dim), (batch, kv_heads, n_k, head_dim), (batch, kv_heads, n_k, head_dim),
              (batch, heads, n_q, head_dim)]
    q, k, v, grad_out = (torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes)
    return [t.to(DEVICE, dtype) for t in (q * logit_scale, k, v, grad_out)]


def assert_flash_rule(q, k, v, grad_out, *, causal, kernel=None, gradients=True):
    """``kernel(q, k, v, causal=..., scale=...) -> (output, lse)`` (default: the Triton kernels)
    within the rule for the output, the log-sum-exp and, unless ``gradients=False``, dq, dk, dv."""
    checks = flash_rule(kernel or flash_kernel, q, k, v, grad_out if gradients else None, causal=causal)
    expected = ["output", "lse", "dq", "dk", "dv"] if gradients else ["output", "lse"]
    assert [check.quantity for check in checks] == expected
    for check in checks:
        assert check.passed, (f"{check.quantity}: kernel error {check.error:.2e}, allowed {check.allowed:.2e} "
                              f"(plain {q.dtype} attention's {check.plain_error:.2e})")
