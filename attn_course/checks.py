"""Checks for the exercises that say *what* is wrong, in plain words.

Each check runs a student's function on fresh random inputs, compares the result with
the package's reference implementation and, when they differ, tries the mistakes
students really make (softmax over the wrong axis, no scaling, the wrong scaling, an
inverted mask, a mask applied after the softmax, heads split without a transpose, a
softmax that overflows, a causal mask that shows the future or hides the diagonal).
The first mistake that reproduces the student's result is named in the error;
otherwise the error points at the first entry that differs.

A check returns ``True`` when the function is right and raises :class:`CheckFailed`
(an ``AssertionError``) with the diagnosis otherwise, so an exercise's test cell is a
single line such as ``check_softmax(stable_softmax)``.

:func:`report_difference` is the chapters' one way of saying how close a result is to an
independent reference ("max difference 4.5e-08, within the tolerance 1e-05").
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attn_course import _validate
from attn_course.attention import self_attention

__all__ = [
    "CheckFailed",
    "check_softmax",
    "check_attention",
    "check_attention_weights",
    "check_split_heads",
    "check_causal_attention",
    "check_close",
    "report_difference",
]

ATOL = 1e-5


class CheckFailed(AssertionError):
    """An exercise's answer is wrong; the message says how."""


def _call(where: str, fn: Callable, *args) -> torch.Tensor:
    """Call the student's function, unwrap ``(output, weights)``, insist on a tensor."""
    if not callable(fn):
        raise TypeError(f"{where}: expected your function, got {type(fn).__name__}")
    try:
        result = fn(*args)
    except CheckFailed:
        raise
    except Exception as error:  # the student's code crashed: say where, keep the cause
        raise CheckFailed(
            f"Your function raised {type(error).__name__}: {error}. It was called with "
            + ", ".join(f"a tensor of shape {list(a.shape)}" if isinstance(a, torch.Tensor) else repr(a)
                        for a in args)
            + "."
        ) from error
    if isinstance(result, tuple):
        result = result[0]
    if result is Ellipsis or result is None:
        raise CheckFailed("Your function returns nothing yet: replace the `...` with your code.")
    if not isinstance(result, torch.Tensor):
        raise CheckFailed(
            f"Your function should return a torch.Tensor, but it returned {type(result).__name__}."
        )
    return result


def _same(got: torch.Tensor, expected: torch.Tensor) -> bool:
    if got.shape != expected.shape:
        return False
    return torch.allclose(got.double(), expected.double(), atol=ATOL, rtol=1e-4)


def _first_difference(got: torch.Tensor, expected: torch.Tensor, axes: tuple[str, ...]) -> str:
    """Describe the first entry where two same-shape tensors differ."""
    bad = ~torch.isclose(got.double(), expected.double(), atol=ATOL, rtol=1e-4)
    index = tuple(int(i) for i in bad.nonzero()[0])
    names = axes[-len(index):] if len(axes) >= len(index) else ("",) * len(index)
    where = ", ".join(f"{name} {i}" if name else str(i) for name, i in zip(names, index))
    return (
        f"The first entry that differs is at [{where}]: expected {expected[index].item():.4f}, "
        f"got {got[index].item():.4f}."
    )


