"""Check chapter 02's attention exercises against :func:`attn_course.self_attention`, naming the classic
mistakes: no scaling or the wrong one, softmax over the queries, an inverted mask, a mask applied after the
softmax, a fully masked row, an overflow.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attn_course.checks.compare import FLOATING, matches
from attn_course.checks.diagnosis import CheckFailed, call_student, check_shape, diagnose, name_mistake, same, watched
from attn_course.checks.forbidden import Forbidden
from attn_course.checks.softmax import diagnose_non_finite
from attn_course.core.attention import self_attention

__all__ = ["check_masked_attention", "check_fixed_attention"]

NO_SCALING = ("You forgot the scaling: your result equals softmax(Q Kᵀ) V. Divide the scores by "
              "√d_k (here √{d_k} = {sqrt_d_k:g}) before the softmax.")
SCALED_BY_SQRT_D_V = ("You divided the scores by √d_v = {sqrt_d_v:g}, the size of the values, instead of by "
                      "√d_k = {sqrt_d_k:g}, the size of the queries and keys. The scaling keeps the dot product "
                      "q·k, a sum of d_k terms, at unit variance; the values never enter the scores.")
SCALED_BY_D_K = ("You divided the scores by d_k = {d_k}; divide by its square root, √d_k = {sqrt_d_k:g}.")
SCALED_BY_D_MODEL = ("You scaled by √d_model = √{d_model} (all {heads} heads together) instead of the "
                     "head dimension: divide by √d_k = √{d_k}, where d_k = q.shape[-1] is one head's size.")
SOFTMAX_OVER_QUERIES = ("Your softmax runs over the wrong dimension (the queries, dim=-2): each query's "
                        "weights over the keys must sum to 1, so use dim=-1.")
INVERTED_MASK = ("Your mask is inverted: in this course (and in PyTorch) True means 'may attend'. "
                 "Fill the scores where the mask is False, e.g. scores.masked_fill(~mask, float('-inf')).")
MASK_AFTER_SOFTMAX = ("You applied the mask after the softmax: the blocked weights are 0 but the remaining "
                      "ones no longer sum to 1. Mask the scores (with -inf) before the softmax.")
RENORMALISED_AFTER_MASK = (
    "Your output is NaN on large scores in {count} rows, each a query whose largest score belongs to a key "
    "it may not attend to: you took the softmax over all the keys, zeroed the blocked weights and divided by "
    "the sum of the rest. On paper that is the same; in float32 the softmax's weights are relative to the "
    "largest score of the row, so when a blocked key's score is far above every allowed one, all the allowed "
    "weights underflow to 0 and the division is 0/0. Mask the scores before the softmax (fill the blocked ones "
    "with -inf): then the maximum it subtracts is the largest allowed score.")
EMPTY_ROW_NAN = ("Your output is NaN for query {row}, whose mask row is all False (it may attend to nothing): "
                 "the softmax of a row of -inf is 0/0. Such a query must get a zero output, as self_attention "
                 "and PyTorch's scaled_dot_product_attention (from 2.5) give; for example, set the weights of "
                 "rows that are entirely masked to 0.")
EMPTY_ROW_UNIFORM = ("Your output for query {row}, whose mask row is all False, is the plain average of all the "
                     "values: filling blocked scores with a large negative number (-1e9, finfo.min) instead of "
                     "-inf makes a row with nothing to attend to uniform. Such a query must get a zero output.")
EMPTY_ROW_WRONG = ("Your output is right for every query except query {row}, whose mask row is all False: it must "
                   "be all zeros (no key to attend to), got {got}.")
NEEDS_MASK_ARGUMENT = ("Your function must also work without a mask: call it as fn(q, k, v) and it should do plain "
                       "attention (mask=None by default).")


def _attention_inputs():
    """Fresh ``q [2, 3, 5, 16]``, ``k [2, 3, 7, 16]``, ``v [2, 3, 7, 8]`` and a ``[5, 7]`` mask in which
    every row keeps key 0 and blocks key 1."""
    q, k, v = torch.randn(2, 3, 5, 16), torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 8)   # [B, H, N, d]
    mask = torch.rand(5, 7) > 0.4                                       # [N_q, N_k]
    mask[:, 0], mask[:, 1] = True, False      # each row keeps and blocks at least one key
    return q, k, v, mask


def _renormalised_bad_rows(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[..., N_q]``: the rows where softmax, then × mask, then ÷ row sum gives NaN (float32)."""
    kept = torch.softmax(scores.float(), dim=-1) * mask
    return ~torch.isfinite(kept / kept.sum(dim=-1, keepdim=True)).all(dim=-1)


