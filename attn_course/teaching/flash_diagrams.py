"""Chapter 07's pictures of how the Triton kernels divide the work: the tile schedule, grouped-query heads,
flash-decoding. The schedule itself is :mod:`attn_course.flash.schedule`'s; nothing here runs a kernel. The
colours are Okabe-Ito's, distinct under the common kinds of colour blindness; masked tiles are also hatched."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Polygon, Rectangle

from attn_course import _validate
from attn_course.flash.configs import DECODE_SPLIT_ALIGN
from attn_course.flash.schedule import TILE_KINDS, decode_splits, tile_kinds
from attn_course.teaching.plots import OKABE_ITO

__all__ = ["TILE_COLOURS", "flash_decoding", "grouped_query_heads", "tile_schedule"]

# Okabe-Ito: blue, orange, and a light grey for work that is not done.
TILE_COLOURS = dict(zip(TILE_KINDS, ("#0072B2", "#E69F00", "#DDDDDD")))


def tile_schedule(n_q: int, n_k: int, block_m: int, block_n: int, *, causal: bool) -> Figure:
    """Draw the forward kernel's (query tile, key tile) grid, each tile coloured by its kind
    (:func:`~attn_course.flash.schedule.tile_kinds`, whose arguments and errors these are).

    Tiles are drawn whole, so the partial last tiles reach past ``n_q``/``n_k`` (the dashed lines); keys a
    row does not see are faded, so the diagonal shows through the masked tiles. The legend counts each kind.

    Returns:
        A ``Figure`` with one ``Axes``: keys across, queries down.

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
            axis.add_patch(Rectangle((s * block_n, t * block_m), block_n, block_m, facecolor=TILE_COLOURS[kind],
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
    handles = [Patch(facecolor=color, edgecolor="#777777", hatch="//" if kind == "masked" else None,
                     label=f"{kind}: {sum(row.count(kind) for row in kinds)}") for kind, color in TILE_COLOURS.items()]
    axis.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    mode = "causal (bottom-right)" if causal else "not causal"
    axis.set_title(f"{mode}, N_q = {n_q}, N_k = {n_k}, {block_m} × {block_n} tiles", fontsize=10)
    return figure


def grouped_query_heads(num_heads: int, num_kv_heads: int) -> Figure:
    """Draw grouped-query attention: which of ``H`` query heads read which of ``H_kv`` K/V heads.

    With ``G = H / H_kv``, query head ``h`` reads key/value head ``h // G`` in place (no copy); each K/V
    head's dK/dV program sums the gradients of its ``G`` query heads. ``H_kv = H`` is multi-head
    attention, ``H_kv = 1`` multi-query attention.

    Args:
        num_heads, num_kv_heads: ``H`` and ``H_kv`` (a divisor of ``H``).

    Returns:
        A ``Figure``: a box per query head (top), one per K/V head (bottom, with the query heads its
        dK/dV program sums over), a line from each query head to the K/V head it reads.

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
    num_heads, num_kv_heads = _validate.integers(where, minimum=1, num_heads=num_heads, num_kv_heads=num_kv_heads)
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"{where}: num_heads must be a multiple of num_kv_heads (each K/V head serves "
                         f"num_heads / num_kv_heads query heads), got num_heads={num_heads}, "
                         f"num_kv_heads={num_kv_heads}")
    group = num_heads // num_kv_heads
    figure, axis = plt.subplots(figsize=(max(4.0, 0.75 * num_heads + 1.0), 3.0), layout="constrained")
    width = 0.8
    kv_centres = [(j + 0.5) * group - 0.5 for j in range(num_kv_heads)]  # under the middle of each group
    for h in range(num_heads):
        color = OKABE_ITO[(h // group) % len(OKABE_ITO)]
        axis.add_patch(Rectangle((h - width / 2, 1.6), width, 0.5, facecolor=color, alpha=0.35, edgecolor=color))
        axis.plot([h, kv_centres[h // group]], [1.6, 0.5], color=color, linewidth=1.5)
        axis.text(h, 1.85, f"q {h}", ha="center", va="center", fontsize=8)
    kv_width = max(width, group - 0.2)
    for j, centre in enumerate(kv_centres):
        color = OKABE_ITO[j % len(OKABE_ITO)]
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


def flash_decoding(n_k: int, num_splits: int, block_n: int, *, align: int = DECODE_SPLIT_ALIGN) -> Figure:
    """Draw flash-decoding: the keys cut into splits, one program per split, and the merge.

    Each program streams its split's key tiles with the online softmax and writes a partial output ``O_s``
    with its log-sum-exp ``LSE_s``; a second step merges them, ``LSE = log Σ_s exp(LSE_s)``,
    ``O = Σ_s exp(LSE_s - LSE) · O_s``. (The kernel runs one such program per split and per (batch, K/V
    head), all the group's query heads in its rows.)

    Args:
        n_k, num_splits, align: as :func:`~attn_course.flash.schedule.decode_splits`.
        block_n: keys per tile inside a split (drawn as faint lines); must divide ``align``.

    Returns:
        A ``Figure``: the key axis with its splits and tiles (top), a box per program, arrows into the merge.

    Raises:
        TypeError: an argument that is not an int.
        ValueError: as ``decode_splits``, or ``block_n`` not dividing ``align``.

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
        color = OKABE_ITO[s % len(OKABE_ITO)]
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
        color = OKABE_ITO[s % len(OKABE_ITO)]
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
