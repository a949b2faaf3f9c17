"""Check causal attention: no leak of the future, the diagonal kept."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_course.attention import self_attention
from attn_course.checks.attention import attention_inputs
from attn_course.checks.diagnosis import call_student, check_shape, diagnose, same

__all__ = ["check_causal_attention"]


SEES_THE_FUTURE = ("Your attention leaks the future: query i can see keys after i (the upper triangle). "
                   "Keep the lower triangle, diagonal included: causal_mask(n) or torch.tril.")
NO_CAUSAL_MASK = ("Your attention is not causal: every query sees every key, so changing a later token "
                  "changes earlier outputs. Mask the scores with causal_mask(n) before the softmax.")
MISSES_ITSELF = ("Your causal mask also hides the diagonal: a token must be able to attend to itself "
                 "(key j = query i). Use torch.tril (diagonal included), not a strict triangle.")


def check_causal_attention(attention_fn: Callable) -> bool:
    """Check ``fn(q, k, v) -> output`` that must attend causally (``N_q = N_k``).

    Returns:
        ``True`` when correct.

    Raises:
        CheckFailed: naming a leak of the future, a missing mask, a hidden diagonal, or the
            first entry that differs.
    """
    q, k, v, _ = attention_inputs(batched=True)
    k, v = k[..., :5, :], v[..., :5, :]                                  # N_q = N_k = 5
    lower = torch.ones(5, 5, dtype=torch.bool).tril()
    expected, _ = self_attention(q, k, v, lower)
    got = call_student("check_causal_attention", attention_fn, q, k, v)
    check_shape(got, expected, "Your output")
    if not same(got, expected):
        strict_lower = lower.tril(-1)
        strict_lower[0, 0] = True                                       # the first row would be empty
        mistakes = [
            (SEES_THE_FUTURE, self_attention(q, k, v, lower.T)[0]),
            (SEES_THE_FUTURE, self_attention(q, k, v, ~lower.tril(-1))[0]),
            (NO_CAUSAL_MASK, self_attention(q, k, v)[0]),
            (MISSES_ITSELF, self_attention(q, k, v, strict_lower)[0]),
            (MISSES_ITSELF, self_attention(q, k, v, lower.tril(-1))[0]),
        ]
        diagnose(got, expected, mistakes, ("batch", "head", "query", "feature"), "Your output")
    return True
