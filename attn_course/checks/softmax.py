"""Check chapter 02's softmax: the right dimension, and no overflow or underflow on large scores."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_student, check_shape, diagnose, same, watched
from attn_course.checks.forbidden import Forbidden, forbid

__all__ = ["check_softmax", "large_scores", "diagnose_non_finite", "WRONG_DIM", "OVERFLOW", "GLOBAL_SHIFT",
           "NON_FINITE"]

IGNORES_INPUT = ("Your softmax returns {value:.4g} everywhere, whatever the scores: it ignores its input. "
                 "Each weight must come from its scores: exp of the score, divided by the row's sum of exps.")
WRONG_DIM = ("Your softmax normalises over the wrong dimension: {detail} The weights of each query "
             "(each row, the last dimension) must sum to 1; use dim=-1.")
OVERFLOW = ("Your softmax overflows on large scores: exp({big:.0f}) is inf in float32 (so is the exp of "
            "anything above 88.7), so the result has inf/NaN. Subtract each row's maximum before "
            "exponentiating; it does not change the result, because softmax(x - c) = softmax(x).")
GLOBAL_SHIFT = ("Your softmax gives NaN on large scores, in the rows whose scores all lie far below the "
                "largest score of the whole tensor ({big:.0f}): you subtracted one maximum for the whole "
                "tensor, not each row's own. In a row whose largest score is {gap:.0f} below it, every "
                "exp rounds to 0 in float32, and 0/0 is NaN. Subtract each row's maximum: "
                "scores.amax(dim=-1, keepdim=True).")
NON_FINITE = ("Your softmax gives inf/NaN on large scores (row {row} here, whose scores reach {big:.0f}): "
              "an exp above 88.7 overflows to inf in float32, and a row whose every exp rounds to 0 "
              "gives 0/0. Subtract each row's own maximum before exponentiating.")


def large_scores(shape: tuple[int, ...] = (2, 3, 6)) -> torch.Tensor:
    """Fresh scores ``[..., rows, N]`` spread over about ±900 within a row (a plain ``exp`` overflows), the
    rows at offsets 0, -4000 and +4000 (one maximum for the whole tensor underflows most rows)."""
    scores = torch.randn(*shape) * 300
    offsets = torch.tensor([0.0, -4000.0, 4000.0]).repeat(shape[-2] // 3 + 1)[: shape[-2]]
    return scores + offsets[:, None]


def _bad_rows(result: torch.Tensor) -> torch.Tensor:
    """``[..., rows]``: True where a row of ``result`` holds inf or NaN."""
    return ~torch.isfinite(result).all(dim=-1)


def diagnose_non_finite(got: torch.Tensor, scores: torch.Tensor) -> None:
    """Raise :class:`CheckFailed` naming why ``got``, whose rows follow those of ``scores [..., rows, N]``
    (weights or an attention output), has inf/NaN rows: its bad rows are compared with those of a plain
    ``exp`` and of one maximum subtracted for the whole tensor, in float32. Silent if ``got`` is finite."""
    bad = _bad_rows(got)
    if not bad.any():
        return
    scores = scores.float()
    exps = torch.exp(scores)
    plain_bad = _bad_rows(exps / exps.sum(dim=-1, keepdim=True))
    shifted = torch.exp(scores - scores.max())
    global_bad = _bad_rows(shifted / shifted.sum(dim=-1, keepdim=True))
    if not (bad & ~global_bad).any():
        gap = (scores.max() - scores.amax(dim=-1))[bad].min().item()
        raise CheckFailed(GLOBAL_SHIFT.format(big=scores.max().item(), gap=gap))
    if not (bad & ~plain_bad).any():
        raise CheckFailed(OVERFLOW.format(big=scores.amax(dim=-1)[bad].max().item()))
    row = tuple(int(i) for i in bad.nonzero()[0])
    finite = scores[row].masked_fill(~torch.isfinite(scores[row]), 0.0)
    raise CheckFailed(NON_FINITE.format(row=list(row), big=finite.abs().max().item()))


#: What chapter 02's softmax exercise may not call: the exercise is to write it.
SOFTMAX_RULES = (
    Forbidden("torch.softmax", "the exercise is to write softmax yourself, from exp, max and sum"),
    *forbid("the exercise is to write softmax yourself, not to call the course's",
            "attn_course.core.attention.softmax_with_empty_rows", "attn_course.flash.tiled.online_softmax"),
)


def check_softmax(softmax_fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(scores [..., N]) -> weights [..., N]``, a softmax over the last dimension.

    Called on fresh scores ``[2, 3, 6]``, then on scores in the thousands (:func:`large_scores`), whose
    true softmax is finite, then on one row of scores ``[7]``.

    Raises:
        CheckFailed: with a diagnosis (a call of ``torch.softmax``, ``F.softmax`` or
            ``Tensor.softmax``, which :data:`SOFTMAX_RULES` forbid; wrong dimension; overflow
            of a plain exp; one maximum subtracted for the whole tensor, so rows underflow and
            give 0/0; shape; first difference).

    Example (a wrong answer, and what it is told):
        >>> check_softmax(lambda scores: torch.softmax(scores, dim=-1))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_softmax: your answer calls torch.softmax, which this ...
    """
    softmax_fn = watched("check_softmax", softmax_fn, SOFTMAX_RULES)
    scores = torch.randn(2, 3, 6) * 3                                   # [B, N_q, N_k]
    expected = torch.softmax(scores, dim=-1)
    got = call_student("check_softmax", softmax_fn, scores)
    check_shape(got, expected, "Your softmax's output")
    if not same(got, expected):
        if got.numel() and torch.all(got == got.flatten()[0]):
            raise CheckFailed(IGNORES_INPUT.format(value=got.flatten()[0].item()))
        row_sums = got.sum(dim=-1)
        rows_sum_to_one = torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-4)
        for dim in (0, 1):
            sums = got.sum(dim=dim)
            if not rows_sum_to_one and torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
                raise CheckFailed(WRONG_DIM.format(
                    detail=f"it sums to 1 along dimension {dim}, while row 0 of batch 0 sums to "
                           f"{row_sums[0, 0].item():.3f}."))
        diagnose(got, expected, [], ("batch", "row", "column"), "Your softmax")
    large = large_scores()
    got_large = call_student("check_softmax", softmax_fn, large)
    check_shape(got_large, large, "Your softmax's output")
    diagnose_non_finite(got_large, large)
    diagnose(got_large, torch.softmax(large, dim=-1), [], ("batch", "row", "column"), "Your softmax on large scores")
    single = torch.randn(7) * 3                                         # [N]: one dimension, as promised
    got_single = call_student("check_softmax", softmax_fn, single)
    check_shape(got_single, single, "Your softmax's output for one row of scores [7]")
    diagnose(got_single, torch.softmax(single, dim=-1), [], ("column",), "Your softmax of one row [7]")
    return True