def _check_shape(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if got.shape != expected.shape:
        raise CheckFailed(
            f"{what} has shape {list(got.shape)} but should have shape {list(expected.shape)}."
        )


def _diagnose(got: torch.Tensor, expected: torch.Tensor, mistakes: list[tuple[str, torch.Tensor]],
              axes: tuple[str, ...], what: str) -> None:
    """Raise with the first known mistake that reproduces ``got``, else the first difference."""
    # A mistake can also show up as NaN (e.g. a row with nothing to attend to): compare as 0.
    finite_got = torch.nan_to_num(got, nan=0.0)
    for hint, mistaken in mistakes:
        if _same(finite_got, mistaken):
            raise CheckFailed(hint)
    if torch.isnan(got).any() and not torch.isnan(expected).any():
        raise CheckFailed(f"{what} contains NaN where the reference has numbers. "
                          + _first_difference(torch.nan_to_num(got, nan=float("inf")), expected, axes))
    raise CheckFailed(f"{what} differs from the reference. " + _first_difference(got, expected, axes))


# --- softmax ---------------------------------------------------------------------------

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
    got = _call("check_softmax", softmax_fn, scores.clone())
    _check_shape(got, expected, "Your softmax's output")
    if not _same(got, expected):
        row_sums = got.sum(dim=-1)
        detail = f"row 0 of batch 0 sums to {row_sums[0, 0].item():.3f}."
        for dim in (0, 1):
            if _same(got, torch.softmax(scores, dim=dim)):
                detail = (f"it sums to 1 along dimension {dim}, while row 0 of batch 0 "
                          f"sums to {row_sums[0, 0].item():.3f}.")
        mistakes = [(WRONG_DIM.format(detail=detail), torch.softmax(scores, dim=dim)) for dim in (0, 1)]
        _diagnose(got, expected, mistakes, ("batch", "row", "column"), "Your softmax")
    large = scores * 300                                                 # scores up to ~3000
    got_large = _call("check_softmax", softmax_fn, large.clone())
    if not torch.isfinite(got_large).all():
        raise CheckFailed(OVERFLOW.format(big=large.abs().max().item()))
    if not _same(got_large, torch.softmax(large, dim=-1)):
        _diagnose(got_large, torch.softmax(large, dim=-1), [], ("batch", "row", "column"),
                  "Your softmax on large scores")
    return True


# --- attention -------------------------------------------------------------------------

NO_SCALING = ("You forgot the scaling: your result equals softmax(Q Kᵀ) V. Divide the scores by "
              "√d_k (here √{d_k} = {sqrt_d_k:g}) before the softmax.")
SCALED_BY_D_K = ("You divided the scores by d_k = {d_k}; divide by its square root, √d_k = {sqrt_d_k:g}.")
SCALED_BY_D_MODEL = ("You scaled by √d_model = √{d_model} (all {heads} heads together) instead of the "
                     "head dimension: divide by √d_k = √{d_k}, where d_k = q.shape[-1] is one head's size.")
SOFTMAX_OVER_QUERIES = ("Your softmax runs over the wrong dimension (the queries, dim=-2): each query's "
                        "weights over the keys must sum to 1, so use dim=-1.")
INVERTED_MASK = ("Your mask is inverted: in this course (and in PyTorch) True means 'may attend'. "
                 "Fill the scores where the mask is False, e.g. scores.masked_fill(~mask, float('-inf')).")
MASK_AFTER_SOFTMAX = ("You applied the mask after the softmax: the blocked weights are 0 but the remaining "
                      "ones no longer sum to 1. Mask the scores (with -inf) before the softmax.")


def _attention_inputs(batched: bool, d_k: int = 16, d_v: int = 8):
    batch = (2, 3) if batched else ()                                   # [B, H] or nothing
    q = torch.randn(*batch, 5, d_k)                                     # [B, H, N_q, d_k]
    k = torch.randn(*batch, 7, d_k)                                     # [B, H, N_k, d_k]
    v = torch.randn(*batch, 7, d_v)                                     # [B, H, N_k, d_v]
    mask = torch.rand(5, 7) > 0.4                                       # [N_q, N_k]
    mask[:, 0], mask[:, 1] = True, False      # each row keeps and blocks at least one key
    return q, k, v, mask


def _attention_mistakes(q, k, v, mask) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(output, weights) that each known mistake would produce."""
    d_k = q.shape[-1]
    scalings = [(NO_SCALING, 1.0), (SCALED_BY_D_K, 1.0 / d_k)]
    heads = q.shape[-3] if q.dim() >= 3 else 1
    if heads > 1:
        scalings.append((SCALED_BY_D_MODEL, 1.0 / math.sqrt(heads * d_k)))
    facts = {"d_k": d_k, "sqrt_d_k": math.sqrt(d_k), "d_model": heads * d_k, "heads": heads}
    mistakes = {}
    for hint, scale in scalings:
        mistakes[hint.format(**facts)] = self_attention(q, k, v, mask, scale=scale)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        scores_masked = scores.masked_fill(~mask, float("-inf"))
        over_queries = torch.softmax(scores_masked, dim=-2)
        mistakes[INVERTED_MASK] = self_attention(q, k, v, ~mask)
        after = torch.softmax(scores, dim=-1) * mask
        mistakes[MASK_AFTER_SOFTMAX] = (after @ v, after)
    else:
        over_queries = torch.softmax(scores, dim=-2)
    mistakes[SOFTMAX_OVER_QUERIES] = (over_queries @ v, over_queries)
    return mistakes


def _one_query_at_a_time(fn: Callable) -> Callable:
    """Turn ``fn(q [d_k], k, v) -> [d_v]`` into ``fn(q [N_q, d_k], k, v) -> [N_q, d_v]``."""

    def all_queries(q, k, v):
        return torch.stack([_call("check_attention", fn, row, k, v) for row in q])

    return all_queries


def check_attention(
    attention_fn: Callable, *, with_mask: bool = False, batched: bool = True, one_query: bool = False
) -> bool:
    """Check a scaled dot-product attention function against :func:`self_attention`.

    Args:
        attention_fn: ``fn(q, k, v)`` (or ``fn(q, k, v, mask)`` when ``with_mask``) returning
            the output ``[..., N_q, d_v]``, or ``(output, weights)``. ``mask`` is boolean,
            ``True`` = may attend.
        with_mask: also pass a boolean mask ``[N_q, N_k]``.
        batched: inputs carry batch and head dimensions ``[B, H, N, d]``; ``False`` for a
            function written for plain ``[N, d]`` matrices.
        one_query: the function takes a single query vector ``q [d_k]`` with ``k [N_k, d_k]``
            and ``v [N_k, d_v]``; it is called once per query.

    Returns:
        ``True`` when correct.

    Raises:
        CheckFailed: naming the mistake (no scaling, scaling by d_k or by d_model, softmax
            over the wrong dimension, inverted mask, mask after the softmax, overflow), or
            the first entry that differs.
    """
    if one_query:
        if with_mask:
            raise ValueError("check_attention: one_query and with_mask cannot be combined")
        batched, attention_fn = False, _one_query_at_a_time(attention_fn)

    q, k, v, mask = _attention_inputs(batched)
    mask = mask if with_mask else None
    args = (q, k, v) if mask is None else (q, k, v, mask)
    expected, _ = self_attention(*args)
    got = _call("check_attention", attention_fn, *args)
    _check_shape(got, expected, "Your output")
    if not _same(got, expected):
        mistakes = [(hint, output) for hint, (output, _) in _attention_mistakes(q, k, v, mask).items()]
        _diagnose(got, expected, mistakes, ("batch", "head", "query", "feature"), "Your output")
    large = (q * 40, k * 40, v) + (() if mask is None else (mask,))     # scores in the thousands
    got_large = _call("check_attention", attention_fn, *large)
    if not torch.isfinite(got_large).all():
        raise CheckFailed(OVERFLOW.format(big=(large[0] @ large[1].transpose(-2, -1)).abs().max().item()
                                          / math.sqrt(q.shape[-1])))
    return True


def check_attention_weights(weights_fn: Callable, *, batched: bool = True) -> bool:
    """Check a function ``fn(q, k) -> attention_weights [..., N_q, N_k]``.

    Args:
        weights_fn: the function to check.
        batched: inputs carry batch and head dimensions; ``False`` for plain ``[N, d]`` matrices.

    Returns:
        ``True`` when correct.

    Raises:
        CheckFailed: naming the mistake or the first differing weight.
    """
    q, k, v, _ = _attention_inputs(batched)
    _, expected = self_attention(q, k, v)
    got = _call("check_attention_weights", weights_fn, q, k)
    _check_shape(got, expected, "Your attention weights")
    if not _same(got, expected):
        mistakes = [(hint, weights) for hint, (_, weights) in _attention_mistakes(q, k, v, None).items()]
        _diagnose(got, expected, mistakes, ("batch", "head", "query", "key"), "Your attention weights")
    return True


# --- causal attention -------------------------------------------------------------------

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
    q, k, v, _ = _attention_inputs(batched=True)
    k, v = k[..., :5, :], v[..., :5, :]                                  # N_q = N_k = 5
    lower = torch.ones(5, 5, dtype=torch.bool).tril()
    expected, _ = self_attention(q, k, v, lower)
    got = _call("check_causal_attention", attention_fn, q, k, v)
    _check_shape(got, expected, "Your output")
    if not _same(got, expected):
        strict_lower = lower.tril(-1)
        strict_lower[0, 0] = True                                       # the first row would be empty
        mistakes = [
            (SEES_THE_FUTURE, self_attention(q, k, v, lower.T)[0]),
            (SEES_THE_FUTURE, self_attention(q, k, v, ~lower.tril(-1))[0]),
            (NO_CAUSAL_MASK, self_attention(q, k, v)[0]),
            (MISSES_ITSELF, self_attention(q, k, v, strict_lower)[0]),
            (MISSES_ITSELF, self_attention(q, k, v, lower.tril(-1))[0]),
        ]
        _diagnose(got, expected, mistakes, ("batch", "head", "query", "feature"), "Your output")
    return True


# --- any tensor answer ------------------------------------------------------------------


def check_close(got: object, expected: torch.Tensor, *, what: str = "Your answer", hint: str = "",
                rtol: float = 1e-4, atol: float = ATOL) -> bool:
    """Compare an answer with an expected tensor; on failure say where, and give a hint.

    Args:
        got: the student's answer (a tensor, or something convertible such as a float).
        expected: the reference, computed independently of the answer.
        what: how to name the answer in the message.
        hint: a sentence that nudges towards the idea, shown on failure.
        rtol, atol: tolerances as in ``torch.allclose``.

    Returns:
        ``True`` when close.

    Raises:
        CheckFailed: with the shape mismatch or the first differing entry, then the hint.
    """
    if got is Ellipsis or got is None:
        raise CheckFailed(f"{what} is not there yet: replace the `...` with your code.")
    if not isinstance(got, torch.Tensor):
        try:
            got = torch.as_tensor(got, dtype=expected.dtype)
        except (TypeError, ValueError, RuntimeError):
            raise CheckFailed(f"{what} should be a tensor, got {type(got).__name__}.") from None
    got = got.reshape(expected.shape) if got.numel() == expected.numel() == 1 else got
    _check_shape(got, expected, what)
    if not torch.allclose(got.double(), expected.double(), rtol=rtol, atol=atol):
        axes = ("",) * expected.dim()
        message = f"{what} is not right. " + (
            _first_difference(got, expected, axes) if expected.dim() else
            f"Expected about {expected.item():.4g}, got {got.item():.4g}."
        )
        raise CheckFailed(message + (f" Hint: {hint}" if hint else ""))
    return True


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


# --- splitting into heads --------------------------------------------------------------

VIEW_WITHOUT_TRANSPOSE = (
    "You reshaped [B, N, E] straight to [B, H, N, d] with view/reshape. That scrambles tokens and heads: "
    "each 'head' now holds pieces of several tokens. Reshape to [B, N, H, d] first, then "
    "transpose(1, 2) to get [B, H, N, d]."
)
NO_TRANSPOSE_SHAPE = (
    "Your result has shape [B, N, H, d] = {shape}: you split the heads but did not move the head axis "
    "in front of the tokens. Add .transpose(1, 2) to get [B, H, N, d]."
)


def check_split_heads(split_fn: Callable[[torch.Tensor, int], torch.Tensor]) -> bool:
    """Check ``fn(x [B, N, E], num_heads) -> [B, H, N, E / H]``.

    Returns:
        ``True`` when correct.

    Raises:
        CheckFailed: naming a view without transpose, a missing transpose, or the first difference.
    """
    batch, tokens, heads, head_dim = 2, 5, 4, 3
    x = torch.randn(batch, tokens, heads * head_dim)                     # [B, N, E]
    expected = x.view(batch, tokens, heads, head_dim).transpose(1, 2)   # [B, H, N, d]
    got = _call("check_split_heads", split_fn, x.clone(), heads)
    if got.shape == (batch, tokens, heads, head_dim):
        raise CheckFailed(NO_TRANSPOSE_SHAPE.format(shape=list(got.shape)))
    _check_shape(got, expected, "Your split")
    if not _same(got, expected):
        mistakes = [(VIEW_WITHOUT_TRANSPOSE, x.reshape(batch, heads, tokens, head_dim))]
        _diagnose(got, expected, mistakes, ("batch", "head", "token", "feature"), "Your split")
    return True
