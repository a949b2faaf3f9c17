"""Pictures of how the Triton kernels divide the work: tiles, grouped-query heads, flash-decoding.

* :func:`tile_kinds` classifies each (query tile, key tile) pair of the forward kernel's key loop
  as ``"unmasked"``, ``"masked"`` or ``"skipped"`` (:func:`tile_counts` counts them);
  :func:`forward_key_stages` reimplements the kernel's own stage boundaries (``unmasked_end``,
  ``key_end``), and :func:`tile_schedule` draws the classification.
* :func:`grouped_query_heads` draws which query heads share which key/value head.
* :func:`decode_splits` cuts the key axis into splits as the flash-decoding kernel does, and
  :func:`flash_decoding` draws the splits, their partial results and the merge.

Nothing here runs a kernel: these are pure functions of the sizes, and figures drawn from them.
The colours are from the Okabe-Ito palette, which stays distinct under the common kinds of colour
blindness; masked tiles are also hatched, so the picture reads in grey as well.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Polygon, Rectangle

from attn_course import _validate

__all__ = ["TILE_KINDS", "tile_kinds", "tile_counts", "forward_key_stages", "tile_schedule", "grouped_query_heads",
           "decode_splits", "flash_decoding"]

# Okabe-Ito: blue, orange, and a light grey for work that is not done.
TILE_KINDS = {"unmasked": "#0072B2", "masked": "#E69F00", "skipped": "#DDDDDD"}
_GROUP_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_tiles(where: str, n_q: object, n_k: object, block_m: object, block_n: object,
                 causal: object) -> tuple[int, int, int, int, bool]:
    n_q = _validate.integer(where, "n_q", n_q, minimum=1)
    n_k = _validate.integer(where, "n_k", n_k, minimum=1)
    block_m = _validate.integer(where, "block_m", block_m, minimum=1)
    block_n = _validate.integer(where, "block_n", block_n, minimum=1)
    causal = _validate.boolean(where, "causal", causal)
    if causal and n_q > n_k:
        raise ValueError(f"{where}: causal needs n_q <= n_k (the queries are the last n_q of the n_k "
                         f"positions, bottom-right aligned), got n_q={n_q}, n_k={n_k}")
    return n_q, n_k, block_m, block_n, causal


def tile_kinds(n_q: int, n_k: int, block_m: int, block_n: int, *, causal: bool) -> list[list[str]]:
    """What the forward kernel's key loop does with each (query tile, key tile) pair.

    Query tile ``t`` holds rows ``t·block_m ..`` (the real ones: below ``n_q``); key tile ``s`` holds
    keys ``s·block_n .. (s+1)·block_n - 1``, the last ones past ``n_k`` when ``n_k`` is not a
    multiple of ``block_n``. Query ``i`` sees key ``j`` iff ``j < n_k`` and, when causal,
    ``j <= i + (n_k - n_q)`` (bottom-right aligned: the queries are the last ``n_q`` positions,
    as after a KV cache). A pair is

    * ``"skipped"`` if no real row sees any key of the tile;
    * ``"unmasked"`` if every real row sees every key of the tile and none is past ``n_k``;
    * ``"masked"`` otherwise: the diagonal band, and the partial last key tile.

    Query rows past ``n_q`` (in the last query tile) need no mask in the key loop: they are loaded
    as zeros and never stored. Because visibility only grows with the row and shrinks with the key,
    the first real row and the last real row of a tile, against its first and last key, decide it.

    Args:
        n_q, n_k: numbers of queries ``N_q`` and keys ``N_k`` (``n_q <= n_k`` when causal).
        block_m, block_n: tile sizes, ``BLOCK_M`` query rows and ``BLOCK_N`` keys.
        causal: whether query ``i`` sees only keys up to ``i + n_k - n_q``.

    Returns:
        ``kinds[t][s]``: ``cdiv(n_q, block_m)`` lists of ``cdiv(n_k, block_n)`` strings, each
        ``"unmasked"``, ``"masked"`` or ``"skipped"``.

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
    n_q, n_k, block_m, block_n, causal = _check_tiles("tile_kinds", n_q, n_k, block_m, block_n, causal)
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