def _check_large_scores(where: str, attention_fn: Callable, q, k, v, mask) -> None:
    """The answer on ``q`` and ``k`` times 40 (scores in the thousands, a finite softmax); names an
    overflow or underflow."""
    large_q, large_k = q * 40, k * 40
    expected, _ = self_attention(large_q, large_k, v, mask)
    got = call_student(where, attention_fn, large_q, large_k, v, mask)
    check_shape(got, expected, "Your output on large scores")   # before any arithmetic on the answer
    scores = large_q @ large_k.transpose(-2, -1) / math.sqrt(q.shape[-1])   # [..., N_q, N_k]
    bad = ~torch.isfinite(got).all(dim=-1)
    renormalised = _renormalised_bad_rows(scores, mask)
    if bad.any() and renormalised.any() and not (bad & ~renormalised).any():
        raise CheckFailed(RENORMALISED_AFTER_MASK.format(count=int(bad.sum())))
    diagnose_non_finite(got, scores.masked_fill(~mask, float("-inf")))
    # Scores in the hundreds: float32 rounds each to about 1e-5 of its size, which moves two right answers'
    # outputs apart by up to about 1e-4 (seen: 1.0e-4). What this step is for (NaN, overflow) is far larger.
    if matches(got, expected, atol=1e-3, rtol=1e-3, dtype=FLOATING):
        return
    diagnose(got, expected, [], ("batch", "head", "query", "feature"), "Your output on large scores")


def _variant(q, k, v, mask, scale: float, mask_mode: str, dim: int) -> torch.Tensor:
    """Attention with one choice of scaling, softmax dimension and ``mask_mode``: ``"right"``,
    ``"inverted"`` or ``"after"`` (weights multiplied by the mask); empty rows give 0."""
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None and mask_mode in ("right", "inverted"):
        allowed = mask if mask_mode == "right" else ~mask
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, dim=dim), nan=0.0)
    if mask is not None and mask_mode == "after":
        weights = weights * mask
    return weights @ v


def _known_mistakes(q, k, v, mask) -> list[tuple[str, torch.Tensor]]:
    """(message, output) for every combination of the classic mistakes, one or two at a time."""
    d_k = q.shape[-1]
    heads = q.shape[-3] if q.dim() >= 4 else 1
    d_v = v.shape[-1]
    facts = {"d_k": d_k, "sqrt_d_k": math.sqrt(d_k), "d_model": heads * d_k, "heads": heads, "sqrt_d_v": math.sqrt(d_v)}
    scalings = [(None, 1 / math.sqrt(d_k)), (NO_SCALING, 1.0), (SCALED_BY_D_K, 1.0 / d_k)]
    if d_v != d_k:
        scalings.append((SCALED_BY_SQRT_D_V, 1.0 / math.sqrt(d_v)))
    if heads > 1:
        scalings.append((SCALED_BY_D_MODEL, 1.0 / math.sqrt(heads * d_k)))
    masking = [(None, "right")]
    if mask is not None:
        masking += [(INVERTED_MASK, "inverted"), (MASK_AFTER_SOFTMAX, "after")]
    dims = [(None, -1), (SOFTMAX_OVER_QUERIES, -2)]
    found = []
    for scale_hint, scale in scalings:
        for mask_hint, mode in masking:
            for dim_hint, dim in dims:
                hints = [hint.format(**facts) for hint in (scale_hint, mask_hint, dim_hint) if hint]
                if hints:
                    remain = {1: "", 2: "Two mistakes remain. ", 3: "Three mistakes remain. "}[len(hints)]
                    found.append((remain + " And: ".join(hints), _variant(q, k, v, mask, scale, mode, dim)))
    found.sort(key=lambda item: item[0].count(" And: "))          # single mistakes first
    return found


def _compare_masked(got: torch.Tensor, expected: torch.Tensor, q, k, v, mask) -> None:
    """Raise :class:`CheckFailed` naming what differs between ``got`` and ``expected``."""
    check_shape(got, expected, "Your output")
    if same(got, expected):
        return
    empty = torch.zeros(expected.shape[:-1], dtype=torch.bool)                 # [..., N_q]
    if mask is not None:
        empty = (~mask).all(dim=-1).expand(expected.shape[:-1])
    if empty.any():
        row = int(empty.nonzero()[0][-1])
        others_right = same(torch.where(empty[..., None], expected, got), expected)
        if others_right:
            if torch.isnan(got[empty]).all():
                raise CheckFailed(EMPTY_ROW_NAN.format(row=row))
            uniform = v.mean(dim=-2, keepdim=True).expand(expected.shape)
            if same(got[empty], uniform[empty]):
                raise CheckFailed(EMPTY_ROW_UNIFORM.format(row=row))
            raise CheckFailed(EMPTY_ROW_WRONG.format(row=row, got=f"{got[empty].flatten()[:3].tolist()} ..."))
    # The classic mistakes, judged on the rows that are not empty (those are named above).
    keep = ~empty
    mistakes = [(message, wrong[keep]) for message, wrong in _known_mistakes(q, k, v, mask)]
    name_mistake(torch.nan_to_num(got[keep], nan=0.0), mistakes, same)
    diagnose(got, expected, [], ("batch", "head", "query", "feature"), "Your output")


#: What chapter 02's attention exercises may not call: the course's attention and PyTorch's.
ATTENTION_RULES = (
    Forbidden("attn_course.core.attention.self_attention", "the exercise is to write attention, not to call ours"),
    Forbidden("attn_course.core.attention.scaled_dot_product", "the exercise is to write attention, not to call ours"),
    Forbidden("attn_course.core.attention.classic_self_attention",
              "the exercise is to write attention, not to call ours"),
    Forbidden("torch.nn.functional.scaled_dot_product_attention",
              "the exercise is to write attention from the formula, not to call PyTorch's"),
    Forbidden("attn_course.core.attention.softmax_with_empty_rows",
              "the exercise is to handle the masked rows yourself, not to call the course's helper"),
)

