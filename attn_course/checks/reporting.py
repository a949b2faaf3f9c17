"""How the chapters report a comparison with an independent reference, in one sentence."""

from __future__ import annotations

import math

import torch

from attn_course import _validate

__all__ = ["report_difference"]


def report_difference(name: str, got: torch.Tensor, expected: torch.Tensor, *, tol: float = 1e-5) -> None:
    """Print the largest absolute difference between ``got`` and a reference, and whether it is within ``tol``.

    The difference is taken in float64, so a half-precision result is judged by its own error
    and not by the subtraction's. The line reads, e.g.,
    ``self_attention vs PyTorch: max difference 4.5e-08, within the tolerance 1e-05``; a NaN
    anywhere gives ``max difference nan, above the tolerance``.

    Args:
        name: what is compared with what.
        got: the result, any shape.
        expected: the reference, the same shape (no broadcasting: a shape mismatch is a bug).
        tol: the largest difference that counts as agreement.

    Raises:
        TypeError: ``name`` not a string, or ``got``/``expected`` not tensors.
        ValueError: shapes that differ, or a ``tol`` that is not a positive finite number.

    Example:
        >>> report_difference("a vs b", torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]), tol=0.1)
        a vs b: max difference 5.0e-01, above the tolerance 1e-01
    """
    where = "report_difference"
    if not isinstance(name, str):
        raise TypeError(f"{where}: name must be a str, got {type(name).__name__}")
    got = _validate.tensor(where, "got", got)
    expected = _validate.tensor(where, "expected", expected)
    tol = _validate.positive_finite(where, "tol", tol)
    if got.shape != expected.shape:
        raise ValueError(f"{where}: got {_validate.shape_str(got)} and expected {_validate.shape_str(expected)} "
                         f"must have one shape")
    difference = (got.detach().double() - expected.detach().double().to(got.device)).abs()
    value = difference.max().item() if difference.numel() else 0.0
    if difference.isnan().any():
        value = math.nan
    verdict = "within" if value <= tol else "above"
    print(f"{name}: max difference {value:.1e}, {verdict} the tolerance {tol:.0e}")