def tile_counts(n_q: int, n_k: int, block_m: int, block_n: int, *, causal: bool) -> dict[str, int]:
    """How many (query tile, key tile) pairs :func:`tile_kinds` finds of each kind.

    Args:
        n_q, n_k, block_m, block_n, causal: as in :func:`tile_kinds`.

    Returns:
        ``{"unmasked": ..., "masked": ..., "skipped": ...}``, summing to
        ``cdiv(n_q, block_m) · cdiv(n_k, block_n)``.

    Raises:
        TypeError, ValueError: as :func:`tile_kinds`.

    Example:
        >>> tile_counts(300, 300, 128, 64, causal=True)
        {'unmasked': 6, 'masked': 5, 'skipped': 4}
    """
    kinds = tile_kinds(n_q, n_k, block_m, block_n, causal=causal)
    return {kind: sum(row.count(kind) for row in kinds) for kind in TILE_KINDS}


def forward_key_stages(n_q: int, n_k: int, block_m: int, block_n: int, *, causal: bool) -> list[tuple[int, int]]:
    """The forward kernel's two stages for each query tile, as ``attention_forward_kernel`` computes them.

    Stage 1 runs key tiles ``0 .. unmasked_end`` with no mask, stage 2 runs ``unmasked_end ..
    key_end`` masked, and keys from ``key_end`` on are never loaded. Written out in Python from the
    kernel's formulas (with ``offset = n_k - n_q`` when causal)::

        full_tiles_end = (n_k // block_n) * block_n
        unmasked_end = min(full_tiles_end, ((t * block_m + offset + 1) // block_n) * block_n)
        key_end = min(n_k, (t + 1) * block_m + offset)

    and, without causal, ``unmasked_end = full_tiles_end`` and ``key_end = n_k``. These boundaries
    give exactly the classification of :func:`tile_kinds`: the unmasked stage holds the pairs that
    every real row sees in full, the masked stage every pair that some row sees in part (no fully
    visible tile is masked), and everything from ``key_end`` on is skipped. (The dK/dV kernel's
    band, the same rule with the query tiles walked instead of the key tiles, is exact too.)

    Args:
        n_q, n_k, block_m, block_n, causal: as in :func:`tile_kinds`.

    Returns:
        One ``(unmasked_end, key_end)`` per query tile, both key positions.

    Raises:
        TypeError, ValueError: as :func:`tile_kinds`.

    Example:
        >>> forward_key_stages(300, 300, 128, 64, causal=True)
        [(0, 128), (128, 256), (256, 300)]
    """
    n_q, n_k, block_m, block_n, causal = _check_tiles("forward_key_stages", n_q, n_k, block_m, block_n, causal)
    offset = n_k - n_q
    full_tiles_end = (n_k // block_n) * block_n
    stages = []
    for tile in range(_cdiv(n_q, block_m)):
        if causal:
            unmasked_end = min(full_tiles_end, ((tile * block_m + offset + 1) // block_n) * block_n)
            key_end = min(n_k, (tile + 1) * block_m + offset)
        else:
            unmasked_end, key_end = full_tiles_end, n_k
        stages.append((unmasked_end, key_end))
    return stages


def tile_schedule(n_q: int, n_k: int, block_m: int, block_n: int, *, causal: bool) -> Figure:
    """Draw the (query tile, key tile) grid of the forward kernel, each tile coloured by its kind.

    Tiles are drawn at their full size, so the partial last tiles reach past ``n_q``/``n_k`` (the
    dashed lines); the keys a row does not see are faded, so the diagonal shows through the
    masked tiles. The legend counts the tiles of each kind (from :func:`tile_kinds`).

    Args:
        n_q, n_k, block_m, block_n, causal: as in :func:`tile_kinds`.

    Returns:
        A ``Figure`` with one ``Axes``: keys across, queries down.

    Raises:
        TypeError, ValueError: as :func:`tile_kinds`.

    Example:
        >>> figure = tile_schedule(300, 300, 128, 64, causal=True)
        >>> [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
        ['unmasked: 6', 'masked: 5', 'skipped: 4']
        >>> plt.close(figure)
    """
    kinds = tile_kinds(n_q, n_k, block_m, block_n, causal=causal)
    rows_drawn, keys_drawn = len(kinds) * block_m, len(kinds[0]) * block_n
    figure, axis = plt.subplots(figsize=(1.6 + 4.4 * min(keys_drawn / rows_drawn, 2.0), 4.8), layout="constrained")
    for t, row in enumerate(kinds):
        for s, kind in enumerate(row):
            axis.add_patch(Rectangle((s * block_n, t * block_m), block_n, block_m, facecolor=TILE_KINDS[kind],
                                     hatch="//" if kind == "masked" else None, edgecolor="white", linewidth=2,
                                     label=f"tile {t},{s}: {kind}"))
    # Fade what no row sees: past the last key, and (causal) the future, above j = i + n_k - n_q.
    fade = {"facecolor": "white", "alpha": 0.55, "edgecolor": "none"}
    axis.add_patch(Rectangle((n_k, 0), keys_drawn - n_k, rows_drawn, **fade))
    axis.add_patch(Rectangle((0, n_q), n_k, rows_drawn - n_q, **fade))
    if causal:
        offset = n_k - n_q
        axis.add_patch(Polygon([(offset, 0), (n_k, 0), (n_k, n_q)], closed=True, **fade))
        axis.plot([offset, n_k], [0, n_q], color="black", linewidth=1)
    axis.axvline(n_k, color="black", linestyle="--", linewidth=1)
    axis.axhline(n_q, color="black", linestyle="--", linewidth=1)
    axis.set(xlim=(0, keys_drawn), ylim=(rows_drawn, 0), aspect="equal",
             xlabel=f"key position (tiles of {block_n}; dashed: N_k = {n_k})",
             ylabel=f"query position (tiles of {block_m}; dashed: N_q = {n_q})")
    axis.set_xticks(range(0, keys_drawn + 1, block_n))
    axis.set_yticks(range(0, rows_drawn + 1, block_m))
    counts = tile_counts(n_q, n_k, block_m, block_n, causal=causal)
    handles = [Patch(facecolor=color, edgecolor="#777777", hatch="//" if kind == "masked" else None,
                     label=f"{kind}: {counts[kind]}") for kind, color in TILE_KINDS.items()]
    axis.legend(handles=handles,
                loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    mode = "causal (bottom-right)" if causal else "not causal"
    axis.set_title(f"{mode}, N_q = {n_q}, N_k = {n_k}, {block_m} × {block_n} tiles", fontsize=10)
    return figure


def grouped_query_heads(num_heads: int, num_kv_heads: int) -> Figure:
    """Draw grouped-query attention: which of ``H`` query heads read which of ``H_kv`` K/V heads.

    With ``G = H / H_kv``, query head ``h`` reads key/value head ``h // G`` in place (no copy);
    each K/V head's dK/dV program loops over its ``G`` query heads and sums their gradients.
    ``H_kv = H`` is ordinary multi-head attention, ``H_kv = 1`` multi-query attention.

    Args:
        num_heads: ``H``, the query heads.
        num_kv_heads: ``H_kv``, the key/value heads; must divide ``H``.

    Returns:
        A ``Figure`` with one ``Axes``: a box per query head (top), a box per K/V head (bottom,
        with the query heads its dK/dV program sums over), and one line from each query head to
        the K/V head it reads.

    Raises:
        TypeError: a count that is not an int.
        ValueError: a count below 1, or ``num_heads`` not a multiple of ``num_kv_heads``.

    Example:
        >>> figure = grouped_query_heads(8, 2)
        >>> [text.get_text() for text in figure.axes[0].texts if text.get_text().startswith("K/V")]
        ['K/V head 0', 'K/V head 1']
        >>> plt.close(figure)
    """
    where = "grouped_query_heads"
    num_heads = _validate.integer(where, "num_heads", num_heads, minimum=1)
    num_kv_heads = _validate.integer(where, "num_kv_heads", num_kv_heads, minimum=1)
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"{where}: num_heads must be a multiple of num_kv_heads (each K/V head serves "
                         f"num_heads / num_kv_heads query heads), got num_heads={num_heads}, "
                         f"num_kv_heads={num_kv_heads}")
    group = num_heads // num_kv_heads
    figure, axis = plt.subplots(figsize=(max(4.0, 0.75 * num_heads + 1.0), 3.0), layout="constrained")
    width = 0.8
    kv_centres = [(j + 0.5) * group - 0.5 for j in range(num_kv_heads)]  # under the middle of each group
    for h in range(num_heads):
        color = _GROUP_COLORS[(h // group) % len(_GROUP_COLORS)]
        axis.add_patch(Rectangle((h - width / 2, 1.6), width, 0.5, facecolor=color, alpha=0.35, edgecolor=color))
        axis.plot([h, kv_centres[h // group]], [1.6, 0.5], color=color, linewidth=1.5)
        axis.text(h, 1.85, f"q {h}", ha="center", va="center", fontsize=8)
    kv_width = max(width, group - 0.2)
    for j, centre in enumerate(kv_centres):
        color = _GROUP_COLORS[j % len(_GROUP_COLORS)]
        axis.add_patch(Rectangle((centre - kv_width / 2, 0.0), kv_width, 0.5, facecolor=color, alpha=0.35,
                                 edgecolor=color))
        axis.text(centre, 0.25, f"K/V head {j}", ha="center", va="center", fontsize=8)
        members = f"q {j * group}" if group == 1 else f"q {j * group}–{(j + 1) * group - 1}"
        axis.text(centre, -0.2, f"dK, dV: sum over {members}", ha="center", va="center", fontsize=7,
                  color="#444444")
    axis.set(xlim=(-0.7, num_heads - 0.3), ylim=(-0.4, 2.2))
    axis.axis("off")
    axis.set_title(f"H = {num_heads} query heads, H_kv = {num_kv_heads} K/V heads: "
                   f"query head h reads K/V head h // {group}", fontsize=10)
    return figure


def decode_splits(n_k: int, num_splits: int, *, align: int = 128) -> list[tuple[int, int]]:
    """Cut ``n_k`` keys into ``num_splits`` splits as the flash-decoding kernel does.

    Splits are whole blocks of ``align`` keys (``DECODE_SPLIT_ALIGN`` in
    :mod:`attn_course.flash.kernels`, 128): of the ``F = n_k // align`` full blocks, split ``s``
    gets blocks ``s·F // S .. (s+1)·F // S``, and the last split also takes the keys after the
    last full block. So sizes differ by at most one block, plus the tail in the last split, and no
    split is empty as long as ``S <= max(F, 1)``.

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
    n_k = _validate.integer(where, "n_k", n_k, minimum=1)
    num_splits = _validate.integer(where, "num_splits", num_splits, minimum=1)
    align = _validate.integer(where, "align", align, minimum=1)
    full_blocks = n_k // align
    if num_splits > max(full_blocks, 1):
        raise ValueError(f"{where}: num_splits must be at most max(n_k // align, 1) = {max(full_blocks, 1)} "
                         f"(splits are whole blocks of {align} keys), got num_splits={num_splits}")
    bounds = [s * full_blocks // num_splits * align for s in range(num_splits)] + [n_k]
    return list(zip(bounds[:-1], bounds[1:]))


def flash_decoding(n_k: int, num_splits: int, block_n: int, *, align: int = 128) -> Figure:
    """Draw flash-decoding: the keys cut into splits, one program per split, and the merge.

    Each program streams its split's key tiles with the online softmax and writes a partial output
    ``O_s`` with its log-sum-exp ``LSE_s``; a second step merges them with the log-sum-exp rule
    ``LSE = log Σ_s exp(LSE_s)``, ``O = Σ_s exp(LSE_s - LSE) · O_s``. (The kernel runs one such
    program per split and per (batch, key/value head), all the group's query heads in its rows.)

    Args:
        n_k, num_splits, align: as in :func:`decode_splits`.
        block_n: keys per tile inside a split (drawn as faint lines); must divide ``align``.

    Returns:
        A ``Figure`` with one ``Axes``: the key axis with its splits and tiles (top), a box per
        program (middle), arrows into the merge (bottom).

    Raises:
        TypeError: an argument that is not an int.
        ValueError: as :func:`decode_splits`, or ``block_n`` not dividing ``align``.

    Example:
        >>> figure = flash_decoding(1000, 4, 64)
        >>> sum(text.get_text().startswith("program") for text in figure.axes[0].texts)
        4
        >>> plt.close(figure)
    """
    splits = decode_splits(n_k, num_splits, align=align)
    block_n = _validate.integer("flash_decoding", "block_n", block_n, minimum=1)
    if align % block_n != 0:
        raise ValueError(f"flash_decoding: block_n must divide align={align} (a split holds whole tiles), "
                         f"got block_n={block_n}")
    figure, axis = plt.subplots(figsize=(max(6.4, 1.7 * num_splits), 4.0), layout="constrained")
    # Top: the key axis, split by split, with faint tile boundaries.
    for s, (start, end) in enumerate(splits):
        color = _GROUP_COLORS[s % len(_GROUP_COLORS)]
        axis.add_patch(Rectangle((start, 3.0), end - start, 0.5, facecolor=color, alpha=0.35, edgecolor=color,
                                 label=f"split {s}"))
        for tile_start in range(start + block_n, end, block_n):
            axis.plot([tile_start, tile_start], [3.0, 3.5], color="white", linewidth=0.6)
        axis.text((start + end) / 2, 3.25, f"keys {start}–{end - 1}", ha="center", va="center", fontsize=7)
    axis.text(0, 3.75, f"N_k = {n_k} keys in tiles of {block_n}, cut into S = {num_splits} splits "
              f"(whole blocks of {align})", ha="left", va="center", fontsize=9)
    # Middle: one program per split, writing (O_s, LSE_s); bottom: the merge.
    slot = n_k / num_splits
    merge_centre, merge_top = n_k / 2, 0.6
    for s, (start, end) in enumerate(splits):
        centre = (s + 0.5) * slot
        color = _GROUP_COLORS[s % len(_GROUP_COLORS)]
        axis.add_patch(FancyArrowPatch(((start + end) / 2, 3.0), (centre, 2.25), arrowstyle="-|>",
                                       mutation_scale=10, color=color))
        axis.add_patch(Rectangle((centre - 0.42 * slot, 1.5), 0.84 * slot, 0.75, facecolor="white", edgecolor=color,
                                 linewidth=1.5))
        axis.text(centre, 1.875, f"program {s}\n→ O_{s}, LSE_{s}", ha="center", va="center", fontsize=8)
        axis.add_patch(FancyArrowPatch((centre, 1.5), (merge_centre, merge_top), arrowstyle="-|>",
                                       mutation_scale=10, color=color))
    axis.add_patch(Rectangle((0.1 * n_k, 0.0), 0.8 * n_k, merge_top, facecolor="#F4F4F4", edgecolor="black"))
    axis.text(merge_centre, merge_top / 2, "merge: weigh each O_s by its split's share of the row's\n"
              "sum of exponentials, read from the LSE_s; write O (and LSE)", ha="center", va="center", fontsize=9)
    axis.set(xlim=(-0.02 * n_k, 1.02 * n_k), ylim=(-0.1, 4.0))
    axis.axis("off")
    axis.set_title("flash-decoding: one program per split (and per batch · K/V head), then one merge", fontsize=10)
    return figure
