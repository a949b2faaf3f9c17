"""The Triton kernels' schedule in plain Python: which key tiles a query tile computes, masks or skips, and how
flash-decoding cuts the keys into splits. The kernels' loop bounds, written out so that chapter 07 can print
and draw them (:mod:`attn_course.teaching.flash_diagrams`); nothing here runs a kernel."""

from __future__ import annotations

from attn_course import _validate
from attn_course.flash.configs import DECODE_SPLIT_ALIGN

__all__ = ["TILE_KINDS", "decode_splits", "forward_key_stages", "tile_counts", "tile_kinds"]

TILE_KINDS = ("unmasked", "masked", "skipped")


def _check_tiles(where: str, n_q: object, n_k: object, block_m: object, block_n: object,
                 causal: object) -> tuple[int, int, int, int, bool]:
    n_q, n_k, block_m, block_n = _validate.integers(where, minimum=1, n_q=n_q, n_k=n_k, block_m=block_m,
                                                    block_n=block_n)
    causal = _validate.boolean(where, "causal", causal)
    if causal and n_q > n_k:
        raise ValueError(f"{where}: causal needs n_q <= n_k (the queries are the last n_q of the n_k "
                         f"positions, bottom-right aligned), got n_q={n_q}, n_k={n_k}")
    return n_q, n_k, block_m, block_n, causal


def _tile_kinds(n_q: int, n_k: int, block_m: int, block_n: int, causal: bool) -> list[list[str]]:
    offset = n_k - n_q if causal else 0
    kinds = []
    for first_row in range(0, n_q, block_m):
        last_row = min(first_row + block_m, n_q) - 1
        row = []
        for first_key in range(0, n_k, block_n):
            last_key = first_key + block_n - 1                          # may lie past n_k
            if causal and first_key > last_row + offset:
                row.append("skipped")                                   # in every row's future
            elif last_key < n_k and (not causal or last_key <= first_row + offset):
                row.append("unmasked")                                  # every row sees every key
            else:
                row.append("masked")
        kinds.append(row)
    return kinds


def tile_kinds(n_q: int, n_k: int, block_m: int, block_n: int, *, causal: bool) -> list[list[str]]:
    """What the forward kernel's key loop does with each (query tile, key tile) pair.

    Query tile ``t`` holds rows ``t·block_m ..`` (the real ones: below ``n_q``); key tile ``s`` holds keys
    ``s·block_n .. (s+1)·block_n - 1``, the last ones past ``n_k`` when ``n_k`` is not a multiple of
    ``block_n``. Query ``i`` sees key ``j`` iff ``j < n_k`` and, when causal, ``j <= i + (n_k - n_q)``
    (bottom-right aligned: the queries are the last ``n_q`` positions, as after a KV cache). A pair is
    ``"skipped"`` if no real row sees any key of the tile, ``"unmasked"`` if every real row sees every key
    and none is past ``n_k``, ``"masked"`` otherwise (the diagonal band and the partial last key tile).
    Query rows past ``n_q`` need no mask: they are loaded as zeros and never stored. Visibility only grows
    with the row and shrinks with the key, so a tile's first and last real rows against its first and last
    key decide it.

    Args:
        n_q, n_k: ``N_q`` queries and ``N_k`` keys (``n_q <= n_k`` when causal).
        block_m, block_n: tile sizes, ``BLOCK_M`` query rows and ``BLOCK_N`` keys.
        causal: whether query ``i`` sees only keys up to ``i + n_k - n_q``.

    Returns:
        ``kinds[t][s]``: ``cdiv(n_q, block_m)`` lists of ``cdiv(n_k, block_n)`` kinds.

    Raises:
        TypeError: a size that is not an int, or ``causal`` not a bool.
        ValueError: a size below 1, or ``causal`` with ``n_q > n_k``.

    Example:
        >>> for row in tile_kinds(300, 300, 128, 64, causal=True):
        ...     print(" ".join(kind[0] for kind in row))
        m m s s s
        u u m m s
        u u u u m
    """
    return _tile_kinds(*_check_tiles("tile_kinds", n_q, n_k, block_m, block_n, causal))


