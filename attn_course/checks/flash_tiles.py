"""Check chapter 07's tile exercise: how many tiles sliding-window tiled attention computes and masks, against
the ``n × n`` mask walked tile by tile and the counts the usual mistakes give."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_answer, name_mistake, watched
from attn_course.checks.forbidden import Forbidden

__all__ = ["check_window_tile_counts"]


def _visible(n: int, window: int) -> torch.Tensor:
    """``[n, n]`` bool: query i sees key j iff ``i - window < j <= i`` (itself and the window - 1 before)."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (j <= i) & (j > i - window)


def _tile_counts(n: int, block_q: int, block_k: int, window: int, *, masked_by: int | None = None) -> tuple[int, int]:
    """(computed, masked): tile pairs with an entry visible through ``window``, and of those the ones with an
    entry hidden by the window ``masked_by`` (default ``window``)."""
    visible, needs_mask = _visible(n, window), _visible(n, window if masked_by is None else masked_by)
    computed = masked = 0
    for q_start in range(0, n, block_q):
        for k_start in range(0, n, block_k):
            tile = (slice(q_start, q_start + block_q), slice(k_start, k_start + block_k))
            if visible[tile].any():
                computed += 1
                masked += not needs_mask[tile].all()
    return computed, masked


#: What chapter 07's tile prediction may not call: the code that walks or counts the tiles.
TILE_COUNT_RULES = (
    Forbidden("attn_course.flash.tiled.tiled_attention",
              "the statement asks you not to call tiled_attention: count the tiles yourself"),
    Forbidden("attn_course.flash.schedule.tile_counts",
              "the exercise is to count the tiles yourself"),
    Forbidden("attn_course.flash.schedule.tile_kinds",
              "the exercise is to count the tiles yourself"),
    Forbidden("attn_course.teaching.flash_diagrams.tile_schedule",
              "the exercise is to count the tiles yourself"),
)


def check_window_tile_counts(counts: Callable) -> bool:
    """Check ``counts(n, block_q, block_k, window) -> (computed, masked)`` for sliding-window attention (query
    ``i`` sees key ``j`` when ``i - window < j <= i``): the tile pairs holding a visible entry, and those of
    them holding a hidden one too. Cases include ``block_q != block_k``, ``n`` not a multiple of either, and
    a window longer than ``n``.

    Raises:
        CheckFailed: naming the mistake (the window ignored, the window one key too wide, tiles taken
            square, the partial last tile forgotten, the window's lower edge left unmasked, the two
            numbers swapped), else the case that is wrong.

    Example (a wrong answer, and what it is told):
        >>> check_window_tile_counts(lambda n, block_q, block_k, window: (n // block_q, 0))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: For n = 512, block_q = 64, block_k = 64, window = 128 you said ...
    """
    counts = watched("check_window_tile_counts", counts, TILE_COUNT_RULES)
    cases = [(512, 64, 64, 128), (300, 64, 64, 100), (256, 128, 64, 64), (1000, 128, 64, 300),
             (200, 32, 128, 50), (100, 64, 32, 1000), (130, 16, 16, 40), (256, 64, 64, 65)]
    wrong_ways = [
        ("You counted the tiles of plain causal attention: with window = {w}, key tiles more than window - 1 "
         "keys before every query of a tile are skipped too.", lambda n, bq, bk, w: _tile_counts(n, bq, bk, n)),
        ("Your window is one key too wide: query i sees the window keys i - window + 1, ..., i, so key "
         "i - window is hidden.", lambda n, bq, bk, w: _tile_counts(n, bq, bk, w + 1)),
        ("You used block_q for the key tiles too: with block_q = {bq} and block_k = {bk} the key tiles are "
         "{bk} wide.", lambda n, bq, bk, w: _tile_counts(n, bq, bq, w)),
        ("You forgot the last, partial query tile: with n = {n} and block_q = {bq} there are "
         "ceil(n / block_q) = {tiles} query tiles.",
         lambda n, bq, bk, w: _tile_counts(n // bq * bq, bq, bk, w) if n >= bq else (0, 0)),
        ("You masked only the tiles the diagonal crosses, but a tile the window's lower edge crosses "
         "(some keys too far back for some of its queries) needs the mask too.",
         lambda n, bq, bk, w: _tile_counts(n, bq, bk, w, masked_by=n)),
    ]
    for n, bq, bk, w in cases:
        expected = _tile_counts(n, bq, bk, w)
        result = call_answer("check_window_tile_counts", counts, n, bq, bk, w)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise CheckFailed(f"Your function should return two ints, (computed, masked), but it returned "
                              f"{type(result).__name__}.")
        try:
            got = tuple(int(x) for x in result)
        except (TypeError, ValueError):
            raise CheckFailed("Your function should return two ints, (computed, masked).") from None
        if got == expected:
            continue
        if got == expected[::-1]:
            raise CheckFailed("You returned (masked, computed): the first number is the tiles computed.")
        name_mistake(got, [(message.format(n=n, bq=bq, bk=bk, w=w, tiles=math.ceil(n / bq)), wrong(n, bq, bk, w))
                           for message, wrong in wrong_ways])
        raise CheckFailed(f"For n = {n}, block_q = {bq}, block_k = {bk}, window = {w} you said {got}, but "
                          f"{expected[0]} tile pairs hold a visible entry, {expected[1]} of them also a hidden one. "
                          f"Draw the band of visible entries, i - window < j <= i, over the tiles.")
    return True
