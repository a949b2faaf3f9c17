"""Check chapter 04's first two exercises: a causal mask for queries after cached keys, and the positions
a decoder without a cache processes (exercises 3 and 4: :mod:`attn_course.checks.decoding`)."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import torch

from attn_course.checks.decoding import TOP_LEFT
from attn_course.checks.diagnosis import CheckFailed, call_answer, name_mistake, watched
from attn_course.checks.forbidden import forbid

__all__ = ["check_causal_mask", "check_positions_without_cache"]

MASK_NOT_BOOL = ("Your mask has dtype {dtype}; return a boolean mask (torch.bool): a comparison such as "
                 "key_position <= query_position gives one, and masked_fill reads True and False, not 0 and 1.")
MASK_SHAPE = ("Your mask for n_q={n_q}, n_k={n_k} has shape {shape}, but it needs one row per query and one "
              "column per key: [{n_q}, {n_k}].")
MASK_MISSES_ITSELF = ("Your mask hides the diagonal: query i may also attend to the key at its own position "
                      "(j = n_k - n_q + i). Use <=, not <.")
MASK_INVERTED = ("Your mask is inverted: True must mean 'may attend' (the past and the query's own position), "
                 "False the future.")
MASK_ONE_AHEAD = ("Your mask lets each query see one key past its own position, the next token: query i sits at "
                  "n_k - n_q + i, so tril's diagonal is n_k - n_q (keys up to it), not n_k - n_q + 1.")
MASK_ADDITIVE = ("Your mask is additive: 0 where a query may attend and {blocked} where it may not, the form "
                 "added to the scores. Its pattern is right, but this exercise asks for the boolean mask: "
                 "True where a query may attend, False elsewhere (your_mask == 0 turns one into the other).")

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
    """Check ``fn(n_q, n_k) -> [n_q, n_k]``, the boolean causal mask of the last ``n_q`` of ``n_k`` positions,
    for each of ``sizes`` (``1 <= n_q <= n_k``), against :func:`~attn_course.core.masks.causal_mask`'s rule.

    Raises:
        CheckFailed: naming a non-boolean mask (an additive 0/-inf one too), a wrong shape, a
            top-left alignment, a hidden diagonal, one key too many, an inverted mask, or the first entry
            that differs.

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
        if got.is_floating_point() and bool((~expected).any()) and torch.equal(got == 0, expected) and \
                bool((got[~expected] < 0).all()):
            blocked = ", ".join(sorted({f"{value:g}" for value in got[~expected].tolist()}))
            raise CheckFailed(MASK_ADDITIVE.format(blocked=blocked))
        pattern = got != 0 if got.dtype != torch.bool else got
        if torch.equal(pattern, expected) and got.dtype != torch.bool:
            raise CheckFailed(MASK_NOT_BOOL.format(dtype=got.dtype))
        if not torch.equal(pattern, expected):
            strict = key_position < query_position
            name_mistake(pattern, [(TOP_LEFT, torch.ones(n_q, n_k, dtype=torch.bool).tril()),
                                   (MASK_MISSES_ITSELF, strict), (MASK_INVERTED, ~expected), (MASK_INVERTED, ~strict),
                                   (MASK_ONE_AHEAD, key_position <= query_position + 1)],
                         torch.equal)
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
    """Check ``fn(P, T) -> int``: token positions processed without a cache (``sum(P + t for t < T)``), for
    each ``(P, T)`` of ``cases``.

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
            name_mistake(got, [
                (ONE_STEP_TOO_MANY, sum(prompt + step + 1 for step in range(new))),
                (FORGOT_THE_PROMPT, sum(step for step in range(new))),
                (FORGOT_THE_PROMPT, sum(step + 1 for step in range(new))),
                (PROMPT_ONCE, prompt + sum(step for step in range(new))),
                (WITH_A_CACHE, prompt + new - 1),
                (EVERY_STEP_FULL, new * (prompt + new - 1)),
                (EVERY_STEP_FULL, new * (prompt + new)),
            ])
            raise CheckFailed(f"Your count for P={prompt}, T={new} is {got}; it should be {expected}. The step "
                              "for new token t (t = 0 .. T-1) runs over the P + t tokens so far.")
    return True
