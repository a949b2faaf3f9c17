"""Check chapter 11's score exercises: induction and previous-token scores read off attention patterns, and
the classmate's induction scores fixed (the ablation prediction: :mod:`attn_course.checks.circuits_ablation`).
The references are written out here in float64, not :mod:`attn_course.circuits`, which the answers may not
call; patterns come from a private generator."""

from __future__ import annotations

import numbers
from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_answer, diagnose, watched
from attn_course.checks.forbidden import forbid

__all__ = ["check_induction_score", "check_previous_token_detector", "check_fixed_induction_scores", "stripe_mean"]

#: What the score exercises may not call: the course's own scores.
SCORE_RULES = forbid("the exercise is to read the score off the pattern yourself",
                     "attn_course.circuits.scores.induction_score",
                     "attn_course.circuits.scores.previous_token_score",
                     "attn_course.circuits.scores.duplicate_token_score")
EARLIER_COPY = ("Your score reads pattern[..., i, i − period]: the earlier copy of token i itself (a "
                "duplicate-token head looks there). An induction head attends to the token *after* that copy, "
                "the one that came next last time: key i − period + 1.")
FIRST_COPY_INCLUDED = ("Your mean includes i = period − 1, where the diagonal i − period + 1 begins: that query "
                       "is still in the first copy (token i has no earlier copy yet). Average over "
                       "i = period … N − 1 only, N − period entries.")
TOO_LATE = ("Your score reads pattern[..., i, i − period + 2], one past the right key: the token after the "
            "earlier copy of token i is at i − period + 1.")
TOO_EARLY = ("Your score reads pattern[..., i, i − period − 1], one further back than the earlier copy: the "
             "+1 goes the other way, to i − period + 1.")
TRANSPOSED = ("Your score reads the pattern transposed, pattern[..., j, i]: rows are queries and columns keys, "
              "so query i's weight on key j is pattern[..., i, j].")
SUMMED = "Your score is the sum of the right entries; the score is their mean."
OVER_ALL_ROWS = ("You divided by N, as if every query counted; the mean is over the {count} queries that have "
                 "the key in question ({positions}), so divide by {count}.")
HALF_FOR_PERIOD = ("Your score is right when period = N // 2, but here N = {n} and period = {period}: use the "
                   "period you are given, not half the length.")
SELF_DIAGONAL = ("Your score reads the diagonal, pattern[..., i, i]: each token's weight on itself. A previous-token "
                 "head attends to key i − 1.")
NEXT_TOKEN = ("Your score reads pattern[..., i − 1, i]: key i seen from query i − 1, the pattern transposed (in "
              "a causal pattern those entries are 0). Query i's weight on the previous token is "
              "pattern[..., i, i − 1].")
TWO_BACK = "Your score reads pattern[..., i, i − 2], two tokens back; the previous token is i − 1."
WRAPPED = ("Your mean includes i = 0, whose 'previous token' wrapped around to the last key (torch.roll does "
           "that): token 0 has no previous token. Average over i = 1 … N − 1.")
ONE_NUMBER = ("Your answer is one number for the whole tensor: return one score per leading index (per head, "
              "per sequence), shape {shape}.")
ENTRIES_NOT_AVERAGED = ("Your answer has one entry per query position, shape {got}: average over the positions, "
                        "to shape {shape}.")
NOT_A_NUMBER = "Your answer should be a tensor of scores (or a number for one [N, N] pattern), got {what}."
CLASSMATE = ("These are the classmate's scores, unchanged: pattern[..., i, i − period] is the earlier copy of "
             "token i itself, not the token after it.")
OVER_HEADS = ("Your scores have shape {got} = [L, B]: you averaged over the heads (dim 2) and kept the batch. "
              "Average over the batch (dim 1) and keep one score per head, [L, H] = {shape}.")
BATCH_KEPT = ("Your scores have shape {got} = [L, B, H]: average over the batch too (dim 1), to one score per "
              "head, [L, H] = {shape}.")


