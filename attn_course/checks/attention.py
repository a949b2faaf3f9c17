"""Check scaled dot-product attention and its weights against :func:`attn_course.self_attention`,
naming the classic mistakes: no scaling, the wrong scaling, softmax over the queries, an inverted mask,
a mask applied after the softmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attn_course.attention import self_attention
from attn_course.checks.diagnosis import CheckFailed, call_student, check_shape, diagnose, same
from attn_course.checks.softmax import OVERFLOW

__all__ = ["check_attention", "check_attention_weights", "attention_inputs", "attention_mistakes"]


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
    large = (q * 40, k * 40, v) + (() if mask is None else (mask,))     # scores in the thousands
    got_large = call_student("check_attention", attention_fn, *large)
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
    q, k, v, _ = attention_inputs(batched)
    _, expected = self_attention(q, k, v)
    got = call_student("check_attention_weights", weights_fn, q, k)
    check_shape(got, expected, "Your attention weights")
    if not same(got, expected):
        mistakes = [(hint, weights) for hint, (_, weights) in attention_mistakes(q, k, v, None).items()]
        diagnose(got, expected, mistakes, ("batch", "head", "query", "key"), "Your attention weights")
    return True
