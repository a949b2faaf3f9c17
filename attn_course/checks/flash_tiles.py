"""Check for chapter 07's tile exercise: how many tiles sliding-window tiled attention computes and masks.

:func:`check_window_tile_counts` compares the student's counts with the ``n × n`` mask itself,
walked tile by tile, and with the counts the usual mistakes give.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_answer, watched
from attn_course.checks.forbidden import Forbidden

__all__ = ["check_window_tile_counts"]


# --- 2. predicting the tiles of sliding-window tiled attention ---------------------------------

def _visible(n: int, window: int) -> torch.Tensor:
    """``[n, n]`` bool: query i sees key j iff ``i - window < j <= i`` (itself and the window - 1 before)."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (j <= i) & (j > i - window)


def _tile_counts(n: int, block_q: int, block_k: int, visible: torch.Tensor) -> tuple[int, int]:
    """(computed, masked): tile pairs with some visible entry, and of those the ones with a hidden entry."""
    computed = masked = 0
    for q_start in range(0, n, block_q):
        for k_start in range(0, n, block_k):
            tile = visible[q_start:q_start + block_q, k_start:k_start + block_k]
            if tile.any():
                computed += 1
                masked += not tile.all()
    return computed, masked


def _window_counts(n, block_q, block_k, window):
    return _tile_counts(n, block_q, block_k, _visible(n, window))


def _causal_only(n, block_q, block_k, window):
    return _tile_counts(n, block_q, block_k, _visible(n, n))


def _window_one_wider(n, block_q, block_k, window):
    return _tile_counts(n, block_q, block_k, _visible(n, window + 1))


def _square_only(n, block_q, block_k, window):
    return _window_counts(n, block_q, block_q, window)


def _full_tiles_only(n, block_q, block_k, window):
    return _window_counts((n // block_q) * block_q, block_q, block_k, window) if n >= block_q else (0, 0)


def _diagonal_only(n, block_q, block_k, window):
    """Masked counted as the tiles the diagonal crosses, as if the window's lower edge needed no mask."""
    causal = _visible(n, n)
    computed = masked = 0
    window_mask = _visible(n, window)
    for q_start in range(0, n, block_q):
        for k_start in range(0, n, block_k):
            if window_mask[q_start:q_start + block_q, k_start:k_start + block_k].any():
                computed += 1
                masked += not causal[q_start:q_start + block_q, k_start:k_start + block_k].all()
    return computed, masked


#: What chapter 07's tile prediction may not call: the code that walks or counts the tiles.
TILE_COUNT_RULES = (
    Forbidden("attn_course.flash.tiled.tiled_attention",
              "the statement asks you not to call tiled_attention: count the tiles yourself"),
    Forbidden("attn_course.teaching.flash_diagrams.tile_counts",
              "the exercise is to count the tiles yourself"),
    Forbidden("attn_course.teaching.flash_diagrams.tile_kinds",
              "the exercise is to count the tiles yourself"),
    Forbidden("attn_course.teaching.flash_diagrams.tile_schedule",
              "the exercise is to count the tiles yourself"),
)


def check_window_tile_counts(counts: Callable) -> bool:
    """Check ``counts(n, block_q, block_k, window) -> (computed, masked)`` for sliding-window attention.

    Query ``i`` sees key ``j`` when ``i - window < j <= i``. ``computed`` is the number of (query
    tile, key tile) pairs holding at least one visible entry, ``masked`` how many of those also hold
    a hidden one. The expected counts come from the ``n × n`` mask itself, tile by tile. Cases
    include ``block_q != block_k``, ``n`` not a multiple of either, and a window longer than ``n``.

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
         "keys before every query of a tile are skipped too.", _causal_only),
        ("Your window is one key too wide: query i sees the window keys i - window + 1, ..., i, so key "
         "i - window is hidden.", _window_one_wider),
        ("You used block_q for the key tiles too: with block_q = {bq} and block_k = {bk} the key tiles are "
         "{bk} wide.", _square_only),
        ("You forgot the last, partial query tile: with n = {n} and block_q = {bq} there are "
         "ceil(n / block_q) = {tiles} query tiles.", _full_tiles_only),
        ("You masked only the tiles the diagonal crosses, but a tile the window's lower edge crosses "
         "(some keys too far back for some of its queries) needs the mask too.", _diagonal_only),
    ]
    for n, bq, bk, w in cases:
        expected = _window_counts(n, bq, bk, w)
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
        for message, wrong in wrong_ways:
            if got == wrong(n, bq, bk, w) and wrong(n, bq, bk, w) != expected:
                raise CheckFailed(message.format(n=n, bq=bq, bk=bk, w=w, tiles=math.ceil(n / bq)))
        raise CheckFailed(f"For n = {n}, block_q = {bq}, block_k = {bk}, window = {w} you said {got}, but "
                          f"{expected[0]} tile pairs hold a visible entry, {expected[1]} of them also a hidden one. "
                          f"Draw the band of visible entries, i - window < j <= i, over the tiles.")
    return True
