"""Chapter 03's picture of multi-head attention: how the numbers flow from the input through the three
projections, are cut into heads, attended head by head, and merged back. Colours are Okabe-Ito's (distinct
under the common kinds of colour blindness), one per head."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from attn_course import _validate
from attn_course.teaching.plots import OKABE_ITO

__all__ = ["multi_head_data_flow"]

_GREY = "#BBBBBB"


def _grid(axis, left: float, top: float, rows: int, columns: int, colour_of, label: str) -> None:
    """One ``rows x columns`` matrix of cells, its top-left corner at ``(left, top)``, a label above it."""
    for row in range(rows):
        for column in range(columns):
            axis.add_patch(Rectangle((left + column, top + row), 1, 1, facecolor=colour_of(column),
                                     edgecolor="white", linewidth=1))
    axis.text(left + columns / 2, top - 0.4, label, ha="center", va="bottom", fontsize=9)


def _arrow(axis, start: tuple[float, float], end: tuple[float, float], text: str = "") -> None:
    axis.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color="0.3", linewidth=1))
    if text:
        axis.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 - 0.3, text, ha="center", va="bottom", fontsize=8)


def multi_head_data_flow(num_tokens: int = 3, embed_dim: int = 8, num_heads: int = 2) -> Figure:
    """Draw multi-head self-attention as matrices: ``X [N, E]`` → ``Q, K, V [N, E]`` (one projection each,
    every head's columns side by side) → each head's ``[N, d]`` slices attended on their own → the heads'
    outputs side by side ``[N, E]`` → ``W^O``. Each head's columns have their colour throughout.

    Args:
        num_tokens: ``N``, rows of every matrix drawn, at most 16.
        embed_dim: ``E``, at most 64; a multiple of ``num_heads``.
        num_heads: ``H``, at most 8 (one colour each).

    Returns:
        A ``Figure`` with one ``Axes``; its legend names the heads.

    Raises:
        TypeError: an argument that is not an int.
        ValueError: an argument below 1, more than 16 tokens, 64 features or 8 heads, or ``embed_dim`` not a
            multiple of ``num_heads``.

    Example:
        >>> figure = multi_head_data_flow(3, 8, 2)
        >>> [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
        ['head 0: columns 0-3', 'head 1: columns 4-7']
        >>> plt.close(figure)
    """
    where = "multi_head_data_flow"
    num_tokens, embed_dim, num_heads = _validate.integers(where, minimum=1, num_tokens=num_tokens,
                                                          embed_dim=embed_dim, num_heads=num_heads)
    if num_tokens > 16 or embed_dim > 64:       # one drawn cell per number: beyond this nothing can be read
        raise ValueError(f"{where}: at most 16 tokens and embed_dim 64 are drawn, got {num_tokens} and {embed_dim}")
    if num_heads > len(OKABE_ITO):
        raise ValueError(f"{where}: num_heads must be at most {len(OKABE_ITO)} (one colour each), got {num_heads}")
    if embed_dim % num_heads:
        raise ValueError(f"{where}: embed_dim must be a multiple of num_heads, got {embed_dim} and {num_heads}")
    d, n, gap = embed_dim // num_heads, num_tokens, 2.5

    def by_head(column: int) -> str:
        return OKABE_ITO[column // d]

    row_height = n + 2                                            # one row of the figure per Q, K, V
    figure, axis = plt.subplots(figsize=(1.2 + 0.32 * (3 * embed_dim + 2 * num_heads * d + 5 * gap),
                                         0.45 * 3 * row_height + 0.6), layout="constrained")
    _grid(axis, 0, row_height, n, embed_dim, lambda _: _GREY, "X [N, E]")
    left_qkv = embed_dim + gap
    for index, name in enumerate("QKV"):
        top = index * row_height
        _arrow(axis, (embed_dim, row_height + n / 2), (left_qkv, top + n / 2), f"W^{name}")
        _grid(axis, left_qkv, top, n, embed_dim, by_head, f"{name} = X W^{name} [N, E]")
    # Each head attends with its own d columns of Q, K and V; its output is [N, d].
    left_heads = left_qkv + embed_dim + 2 * gap
    middle = (left_qkv + embed_dim + 0.2, 1.5 * row_height - 1)
    axis.text(middle[0] + gap / 2, 3 * row_height - 0.8, "each head takes its own\ncolumns of Q, K and V",
              ha="center", va="bottom", fontsize=8)
    for head in range(num_heads):
        top = (head + 0.5) * (3 * row_height) / num_heads - n / 2 - 1
        _arrow(axis, middle, (left_heads, top + n / 2))
        _grid(axis, left_heads, top, n, d, lambda _, head=head: OKABE_ITO[head],
              f"head {head}: softmax(Q_{head}K_{head}ᵀ/√d) V_{head}")
    left_concat = left_heads + d + 2 * gap
    concat_top = row_height
    for head in range(num_heads):
        top = (head + 0.5) * (3 * row_height) / num_heads - n / 2 - 1
        _arrow(axis, (left_heads + d, top + n / 2), (left_concat + (head + 0.5) * d, concat_top))
    _grid(axis, left_concat, concat_top, n, embed_dim, by_head, "heads side by side [N, E]")
    left_out = left_concat + embed_dim + gap
    _arrow(axis, (left_concat + embed_dim, concat_top + n / 2), (left_out, concat_top + n / 2), "W^O")
    _grid(axis, left_out, concat_top, n, embed_dim, lambda _: _GREY, "output [N, E]")
    axis.set(xlim=(-0.5, left_out + embed_dim + 0.5), ylim=(3 * row_height, -1.2), aspect="equal")
    axis.axis("off")
    axis.legend(handles=[Patch(facecolor=OKABE_ITO[h], label=f"head {h}: columns {h * d}-{(h + 1) * d - 1}")
                         for h in range(num_heads)], loc="lower right", fontsize=8, frameon=False)
    return figure
