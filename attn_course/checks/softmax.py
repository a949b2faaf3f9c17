"""Check a softmax: the right dimension, and no overflow on large scores."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_student, check_shape, diagnose, same

__all__ = ["check_softmax", "WRONG_DIM", "OVERFLOW"]


WRONG_DIM = ("Your softmax normalises over the wrong dimension: {detail} The weights of each query "
             "(each row, the last dimension) must sum to 1; use dim=-1.")
OVERFLOW = ("Your softmax overflows on large scores: exp({big:.0f}) is inf in float32, so the result "
            "has inf/NaN. Subtract each row's maximum before exponentiating; it does not change the "
            "result, because softmax(x - c) = softmax(x).")


def check_softmax(softmax_fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Check a softmax over the last dimension, including numerical stability.

    Args:
        softmax_fn: maps scores ``[..., N]`` to weights ``[..., N]``.

    Returns:
        ``True`` when correct.

    Raises:
        CheckFailed: with a diagnosis (wrong dimension, overflow, shape, first difference).
    """
    scores = torch.randn(2, 3, 6) * 3                                   # [B, N_q, N_k]
    expected = torch.softmax(scores, dim=-1)
    got = call_student("check_softmax", softmax_fn, scores.clone())
    check_shape(got, expected, "Your softmax's output")
    if not same(got, expected):
        row_sums = got.sum(dim=-1)
        detail = f"row 0 of batch 0 sums to {row_sums[0, 0].item():.3f}."
        for dim in (0, 1):
            if same(got, torch.softmax(scores, dim=dim)):
                detail = (f"it sums to 1 along dimension {dim}, while row 0 of batch 0 "
                          f"sums to {row_sums[0, 0].item():.3f}.")
        mistakes = [(WRONG_DIM.format(detail=detail), torch.softmax(scores, dim=dim)) for dim in (0, 1)]
        diagnose(got, expected, mistakes, ("batch", "row", "column"), "Your softmax")
    large = scores * 300                                                 # scores up to ~3000
    got_large = call_student("check_softmax", softmax_fn, large.clone())
    if not torch.isfinite(got_large).all():
        raise CheckFailed(OVERFLOW.format(big=large.abs().max().item()))
    if not same(got_large, torch.softmax(large, dim=-1)):
        diagnose(got_large, torch.softmax(large, dim=-1), [], ("batch", "row", "column"),
                  "Your softmax on large scores")
    return True