def tile_counts(n_q: int, n_k: int, block_m: int, block_n: int, *, causal: bool) -> dict[str, int]:
    """How many (query tile, key tile) pairs :func:`tile_kinds` finds of each kind (arguments and errors as there).

    Example:
        >>> tile_counts(300, 300, 128, 64, causal=True)
        {'unmasked': 6, 'masked': 5, 'skipped': 4}
    """
    kinds = _tile_kinds(*_check_tiles("tile_counts", n_q, n_k, block_m, block_n, causal))
    return {kind: sum(row.count(kind) for row in kinds) for kind in TILE_KINDS}


def forward_key_stages(n_q: int, n_k: int, block_m: int, block_n: int, *, causal: bool) -> list[tuple[int, int]]:
    """The forward kernel's two stages for each query tile, as ``attention_forward_kernel`` computes them.

    Stage 1 runs key tiles ``0 .. unmasked_end`` with no mask, stage 2 runs ``unmasked_end .. key_end``
    masked, and keys from ``key_end`` on are never loaded. With ``offset = n_k - n_q`` when causal::

        full_tiles_end = (n_k // block_n) * block_n
        unmasked_end = min(full_tiles_end, ((t * block_m + offset + 1) // block_n) * block_n)
        key_end = min(n_k, (t + 1) * block_m + offset)

    and, without causal, ``unmasked_end = full_tiles_end`` and ``key_end = n_k``. These boundaries give
    exactly :func:`tile_kinds`: no fully visible tile is masked, no partly visible one is skipped. (The
    dK/dV kernel's band, the same rule with the query tiles walked instead, is exact too.) Arguments and
    errors as :func:`tile_kinds`.

    Returns:
        One ``(unmasked_end, key_end)`` per query tile, both key positions.

    Example:
        >>> forward_key_stages(300, 300, 128, 64, causal=True)
        [(0, 128), (128, 256), (256, 300)]
    """
    n_q, n_k, block_m, block_n, causal = _check_tiles("forward_key_stages", n_q, n_k, block_m, block_n, causal)
    offset = n_k - n_q
    full_tiles_end = (n_k // block_n) * block_n
    if not causal:
        return [(full_tiles_end, n_k)] * -(-n_q // block_m)
    return [(min(full_tiles_end, ((tile * block_m + offset + 1) // block_n) * block_n),
             min(n_k, (tile + 1) * block_m + offset)) for tile in range(-(-n_q // block_m))]


def decode_splits(n_k: int, num_splits: int, *, align: int = DECODE_SPLIT_ALIGN) -> list[tuple[int, int]]:
    """Cut ``n_k`` keys into ``num_splits`` splits as the flash-decoding kernel does.

    Splits are whole blocks of ``align`` keys (:data:`~attn_course.flash.configs.DECODE_SPLIT_ALIGN`, 128):
    of the ``F = n_k // align`` full blocks, split ``s`` gets blocks ``s·F // S .. (s+1)·F // S``, and the
    last split also takes the keys after the last full block. Sizes differ by at most one block, plus the
    tail in the last split, and no split is empty while ``S <= max(F, 1)``.

    Args:
        n_k: ``N_k``, the keys in the cache.
        num_splits: ``S``, from 1 to ``max(n_k // align, 1)``.
        align: keys per block; every split but the last starts and ends on a multiple of it.

    Returns:
        ``S`` pairs ``(start, end)`` of key positions, covering ``0 .. n_k`` in order.

    Raises:
        TypeError: an argument that is not an int.
        ValueError: an argument below 1, or more splits than blocks of ``align`` keys.

    Example:
        >>> decode_splits(1000, 4)
        [(0, 128), (128, 384), (384, 640), (640, 1000)]
    """
    where = "decode_splits"
    n_k, num_splits, align = _validate.integers(where, minimum=1, n_k=n_k, num_splits=num_splits, align=align)
    full_blocks = n_k // align
    if num_splits > max(full_blocks, 1):
        raise ValueError(f"{where}: num_splits must be at most max(n_k // align, 1) = {max(full_blocks, 1)} "
                         f"(splits are whole blocks of {align} keys), got num_splits={num_splits}")
    bounds = [s * full_blocks // num_splits * align for s in range(num_splits)] + [n_k]
    return list(zip(bounds[:-1], bounds[1:]))
