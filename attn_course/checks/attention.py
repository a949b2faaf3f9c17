"""Check scaled dot-product attention and its weights against :func:`attn_course.self_attention`,
naming the classic mistakes: no scaling, the wrong scaling, softmax over the queries, an inverted mask,
a mask applied after the softmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attn_course.checks.compare import matches
from attn_course.checks.diagnosis import CheckFailed, call_student, check_shape, diagnose, same, watched
from attn_course.checks.forbidden import Forbidden
from attn_course.checks.softmax import diagnose_non_finite
from attn_course.core.attention import self_attention

__all__ = ["check_attention", "check_attention_weights", "check_masked_attention", "check_fixed_attention",
           "attention_inputs", "attention_mistakes", "check_large_scores"]


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


def attention_inputs(batched: bool, d_k: int = 16, d_v: int = 8):
    """Fresh random ``q [.., 5, d_k]``, ``k [.., 7, d_k]``, ``v [.., 7, d_v]`` and a ``[5, 7]`` mask.

    With ``batched`` the tensors carry ``[B=2, H=3]`` in front. Every mask row keeps key 0 and
    blocks key 1, so no row is empty and every row is masked somewhere.
    """
    batch = (2, 3) if batched else ()                                   # [B, H] or nothing
    q = torch.randn(*batch, 5, d_k)                                     # [B, H, N_q, d_k]
    k = torch.randn(*batch, 7, d_k)                                     # [B, H, N_k, d_k]
    v = torch.randn(*batch, 7, d_v)                                     # [B, H, N_k, d_v]
    mask = torch.rand(5, 7) > 0.4                                       # [N_q, N_k]
    mask[:, 0], mask[:, 1] = True, False      # each row keeps and blocks at least one key
    return q, k, v, mask


def attention_mistakes(q, k, v, mask) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
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


def one_query_at_a_time(fn: Callable) -> Callable:
    """Turn ``fn(q [d_k], k, v) -> [d_v]`` into ``fn(q [N_q, d_k], k, v) -> [N_q, d_v]``."""

    def all_queries(q, k, v):
        return torch.stack([call_student("check_attention", fn, row, k, v) for row in q])

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
        batched, attention_fn = False, one_query_at_a_time(attention_fn)

    q, k, v, mask = attention_inputs(batched)
    mask = mask if with_mask else None
    args = (q, k, v) if mask is None else (q, k, v, mask)
    expected, _ = self_attention(*args)
    got = call_student("check_attention", attention_fn, *args)
    check_shape(got, expected, "Your output")
    if not same(got, expected):
        mistakes = [(hint, output) for hint, (output, _) in attention_mistakes(q, k, v, mask).items()]
        diagnose(got, expected, mistakes, ("batch", "head", "query", "feature"), "Your output")
    check_large_scores("check_attention", attention_fn, q, k, v, mask)
    return True


RENORMALISED_AFTER_MASK = (
    "Your output is NaN on large scores in {count} rows, each a query whose largest score belongs to a key "
    "it may not attend to: you took the softmax over all the keys, zeroed the blocked weights and divided by "
    "the sum of the rest. On paper that is the same; in float32 the softmax's weights are relative to the "
    "largest score of the row, so when a blocked key's score is far above every allowed one, all the allowed "
    "weights underflow to 0 and the division is 0/0. Mask the scores before the softmax (fill the blocked ones "
    "with -inf): then the maximum it subtracts is the largest allowed score.")


def _renormalised_bad_rows(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[..., N_q]``: the rows where softmax, then × mask, then ÷ row sum gives NaN (float32)."""
    kept = torch.softmax(scores.float(), dim=-1) * mask
    return ~torch.isfinite(kept / kept.sum(dim=-1, keepdim=True)).all(dim=-1)


def check_large_scores(where: str, attention_fn: Callable, q, k, v, mask) -> None:
    """Call the student's attention on scores in the thousands; name an overflow or underflow.

    ``q`` and ``k`` are multiplied by 40, so the scaled scores spread over thousands, and
    their true softmax is perfectly finite.
    """
    large_q, large_k = q * 40, k * 40
    args = (large_q, large_k, v) + (() if mask is None else (mask,))
    expected, _ = self_attention(*args)
    got = call_student(where, attention_fn, *args)
    check_shape(got, expected, "Your output on large scores")   # before any arithmetic on the answer
    scores = large_q @ large_k.transpose(-2, -1) / math.sqrt(q.shape[-1])   # [..., N_q, N_k]
    if mask is not None:
        bad = ~torch.isfinite(got).all(dim=-1)
        renormalised = _renormalised_bad_rows(scores, mask)
        if bad.any() and renormalised.any() and not (bad & ~renormalised).any():
            raise CheckFailed(RENORMALISED_AFTER_MASK.format(count=int(bad.sum())))
        scores = scores.masked_fill(~mask, float("-inf"))
    diagnose_non_finite(got, scores)
    if not same(got, expected):
        diagnose(got, expected, [], ("batch", "head", "query", "feature"), "Your output on large scores")


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
    q, k, v, _ = attention_inputs(batched)
    _, expected = self_attention(q, k, v)
    got = call_student("check_attention_weights", weights_fn, q, k)
    check_shape(got, expected, "Your attention weights")
    if not same(got, expected):
        mistakes = [(hint, weights) for hint, (_, weights) in attention_mistakes(q, k, v, None).items()]
        diagnose(got, expected, mistakes, ("batch", "head", "query", "key"), "Your attention weights")
    return True


