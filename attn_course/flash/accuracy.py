"""How to tell whether a FlashAttention kernel is accurate enough: the FlashAttention rule.

A half-precision kernel cannot match float64 exactly, and a fixed tolerance would be either
too loose for short rows or too strict for long ones. The FlashAttention test suite compares
instead with what plain attention achieves *in the same dtype*: against a float64 reference,

    kernel error  <=  factor · (error of plain attention in the kernel's dtype)  +  floor

for the output (factor 2), the log-sum-exp (2) and each gradient (3). The floor only absorbs
cases where plain attention happens to be exact (one key: its ``dq`` is exactly 0, a kernel's a
few float32 round-offs): 1e-5 for float16, about a hundredth of the errors float16 attention
reaches (around 1e-3), so the factor, not the floor, decides; 1e-6 for float32.

:func:`plain_attention` is the course's one reference for the kernels: grouped-query heads
(``H_kv < H``) and the bottom-right causal mask of :func:`~attn_course.core.masks.causal_mask`
(the queries are the last ``N_q`` of the ``N_k`` positions), in any dtype, float64 included.
Chapter 07, the kernel tests and the GPU self-check (``python -m benchmarks.selfcheck``) use this
module, so all three judge the kernels the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from attn_course import _validate
from attn_course.core.masks import causal_mask

__all__ = ["FACTORS", "FLOORS", "RuleCheck", "check_attention_inputs", "flash_rule", "plain_attention",
           "report_flash_rule"]

#: How many times plain attention's error the kernel may have, per quantity.
FACTORS = {"output": 2.0, "lse": 2.0, "dq": 3.0, "dk": 3.0, "dv": 3.0}
#: The absolute allowance added on top, per dtype: far below the errors the dtype reaches.
FLOORS = {torch.float16: 1e-5, torch.bfloat16: 1e-4, torch.float32: 1e-6, torch.float64: 1e-14}


class RuleCheck(NamedTuple):
    """One quantity judged by the FlashAttention rule.

    Attributes:
        quantity: ``"output"``, ``"lse"``, ``"dq"``, ``"dk"`` or ``"dv"``.
        error: the kernel's largest absolute difference from float64.
        plain_error: plain attention's (same dtype) largest absolute difference from float64.
        allowed: ``factor · plain_error + floor``.
    """

    quantity: str
    error: float
    plain_error: float
    allowed: float

    @property
    def passed(self) -> bool:
        """Whether the kernel is within the rule."""
        return self.error <= self.allowed


def plain_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention the obvious way, in the inputs' own dtype: the yardstick of the rule, and in
    float64 the reference.

    Args:
        q: ``[B, H, N_q, d]``.
        k: ``[B, H_kv, N_k, d]`` and v: ``[B, H_kv, N_k, d_v]``, with ``H % H_kv == 0``: query head
            ``h`` uses key/value head ``h // (H / H_kv)`` (grouped-query attention; autograd then
            sums each group's gradients into its key/value head, as a kernel must).
        causal: bottom-right aligned, as after a KV cache: query ``i`` sees keys up to
            ``i + N_k - N_q`` (requires ``N_q <= N_k``; with ``N_q == N_k`` the usual ``0..i``).
        scale: defaults to ``1 / sqrt(d)``.

    Returns:
        ``(output [B, H, N_q, d_v], lse [B, H, N_q])``; the log-sum-exp of the scaled scores is
        computed in float32 or wider, as kernels store it.

    Raises:
        TypeError: non-tensors, a non-bool ``causal``.
        ValueError: shapes that do not fit, ``H`` not a multiple of ``H_kv``, causal with
            ``N_q > N_k``, a bad scale.

    Example:
        >>> q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
        >>> out, lse = plain_attention(q, k, v, causal=True)       # 2 groups of 2 query heads
        >>> out.shape, lse.shape
        (torch.Size([1, 4, 3, 8]), torch.Size([1, 4, 3]))
    """
    scale = check_attention_inputs("plain_attention", q, k, v, causal, scale)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)   # [B, H, N_k, d], [B, H, N_k, d_v]
    scores = (q @ k.transpose(-2, -1)) * scale                                  # [B, H, N_q, N_k]
    if causal:   # causal_mask's default offset N_k - N_q: bottom-right aligned
        allowed = causal_mask(q.shape[2], k.shape[2], device=q.device)          # [N_q, N_k]
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1)
    return torch.softmax(scores, dim=-1) @ v, lse                               # [B, H, N_q, d_v], [B, H, N_q]


def check_attention_inputs(where: str, q, k, v, causal, scale, *, value_dim_is_d: bool = False) -> float:
    """The checks of :func:`plain_attention` and of every kernel launcher
    (:func:`~attn_course.flash.launch.check_kernel_inputs`): q ``[B, H, N_q, d]``, k ``[B, H_kv, N_k, d]``,
    v ``[B, H_kv, N_k, d_v]`` (``d_v = d`` with ``value_dim_is_d``) with ``H % H_kv == 0``, a bool
    ``causal`` (then ``N_q <= N_k``), a positive finite scale or None (``1 / sqrt(d)``).

    Returns:
        The scale, a float.

    Raises:
        TypeError: non-tensors, a non-bool ``causal``.
        ValueError: shapes that do not fit, a bad scale.
    """
    _validate.four_d(where, q=q, k=k, v=v)
    _validate.boolean(where, "causal", causal)
    if value_dim_is_d and k.shape != v.shape:
        raise ValueError(f"{where}: v must have k's shape [B, H_kv, N_k, d] (d_v = d in this kernel), got k "
                         f"{_validate.shape_str(k)}, v {_validate.shape_str(v)}")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1] or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"{where}: expected q [B, H, N_q, d], k [B, H_kv, N_k, d] and v [B, H_kv, N_k, d_v] with "
                         f"the same B and d, got q {_validate.shape_str(q)}, k {_validate.shape_str(k)}, "
                         f"v {_validate.shape_str(v)}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"{where}: the number of query heads H must be a multiple of the key/value heads "
                         f"H_kv (grouped-query attention), expected q [B, H, N_q, d] and k [B, H_kv, N_k, d] "
                         f"with H % H_kv == 0, got q {_validate.shape_str(q)}, k {_validate.shape_str(k)}")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(f"{where}: causal needs N_q <= N_k (the queries are the last N_q of the N_k "
                         f"positions, bottom-right aligned), got N_q={q.shape[2]}, N_k={k.shape[2]}")
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else _validate.positive_finite(where, "scale", scale)


