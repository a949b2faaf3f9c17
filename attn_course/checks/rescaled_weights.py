"""Check chapter 01's fourth exercise: what a factor on the scores does to the weights."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_student, check_shape, diagnose, name_mistake, same

__all__ = ["check_rescaled_weights"]

NOT_FLOATING = "Your result has dtype {dtype}: weights are fractions between 0 and 1, so use a floating dtype."
UNCHANGED = ("Your weights did not change, but multiplying the scores by c = {factor:.3g} does change "
             "them ({what}). Write one weight as exp(s_j) / Σ_k exp(s_k) and see what c · s_j does "
             "to each term.")
WEIGHTS_AS_SCORES = ("You put the weights through a softmax as if they were the scores. They are not: "
                     "a weight is exp(s_j) / Σ_k exp(s_k). What does that tell you about s_j?")
WRONG_WAY = ("Your weights moved the wrong way: multiplying the scores by c = {factor:.3g} {should}, and "
             "yours {did}. Check whether c ends up multiplying or dividing.")
NEARLY = "Close: your weights are proportional to the right ones, but row 0 sums to {total:.4g}, not 1."
ROWS_NOT_ONE = ("Your new weights do not sum to 1 along the last dimension (row 0 sums to {total:.4g}); "
                "whatever the factor, they are one softmax over the keys.")
WRONG_DIM = ("Your new weights sum to 1 along dimension 0, not along the last one: each row (the last "
             "dimension, the keys) is its own softmax.")


def check_rescaled_weights(rescale_fn: Callable[[torch.Tensor, float], torch.Tensor]) -> bool:
    """Check ``fn(weights, factor) -> [..., N]``: softmax weights after the scores are multiplied by ``factor``.

    ``weights`` are softmax outputs ``[3, 6]`` and ``[6]``, ``factor`` 2.0, 8/√6 and 0.5; the answer must equal
    ``softmax(factor · s)`` for the scores ``s`` the weights came from, which the function does not see.

    Raises:
        TypeError: ``rescale_fn`` is not callable.
        CheckFailed: naming the mistake (the weights returned unchanged, the weights put through a
            softmax as if they were scores, the factor applied the wrong way, the right weights
            not normalised, rows that do not sum to 1, a normalisation over the wrong dimension),
            else the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_rescaled_weights(lambda w, c: w ** c)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Close: your weights are proportional to the right ones, but row 0 ...
    """
    where = "check_rescaled_weights"
    generator = torch.Generator().manual_seed(2024)
    for shape in ((3, 6), (6,)):
        scores = torch.randn(*shape, generator=generator, dtype=torch.float64) * 1.5     # [..., N]
        weights = torch.softmax(scores, dim=-1).float()                                  # [..., N]
        for factor in (2.0, 8 / math.sqrt(6), 0.5):
            expected = torch.softmax(factor * scores, dim=-1)                           # [..., N]
            got = call_student(where, rescale_fn, weights, factor)
            if not got.is_floating_point():
                raise CheckFailed(NOT_FLOATING.format(dtype=got.dtype))
            check_shape(got, expected, "Your new weights")
            if not same(got, expected):
                _diagnose_rescaled(got, expected, weights.double(), factor)
    return True


def _diagnose_rescaled(got: torch.Tensor, expected: torch.Tensor, weights: torch.Tensor, factor: float) -> None:
    sharper = factor > 1
    change = "sharpens them: the largest weight grows" if sharper else "flattens them: the largest weight shrinks"
    powered = weights ** factor                                                           # [..., N]
    inverse = weights ** (1 / factor)
    mistakes = [
        (UNCHANGED.format(factor=factor, what=change), weights),
        (WEIGHTS_AS_SCORES, torch.softmax(weights * factor, dim=-1)),
        (WEIGHTS_AS_SCORES, torch.softmax(weights, dim=-1)),
        (WRONG_WAY.format(factor=factor, should="sharpens the weights" if sharper else "flattens the weights",
                          did="got flatter" if sharper else "got sharper"),
         inverse / inverse.sum(dim=-1, keepdim=True)),
    ]
    if got.dim() > 1:
        mistakes.append((WRONG_DIM, powered / powered.sum(dim=0, keepdim=True)))
    finite = torch.nan_to_num(got.double(), nan=0.0)
    name_mistake(finite, mistakes, same)
    row = finite.reshape(-1, finite.shape[-1])[0]
    total = float(row.sum())
    if not math.isclose(total, 1.0, abs_tol=1e-4):
        ratio = finite / expected                                                          # [..., N]
        proportional = torch.allclose(ratio, ratio[..., :1].expand_as(ratio), rtol=1e-4)
        raise CheckFailed((NEARLY if proportional else ROWS_NOT_ONE).format(total=total))
    axes = ("row", "key")[-got.dim():]
    diagnose(got, expected, [], axes, "Your new weights")