def stripe_mean(pattern: torch.Tensor, back: int, start: int, *, divisor: int | None = None,
                transposed: bool = False) -> torch.Tensor:
    """``Σ_{i ≥ start} pattern[..., i, i − back] / divisor`` in float64 (default divisor: the count, ``N − start``),
    or of ``pattern[..., i − back, i]`` when ``transposed``; ``pattern`` is ``[..., N, N]``, the result ``[...]``.

    Raises:
        ValueError: a pattern that is not square, or a start that reads before key 0.

    Example:
        >>> stripe_mean(torch.eye(4), 0, 1)            # the diagonal, queries 1, 2, 3
        tensor(1., dtype=torch.float64)
    """
    n = pattern.shape[-1]
    if pattern.dim() < 2 or pattern.shape[-2] != n:
        raise ValueError(f"stripe_mean: pattern must be [..., N, N], got {list(pattern.shape)}")
    if not 0 <= back <= start <= n:
        raise ValueError(f"stripe_mean: start {start} and back {back} read outside [0, {n})")
    weights = pattern.detach().double()
    if transposed:
        weights = weights.transpose(-2, -1)
    queries = torch.arange(start, n)
    total = weights[..., queries, queries - back].sum(dim=-1)           # [...]
    return total / (len(queries) if divisor is None else divisor)


