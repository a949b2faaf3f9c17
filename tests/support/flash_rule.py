"""The FlashAttention error rule for the Triton kernels' tests, with grouped-query heads and
bottom-right causal masks.

The shared reference :func:`~attn_course.flash.accuracy.plain_attention` takes neither
``H_kv < H`` nor causal with ``N_q != N_k``, so the reference here is the same plain attention
written out with the heads repeated (autograd then sums each group's gradients, which is
what grouped-query dK/dV must be) and :func:`~attn_course.core.masks.causal_mask`'s bottom-right
mask; the rule's factors and floors are :mod:`attn_course.flash.accuracy`'s: a kernel's error
against float64 may be at most ``factor · (plain attention's error in the same dtype) + floor``.
"""

import torch

from attn_course.core.masks import causal_mask
from attn_course.flash.accuracy import FACTORS, FLOORS
from attn_course.flash.triton_attention import attention_forward, flash_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float16, torch.bfloat16) if DEVICE == "cuda" else (torch.float16, torch.float32)


def reference(q, k, v, *, causal):
    """Plain attention in the inputs' dtype: output and natural log-sum-exp."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)    # [B, H, N_k, d]
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5                         # [B, H, N_q, N_k]
    if causal:   # causal_mask's default offset N_k - N_q: bottom-right aligned
        scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], device=q.device), float("-inf"))
    lse = torch.logsumexp(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1)
    return torch.softmax(scores, dim=-1) @ v, lse


def flash_kernel(q, k, v, *, causal):
    out = flash_attention(q, k, v, causal=causal)
    _, lse = attention_forward(q.detach(), k.detach(), v.detach(), causal=causal)
    return out, lse


def results(attention, q, k, v, grad_out, causal, gradients=True):
    q, k, v = (t.detach().clone().requires_grad_(gradients) for t in (q, k, v))
    out, lse = attention(q, k, v, causal=causal)
    if not gradients:
        return {"output": out, "lse": lse}
    out.backward(grad_out)
    return {"output": out, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def errors_by_the_flash_rule(q, k, v, grad_out, causal, *, kernel=None, gradients=True):
    """``{quantity: (kernel error, allowed)}`` against float64, allowed = factor · plain error + floor.
    ``gradients=False`` judges the forward only (output and log-sum-exp)."""
    judged = results(kernel or flash_kernel, q, k, v, grad_out, causal, gradients)
    plain = results(reference, q, k, v, grad_out, causal, gradients)
    exact = results(reference, *(t.double() for t in (q, k, v, grad_out)), causal, gradients)
    found = {}
    for quantity, factor in FACTORS.items():
        if quantity not in judged:
            continue
        error = (judged[quantity].double() - exact[quantity]).abs().max().item()
        plain_error = (plain[quantity].double() - exact[quantity]).abs().max().item()
        found[quantity] = (error, factor * plain_error + FLOORS[q.dtype])
    return found


def random_inputs(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, *, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads, n_q, head_dim), (batch, kv_heads, n_k, head_dim), (batch, kv_heads, n_k, head_dim),
              (batch, heads, n_q, head_dim)]
    return [torch.randn(shape, generator=generator, dtype=torch.float64).to(DEVICE, dtype) for shape in shapes]


def assert_flash_rule(*inputs, causal, kernel=None, gradients=True):
    found = errors_by_the_flash_rule(*inputs, causal, kernel=kernel, gradients=gradients)
    for quantity, (error, allowed) in found.items():
        assert error <= allowed, f"{quantity}: kernel error {error:.2e}, allowed {allowed:.2e}"