def _outputs_and_gradients(attention, q, k, v, grad_out, causal, scale):
    """Run ``attention`` on fresh leaves; return ``{quantity: tensor}``, with the gradients when
    ``grad_out`` is given."""
    q, k, v = (t.detach().clone().requires_grad_(grad_out is not None) for t in (q, k, v))
    result = attention(q, k, v, causal=causal, scale=scale)
    out, lse = result if isinstance(result, tuple) else (result, None)
    found = {"output": out.detach()}
    if lse is not None:
        found["lse"] = lse.detach()
    if grad_out is not None:
        found.update(zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), grad_out)))
    return found


def flash_rule(
    attention: Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor | None,
    *,
    causal: bool = False,
    scale: float | None = None,
) -> list[RuleCheck]:
    """Judge an attention implementation, forward and backward, by the FlashAttention rule.

    ``attention(q, k, v, causal=..., scale=...)`` is run on the given inputs and backpropagated
    with ``grad_out``; so is :func:`plain_attention` in the same dtype, and in float64 on the
    same inputs (cast up) for the reference.

    Args:
        attention: returns the output ``[B, H, N_q, d_v]``, or ``(output, lse)`` to have the
            log-sum-exp judged as well.
        q, k, v: the inputs, as for :func:`plain_attention` (grouped-query ``k``, ``v`` and
            bottom-right causal included), in the dtype to be judged.
        grad_out: ``[B, H, N_q, d_v]``, the gradient flowing into the output; None judges the
            forward alone.
        causal, scale: passed to both implementations.

    Returns:
        One :class:`RuleCheck` per quantity: output, (lse,) and with ``grad_out`` dq, dk, dv.

    Raises:
        TypeError, ValueError: inputs that :func:`plain_attention` rejects, or a ``grad_out``
            not shaped and typed like the output.

    Example:
        >>> q, k, v, g = (torch.randn(1, 1, 40, 16, dtype=torch.float16) for _ in range(4))
        >>> all(check.passed for check in flash_rule(plain_attention, q, k, v, g))
        True
    """
    where = "flash_rule"
    if not callable(attention):
        raise TypeError(f"{where}: attention must be callable, got {type(attention).__name__}")
    check_attention_inputs(where, q, k, v, causal, scale)
    if grad_out is not None:
        grad_out = _validate.floating_tensor(where, "grad_out", grad_out)
        expected = (*q.shape[:3], v.shape[-1])
        if tuple(grad_out.shape) != expected or grad_out.dtype != q.dtype:
            raise ValueError(f"{where}: grad_out must be {q.dtype} {list(expected)} like the output, got "
                             f"{grad_out.dtype} {_validate.shape_str(grad_out)}")
    judged = _outputs_and_gradients(attention, q, k, v, grad_out, causal, scale)
    plain = _outputs_and_gradients(plain_attention, q, k, v, grad_out, causal, scale)
    exact = _outputs_and_gradients(plain_attention, *(t.double() for t in (q, k, v)),
                                   None if grad_out is None else grad_out.double(), causal, scale)
    floor = FLOORS[q.dtype]
    checks = []
    for quantity in FACTORS:
        if quantity not in judged:
            continue
        error = _max_error(judged[quantity], exact[quantity])
        plain_error = _max_error(plain[quantity], exact[quantity])
        checks.append(RuleCheck(quantity, error, plain_error, FACTORS[quantity] * plain_error + floor))
    return checks


def _max_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    error = (got.double() - exact).abs().max().item()
    return math.nan if math.isnan(error) or torch.isnan(got).any() else error


def report_flash_rule(checks: list[RuleCheck], *, label: str = "", dtype: str = "") -> None:
    """Print one line per :class:`RuleCheck`: both errors and whether the kernel is within the rule.

    Args:
        checks: from :func:`flash_rule`.
        label: put in front of every line (e.g. ``"causal=True "``).
        dtype: the dtype's name for the text (e.g. ``"float16"``).

    Example:
        >>> report_flash_rule([RuleCheck("output", 2.8e-4, 3.2e-4, 2 * 3.2e-4 + 1e-5)], dtype="float16")
        output: kernel's max difference 2.8e-04, plain float16 attention's max difference 3.2e-04, within the rule
    """
    plain = f"plain {dtype} attention's" if dtype else "plain attention's"
    for check in checks:
        if not isinstance(check, RuleCheck):
            raise TypeError(f"report_flash_rule: checks must hold RuleCheck, got {type(check).__name__}")
        verdict = "within the rule" if check.passed else f"OUTSIDE the rule (allowed {check.allowed:.1e})"
        print(f"{label}{check.quantity:>6}: kernel's max difference {check.error:.1e}, "
              f"{plain} max difference {check.plain_error:.1e}, {verdict}")