def _patterns(shape: tuple[int, ...], *, causal: bool, generator: torch.Generator,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random attention weights ``shape = [..., N, N]``, a softmax of random scores."""
    scores = 2.0 * torch.randn(shape, generator=generator, dtype=torch.float64)
    if causal:
        n = shape[-1]
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, dim=-1).to(dtype)


def _scores(got: object, expected: torch.Tensor, n: int, entries: int) -> torch.Tensor:
    """The answer as a tensor of ``expected``'s shape, or the failure that says what it is instead."""
    if isinstance(got, numbers.Real) and not isinstance(got, bool):
        got = torch.tensor(float(got), dtype=torch.float64)
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(NOT_A_NUMBER.format(what=f"a {type(got).__name__}"))
    if got.shape == expected.shape:
        return got
    if got.numel() == 1 and expected.numel() == 1:
        return got.reshape(expected.shape)
    shape = list(expected.shape)
    if got.dim() == 0 and expected.dim() > 0:
        raise CheckFailed(ONE_NUMBER.format(shape=shape))
    if tuple(got.shape[:-1]) == tuple(expected.shape) and got.shape[-1] in (n, entries, entries + 1):
        raise CheckFailed(ENTRIES_NOT_AVERAGED.format(got=list(got.shape), shape=shape))
    return got                                               # diagnose() names the shapes


def _run(where: str, fn: Callable, pattern: torch.Tensor, *args) -> object:
    described = ", ".join([f"a pattern of shape {list(pattern.shape)} ({pattern.dtype})",
                           *(f"period={a}" for a in args)])
    return call_answer(where, fn, pattern, *args, described=described)


def _induction_mistakes(pattern: torch.Tensor, period: int) -> list[tuple[str, torch.Tensor]]:
    n = pattern.shape[-1]
    count = n - period
    mistakes = [(EARLIER_COPY, stripe_mean(pattern, period, period)),
                (FIRST_COPY_INCLUDED, stripe_mean(pattern, period - 1, period - 1)),
                (TRANSPOSED, stripe_mean(pattern, period - 1, period, transposed=True)),
                (SUMMED, stripe_mean(pattern, period - 1, period, divisor=1)),
                (OVER_ALL_ROWS.format(count=count, positions=f"i = {period} … {n - 1}"),
                 stripe_mean(pattern, period - 1, period, divisor=n))]
    if period >= 2:
        mistakes.append((TOO_LATE, stripe_mean(pattern, period - 2, period)))
    if period + 1 < n:
        mistakes.append((TOO_EARLY, stripe_mean(pattern, period + 1, period + 1)))
    if n // 2 != period:
        mistakes.append((HALF_FOR_PERIOD.format(n=n, period=period), stripe_mean(pattern, n // 2 - 1, n // 2)))
    return mistakes


#: (shape, causal, period, dtype): leading dims and none, a period that is not half the length, period 1.
INDUCTION_CASES = (((2, 3, 12, 12), False, 5, torch.float32), ((4, 10, 10), True, 5, torch.float32),
                   ((7, 7), False, 3, torch.float64), ((2, 6, 6), False, 1, torch.float32))


def check_induction_score(score_fn: Callable, *, seed: int = 0) -> bool:
    """Check ``fn(pattern [..., N, N], period) -> [...]``: the induction score of every head, the mean over
    ``i = period … N − 1`` of ``pattern[..., i, i − period + 1]``. Tried on patterns with two, one and no
    leading dims, causal and not, periods half the length and not, and period 1.

    Raises:
        CheckFailed: naming the earlier copy itself (``i − period``), ``i = period − 1`` included, one
            key too late or too early, a transposed pattern, a sum, a division by ``N``, ``N // 2`` for
            the period, one number for all heads, entries not averaged, or the first score that differs.

    Example (a wrong answer, and what it is told):
        >>> check_induction_score(lambda pattern, period: pattern.diagonal(-period, -2, -1).mean(-1))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your score reads pattern[..., i, i − period]: the earlier copy ...
    """
    where = "check_induction_score"
    score_fn = watched(where, score_fn, SCORE_RULES)
    generator = torch.Generator().manual_seed(seed)
    for shape, causal, period, dtype in INDUCTION_CASES:
        pattern = _patterns(shape, causal=causal, generator=generator, dtype=dtype)
        expected = stripe_mean(pattern, period - 1, period)                  # [...]
        got = _scores(_run(where, score_fn, pattern, period), expected, shape[-1], shape[-1] - period)
        diagnose(got, expected, _induction_mistakes(pattern, period), ("",) * expected.dim(), "Your score")
    return True


def _previous_token_mistakes(pattern: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    n = pattern.shape[-1]
    wrapped = (stripe_mean(pattern, 1, 1, divisor=1) + pattern.double()[..., 0, n - 1]) / n
    return [(SELF_DIAGONAL, stripe_mean(pattern, 0, 0)), (SELF_DIAGONAL, stripe_mean(pattern, 0, 1)),
            (NEXT_TOKEN, stripe_mean(pattern, 1, 1, transposed=True)), (WRAPPED, wrapped),
            (TWO_BACK, stripe_mean(pattern, 2, 2)), (SUMMED, stripe_mean(pattern, 1, 1, divisor=1)),
            (OVER_ALL_ROWS.format(count=n - 1, positions=f"i = 1 … {n - 1}"), stripe_mean(pattern, 1, 1, divisor=n))]


#: (shape, causal, dtype)
DIAGONAL_DIMS = ("Your diagonal runs over the wrong dimensions: pattern.diagonal(-1) takes dims 0 and 1 unless told "
                 "otherwise, and with leading dims those are not the queries and keys but the layers or heads. "
                 "pattern.diagonal(-1, dim1=-2, dim2=-1) takes each [N, N] pattern's stripe i, i − 1.")
PREVIOUS_TOKEN_CASES = (((2, 3, 9, 9), False, torch.float32), ((5, 6, 6), True, torch.float32),
                        ((4, 4), False, torch.float64))


def check_previous_token_detector(score_fn: Callable, *, seed: int = 1) -> bool:
    """Check ``fn(pattern [..., N, N]) -> [...]``: the previous-token score of every head, the mean over
    ``i = 1 … N − 1`` of ``pattern[..., i, i − 1]``, on patterns with two, one and no leading dims.

    Raises:
        CheckFailed: naming the diagonal, the next token (a transposed pattern), two tokens back,
            position 0 counted (wrapped around, or a division by ``N``), a sum, one number for all
            heads, entries not averaged, a diagonal over the leading dims, or the first score that differs.

    Example (a wrong answer, and what it is told):
        >>> check_previous_token_detector(lambda pattern: pattern.diagonal(1, -2, -1).mean(-1))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your score reads pattern[..., i − 1, i]: key i seen from ...
    """
    where = "check_previous_token_detector"
    score_fn = watched(where, score_fn, SCORE_RULES)
    generator = torch.Generator().manual_seed(seed)
    for shape, causal, dtype in PREVIOUS_TOKEN_CASES:
        pattern = _patterns(shape, causal=causal, generator=generator, dtype=dtype)
        expected = stripe_mean(pattern, 1, 1)                                # [...]
        answer = _run(where, score_fn, pattern)
        if pattern.dim() > 2 and isinstance(answer, torch.Tensor):
            wrong_dims = pattern.diagonal(-1).mean(-1)                       # the stripe of dims 0 and 1
            if answer.shape == wrong_dims.shape and torch.allclose(answer.double(), wrong_dims.double(), atol=1e-6):
                raise CheckFailed(DIAGONAL_DIMS)
        got = _scores(answer, expected, shape[-1], shape[-1] - 1)
        diagnose(got, expected, _previous_token_mistakes(pattern), ("",) * expected.dim(), "Your score")
    return True


def _fixed_mistakes(patterns: torch.Tensor, period: int) -> list[tuple[str, torch.Tensor]]:
    def over_batch(back, start, **options):
        return stripe_mean(patterns, back, start, **options).mean(dim=1)     # [L, H]

    n = patterns.shape[-1]
    mistakes = [(CLASSMATE, over_batch(period, period)), (FIRST_COPY_INCLUDED, over_batch(period - 1, period - 1)),
                (TOO_EARLY, over_batch(period + 1, period + 1)),
                (TRANSPOSED, over_batch(period - 1, period, transposed=True)),
                (SUMMED, over_batch(period - 1, period, divisor=1)),
                (OVER_ALL_ROWS.format(count=n - period, positions=f"i = {period} … {n - 1}"),
                 over_batch(period - 1, period, divisor=n))]
    if period >= 2:
        mistakes.append((TOO_LATE, over_batch(period - 2, period)))
    if n // 2 != period:
        mistakes.append((HALF_FOR_PERIOD.format(n=n, period=period), over_batch(n // 2 - 1, n // 2)))
    return mistakes


#: (shape [L, B, H, N, N], period): the repeated half, then a period that is not half the length; B ≠ H.
FIXED_CASES = (((2, 3, 4, 12, 12), 6), ((3, 2, 5, 10, 10), 4))


def check_fixed_induction_scores(scores_fn: Callable, *, seed: int = 2) -> bool:
    """Check ``fn(patterns [L, B, H, N, N], period) -> [L, H]``: every head's induction score (the mean over
    ``i = period … N − 1`` of ``pattern[i, i − period + 1]``) averaged over the batch, on causal patterns.

    Raises:
        CheckFailed: naming the mistake, where it is one of the common ones (finding the
            classmate's is the exercise), or the first score that differs.

    Example (a wrong answer, and what it is told):
        >>> check_fixed_induction_scores(lambda patterns, p: patterns.mean(dim=(1, 3, 4)))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your [L, H] score tensor differs from the reference. The first ...
    """
    where = "check_fixed_induction_scores"
    scores_fn = watched(where, scores_fn, SCORE_RULES)
    generator = torch.Generator().manual_seed(seed)
    for shape, period in FIXED_CASES:
        patterns = _patterns(shape, causal=True, generator=generator)
        expected = stripe_mean(patterns, period - 1, period).mean(dim=1)       # [L, H]
        got = _run(where, scores_fn, patterns, period)
        if isinstance(got, torch.Tensor) and got.shape != expected.shape:
            facts = {"got": list(got.shape), "shape": list(expected.shape)}
            if tuple(got.shape) == shape[:2]:
                raise CheckFailed(OVER_HEADS.format(**facts))
            if tuple(got.shape) == shape[:3]:
                raise CheckFailed(BATCH_KEPT.format(**facts))
        got = _scores(got, expected, shape[-1], shape[-1] - period)
        diagnose(got, expected, _fixed_mistakes(patterns, period), ("layer", "head"), "Your [L, H] score tensor")
    return True