#: A fill that float16 cannot hold (chapter 02, section 4): masked_fill raises before any softmax.
FILL_TOO_LARGE_FOR_FLOAT16 = (
    "In float16 your function raised: {error}. You fill the blocked scores with a number float16 cannot "
    "store (its largest is 65504, so -1e9 overflows), as the tutorials' version of section 4 does. Fill "
    "them with float('-inf'): every dtype holds it, and exp(-inf) = 0 is exactly the weight a blocked key "
    "must get.")


def check_masked_attention(attention_fn: Callable) -> bool:
    """Check ``fn(q, k, v, mask=None)`` returning scaled dot-product attention's output.

    Called on ``q [2, 3, 5, 16]``, ``k [2, 3, 7, 16]``, ``v [2, 3, 7, 8]`` without a mask, then with a
    boolean mask ``[5, 7]`` (``True`` = may attend) in which query 4 may attend to nothing (its output
    must be zeros), then on plain ``[N, d]`` matrices, and on scores in the thousands.
    ``(output, weights)`` is accepted.

    Raises:
        CheckFailed: naming NaN or uniform weights on the fully masked query, the classic
            mistakes (no scaling, √d_k missing or squared, √d_model, an inverted mask, a mask
            applied after the softmax, a softmax over the queries) alone or together, an
            overflow, a call that :data:`ATTENTION_RULES` forbid, or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_masked_attention(lambda q, k, v, mask=None: self_attention(q, k, v, mask))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_masked_attention: your answer calls self_attention, ...
    """
    where = "check_masked_attention"
    attention_fn = watched(where, attention_fn, ATTENTION_RULES)
    q, k, v, mask = _attention_inputs()
    mask[4] = False                                                   # query 4 sees nothing
    try:
        got = call_student(where, attention_fn, q, k, v)
    except CheckFailed as failure:
        if isinstance(failure.__cause__, TypeError) and "mask" in str(failure.__cause__):
            raise CheckFailed(NEEDS_MASK_ARGUMENT) from None
        raise
    _compare_masked(got, self_attention(q, k, v)[0], q, k, v, None)
    got = call_student(where, attention_fn, q, k, v, mask)
    _compare_masked(got, self_attention(q, k, v, mask)[0], q, k, v, mask)
    plain = (q[0, 0], k[0, 0], v[0, 0])                                 # [N, d] matrices
    got = call_student(where, attention_fn, *plain, mask)
    _compare_masked(got, self_attention(*plain, mask)[0], *plain, mask)
    visible = mask.clone()
    visible[4, 0] = True                                                # no empty row here
    _check_large_scores(where, attention_fn, q, k, v, visible)
    return True


def check_fixed_attention(attention_fn: Callable) -> bool:
    """Check ``fn(q, k, v, mask)`` for heads ``[B, H, N, d_k]``: the find-the-bug exercise.

    Called on ``q [2, 3, 5, 16]``, ``k [2, 3, 7, 16]``, ``v [2, 3, 7, 8]`` with a boolean mask ``[5, 7]``
    in which every query may attend to a key, then on scores in the thousands, then in float16 (the
    heads of a layer under autocast), where a fill of ``-1e9`` cannot be stored.

    Raises:
        CheckFailed: naming each mistake that remains (√d_model instead of √d_k, a mask applied after
            the softmax, and the other classic ones), a fill too large for float16, a call that
            :data:`ATTENTION_RULES` forbid, or the first difference.

    Example (a wrong answer, and what it is told):
        >>> check_fixed_attention(lambda q, k, v, mask: self_attention(q, k, v, mask))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_fixed_attention: your answer calls self_attention, ...
    """
    where = "check_fixed_attention"
    attention_fn = watched(where, attention_fn, ATTENTION_RULES)
    q, k, v, mask = _attention_inputs()
    got = call_student(where, attention_fn, q, k, v, mask)
    _compare_masked(got, self_attention(q, k, v, mask)[0], q, k, v, mask)
    _check_large_scores(where, attention_fn, q, k, v, mask)
    # The heads of a layer under autocast arrive in float16 (section 4 of chapter 02).
    half = [t.half() for t in (q, k, v)]
    try:
        got = call_student(where, attention_fn, *half, mask)
    except CheckFailed as failure:
        if "without overflow" in str(failure):
            raise CheckFailed(FILL_TOO_LARGE_FOR_FLOAT16.format(error=str(failure.__cause__))) from None
        raise
    expected = self_attention(*half, mask)[0]
    check_shape(got, expected, "Your output in float16")
    got, expected = got.float(), expected.float()
    if not matches(got, expected, rtol=2e-3, atol=2e-3):          # float16 keeps 3 digits
        diagnose(got, expected, [], ("batch", "head", "query", "feature"), "Your output in float16")
    return True