# --- attention with a mask, fully masked rows included ---------------------------------------

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


def _variant(q, k, v, mask, scale: float, mask_mode: str, dim: int) -> torch.Tensor:
    """The output of attention with one choice of scaling, masking and softmax dimension.

    ``mask_mode``: ``"right"`` (-inf before the softmax), ``"inverted"`` or ``"after"`` (weights
    multiplied by the mask, not renormalised). Rows left with nothing to attend to give 0, as in
    :func:`self_attention`.
    """
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
                if not hints:
                    continue
                if len(hints) == 1:
                    message = hints[0]
                else:
                    words = {2: "Two", 3: "Three"}[len(hints)]
                    message = f"{words} mistakes remain. " + " And: ".join(hints)
                found.append((message, _variant(q, k, v, mask, scale, mode, dim)))
    found.sort(key=lambda item: item[0].count(" And: "))          # single mistakes first
    return found


def _compare_masked(where: str, got: torch.Tensor, expected: torch.Tensor, q, k, v, mask) -> None:
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
    for message, mistaken in _known_mistakes(q, k, v, mask):
        if same(torch.nan_to_num(got[keep], nan=0.0), mistaken[keep]):
            raise CheckFailed(message)
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

    The function is called on ``q [2, 3, 5, 16]``, ``k [2, 3, 7, 16]``, ``v [2, 3, 7, 8]``
    (``[B, H, N, d]``) without a mask, then with a boolean mask ``[5, 7]`` (``True`` = may
    attend, broadcast over ``B`` and ``H``) in which query 4 may attend to nothing: its
    output must be all zeros, as :func:`self_attention` gives. Then on plain ``[N, d]``
    matrices, and on scores in the thousands (no overflow). ``(output, weights)`` is
    accepted; only the output is checked.

    Returns:
        ``True`` when correct.

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
    q, k, v, mask = attention_inputs(batched=True)
    mask[4] = False                                                   # query 4 sees nothing
    try:
        got = call_student(where, attention_fn, q, k, v)
    except CheckFailed as failure:
        if isinstance(failure.__cause__, TypeError) and "mask" in str(failure.__cause__):
            raise CheckFailed(NEEDS_MASK_ARGUMENT) from None
        raise
    _compare_masked(where, got, self_attention(q, k, v)[0], q, k, v, None)
    got = call_student(where, attention_fn, q, k, v, mask.clone())
    _compare_masked(where, got, self_attention(q, k, v, mask)[0], q, k, v, mask)
    plain = (q[0, 0], k[0, 0], v[0, 0])                                 # [N, d] matrices
    got = call_student(where, attention_fn, *plain, mask.clone())
    _compare_masked(where, got, self_attention(*plain, mask)[0], *plain, mask)
    visible = mask.clone()
    visible[4, 0] = True                                                # no empty row here
    check_large_scores(where, attention_fn, q, k, v, visible)
    return True


def check_fixed_attention(attention_fn: Callable) -> bool:
    """Check ``fn(q, k, v, mask)`` for heads ``[B, H, N, d_k]``: the find-the-bug exercise.

    The function is called on ``q [2, 3, 5, 16]``, ``k [2, 3, 7, 16]``, ``v [2, 3, 7, 8]``
    with a boolean mask ``[5, 7]`` (``True`` = may attend) in which every query may attend
    to at least one key, then on scores in the thousands, then in float16 (the heads of a
    layer under autocast), where a fill of ``-1e9`` cannot be stored. ``(output, weights)``
    is accepted.

    Returns:
        ``True`` when correct.

    Raises:
        CheckFailed: naming each mistake that remains (√d_model instead of √d_k, a mask
            applied after the softmax, and the other classic ones), a fill too large for
            float16, a call that
            :data:`ATTENTION_RULES` forbid, or the first difference.

    Example (a wrong answer, and what it is told):
        >>> check_fixed_attention(lambda q, k, v, mask: self_attention(q, k, v, mask))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_fixed_attention: your answer calls self_attention, ...
    """
    where = "check_fixed_attention"
    attention_fn = watched(where, attention_fn, ATTENTION_RULES)
    q, k, v, mask = attention_inputs(batched=True)
    got = call_student(where, attention_fn, q, k, v, mask.clone())
    _compare_masked(where, got, self_attention(q, k, v, mask)[0], q, k, v, mask)
    check_large_scores(where, attention_fn, q, k, v, mask)
    # The heads of a layer under autocast arrive in float16 (section 4 of chapter 02).
    half = [t.half() for t in (q, k, v)]
    try:
        got = call_student(where, attention_fn, *half, mask.clone())
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
