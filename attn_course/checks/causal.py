"""Check causal attention and cached decoding: no leak of the future, the diagonal kept, the
queries aligned after the cached keys, positions that continue the cached text, a left-padded
batch whose padding no query sees.

Chapter 04's exercises: :func:`check_causal_mask`, :func:`check_positions_without_cache`,
:func:`check_decode_logits` and :func:`check_cached_attention_step`.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import torch

from attn_course.checks.attention import attention_inputs
from attn_course.checks.diagnosis import (
    CheckFailed,
    call_answer,
    call_student,
    check_shape,
    diagnose,
    same,
    watched,
)
from attn_course.checks.forbidden import forbid
from attn_course.core.attention import self_attention

__all__ = [
    "check_causal_attention",
    "check_causal_mask",
    "check_positions_without_cache",
]

from attn_course.checks.decoding import TOP_LEFT  # noqa: E402

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


# --- chapter 04's exercises ---------------------------------------------------------------------

MASK_NOT_BOOL = ("Your mask has dtype {dtype}; return a boolean mask (torch.bool): a comparison such as "
                 "key_position <= query_position gives one, and masked_fill reads True and False, not 0 and 1.")
MASK_SHAPE = ("Your mask for n_q={n_q}, n_k={n_k} has shape {shape}, but it needs one row per query and one "
              "column per key: [{n_q}, {n_k}].")
MASK_MISSES_ITSELF = ("Your mask hides the diagonal: query i may also attend to the key at its own position "
                      "(j = n_k - n_q + i). Use <=, not <.")
MASK_INVERTED = ("Your mask is inverted: True must mean 'may attend' (the past and the query's own position), "
                 "False the future.")


#: What chapter 04's mask exercise may not call: the masks the course already builds.
CAUSAL_MASK_RULES = forbid(
    "the exercise is to build the causal mask yourself",
    "attn_course.core.masks.causal_mask",
    "attn_course.variants.masks.sliding_window_mask",
    "attn_course.variants.masks.attention_sink_mask",
    "torch.nn.modules.transformer.Transformer.generate_square_subsequent_mask",
)


def check_causal_mask(mask_fn: Callable[[int, int], torch.Tensor],
                      sizes: Sequence[tuple[int, int]] = ((4, 4), (2, 5), (1, 6), (3, 7))) -> bool:
    """Check ``fn(n_q, n_k) -> [n_q, n_k]`` boolean causal mask for the last ``n_q`` of ``n_k`` positions.

    Args:
        mask_fn: the student's function.
        sizes: ``(n_q, n_k)`` pairs to try, each with ``1 <= n_q <= n_k``.

    Returns:
        ``True`` when every mask equals :func:`~attn_course.core.masks.causal_mask`.

    Raises:
        CheckFailed: naming a non-boolean mask, a wrong shape, a top-left alignment, a hidden
            diagonal, an inverted mask, or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_causal_mask(lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool).tril())
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your mask is aligned to the top-left: query 0 sees only key 0, as ...
    """
    mask_fn = watched("check_causal_mask", mask_fn, CAUSAL_MASK_RULES)
    for n_q, n_k in sizes:
        got = call_answer("check_causal_mask", mask_fn, n_q, n_k, described=f"n_q={n_q}, n_k={n_k}")
        if not isinstance(got, torch.Tensor):
            raise CheckFailed(f"Your function should return a torch.Tensor, but it returned {type(got).__name__}.")
        if got.shape != (n_q, n_k):
            raise CheckFailed(MASK_SHAPE.format(n_q=n_q, n_k=n_k, shape=list(got.shape)))
        query_position = torch.arange(n_q).unsqueeze(1) + (n_k - n_q)        # [N_q, 1]
        key_position = torch.arange(n_k).unsqueeze(0)                        # [1, N_k]
        expected = key_position <= query_position                            # [N_q, N_k]
        pattern = got != 0 if got.dtype != torch.bool else got
        if torch.equal(pattern, expected) and got.dtype != torch.bool:
            raise CheckFailed(MASK_NOT_BOOL.format(dtype=got.dtype))
        if not torch.equal(pattern, expected):
            strict = key_position < query_position
            for message, wrong in [(TOP_LEFT, torch.ones(n_q, n_k, dtype=torch.bool).tril()),
                                   (MASK_MISSES_ITSELF, strict), (MASK_INVERTED, ~expected), (MASK_INVERTED, ~strict)]:
                if torch.equal(pattern, wrong):
                    raise CheckFailed(message)
            i, j = (int(index) for index in (pattern != expected).nonzero()[0])
            raise CheckFailed(f"Your mask for n_q={n_q}, n_k={n_k} is wrong at query {i}, key {j}: expected "
                              f"{bool(expected[i, j])}, got {bool(pattern[i, j])}. Query {i} sits at position "
                              f"{n_k - n_q + i}.")
        if got.dtype != torch.bool:
            raise CheckFailed(MASK_NOT_BOOL.format(dtype=got.dtype))
    return True


COUNT_NOT_INT = ("Your count is a {kind}, not a Python int{detail}. Counting positions gives a whole number: "
                 "keep to integers (// instead of /) and return an int.")
ONE_STEP_TOO_MANY = ("Your count is one position too many per step: the first step (t = 0) runs over the "
                     "prompt alone, P positions, and the step for new token t over P + t.")
FORGOT_THE_PROMPT = ("Your count leaves out the prompt: without a cache every step re-reads the P prompt "
                     "tokens too, so each of the T steps adds P.")
PROMPT_ONCE = ("You counted the prompt once, but without a cache every one of the T steps re-reads it: "
               "the prompt contributes T · P positions.")
WITH_A_CACHE = ("That is the count with a cache (the prompt once, then one token per step); without a "
                "cache the step for new token t runs over all P + t tokens.")
EVERY_STEP_FULL = ("You counted every step as long as the last one; the sequence grows, so the step for new "
                   "token t runs over P + t tokens, fewer early on.")


def check_positions_without_cache(count_fn: Callable[[int, int], int],
                                  cases: Sequence[tuple[int, int]] = ((16, 100), (1, 1), (5, 3), (32, 256))) -> bool:
    """Check ``fn(P, T) -> int``: token positions processed without a cache (``sum(P + t for t < T)``).

    Args:
        count_fn: the student's function.
        cases: ``(P, T)`` pairs to try, each ``>= 1``.

    Returns:
        ``True`` when every count is right.

    Raises:
        CheckFailed: naming a count that is not an int, one step too many, a forgotten
            prompt, the prompt counted once, the count with a cache, every step counted
            full, or the case that is wrong.

    Example (a wrong answer, and what it is told):
        >>> check_positions_without_cache(lambda P, T: T * P)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your count for P=16, T=100 is 1600; it should be 6550. The step ...
    """
    for prompt, new in cases:
        got = call_answer("check_positions_without_cache", count_fn, prompt, new, described=f"P={prompt}, T={new}")
        if isinstance(got, torch.Tensor):
            raise CheckFailed(COUNT_NOT_INT.format(kind="tensor", detail=" (return int(...) or build the "
                                                   "formula from the ints P and T)"))
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):
            raise CheckFailed(COUNT_NOT_INT.format(kind=type(got).__name__, detail=f" ({got!r})"))
        expected = sum(prompt + step for step in range(new))
        if got != expected:
            mistakes = [
                (ONE_STEP_TOO_MANY, sum(prompt + step + 1 for step in range(new))),
                (FORGOT_THE_PROMPT, sum(step for step in range(new))),
                (FORGOT_THE_PROMPT, sum(step + 1 for step in range(new))),
                (PROMPT_ONCE, prompt + sum(step for step in range(new))),
                (WITH_A_CACHE, prompt + new - 1),
                (EVERY_STEP_FULL, new * (prompt + new - 1)),
                (EVERY_STEP_FULL, new * (prompt + new)),
            ]
            for message, wrong in mistakes:
                if got == wrong and wrong != expected:
                    raise CheckFailed(message)
            raise CheckFailed(f"Your count for P={prompt}, T={new} is {got}; it should be {expected}. The step "
                              "for new token t (t = 0 .. T-1) runs over the P + t tokens so far.")
    return True
