"""Plots the chapters share: labelled heatmaps (attention maps among them) and weight bar charts."""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from attn_course import _validate

__all__ = ["OKABE_ITO", "heatmap", "attention_heatmap", "weight_bars", "figure_png"]

#: Okabe and Ito's eight colours, distinct under the common kinds of colour blindness: the course's diagrams
#: colour heads, groups and splits with them, in this order.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")


def heatmap(values: torch.Tensor, row_labels: Sequence[str], column_labels: Sequence[str] | None = None, *,
            ax: Axes | None = None, title: str | None = None, annotate: bool | None = None, xlabel: str = "",
            ylabel: str = "", cmap: str = "Blues", vmin: float = 0.0, vmax: float | None = None) -> Axes:
    """Draw a labelled matrix, each value written in its cell: the picture behind every map in the course.

    Args:
        values: ``[R, C]``.
        row_labels, column_labels: ``R`` and ``C`` labels (``column_labels`` defaults to ``row_labels``).
        ax: where to draw; a new figure when omitted.
        title, xlabel, ylabel: texts of the axes.
        annotate: write each value in its cell; defaults to True up to 12 × 12.
        cmap, vmin, vmax: the colour scale (``vmax`` defaults to the largest value).

    Returns:
        The ``Axes`` drawn on.

    Raises:
        TypeError: values not a floating tensor, or labels not sequences of strings.
        ValueError: values not 2-D, label counts that do not match, or ``vmax <= vmin``.

    Example:
        >>> ax = heatmap(torch.tensor([[0.9, 0.1], [0.3, 0.7]]), ["a", "b"], xlabel="key")
        >>> [text.get_text() for text in ax.texts]
        ['0.90', '0.10', '0.30', '0.70']
    """
    where = "heatmap"
    values = _validate.matrix(where, "values", values, axes="[R, C]")
    column_labels = row_labels if column_labels is None else column_labels
    _validate.labels(where, "row_labels", row_labels, values.shape[0])
    _validate.labels(where, "column_labels", column_labels, values.shape[1])
    if vmax is not None and vmax <= vmin:
        raise ValueError(f"{where}: vmax must be above vmin={vmin}, got {float(vmax)}")
    return _heatmap(values, row_labels, column_labels, ax, title, annotate, xlabel, ylabel, cmap, vmin, vmax)


def _heatmap(values, row_labels, column_labels, ax, title, annotate, xlabel, ylabel, cmap, vmin, vmax) -> Axes:
    values = values.detach().float().cpu()
    vmax = max(float(values.max()), vmin + 1e-9) if vmax is None else float(vmax)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.55 * len(column_labels), 0.8 + 0.5 * len(row_labels)))
    image = ax.imshow(values.numpy(), cmap=cmap, vmin=vmin, vmax=vmax)
    rotate = max(map(len, column_labels), default=0) > 2         # words slant, digits stay upright
    ax.set_xticks(range(len(column_labels)), column_labels, rotation=45 if rotate else 0,
                  ha="right" if rotate else "center")
    ax.set_yticks(range(len(row_labels)), row_labels)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    if annotate is None:
        annotate = max(values.shape) <= 12
    if annotate:
        for row in range(values.shape[0]):
            for col in range(values.shape[1]):
                value = float(values[row, col])
                red, green, blue, _ = image.cmap(image.norm(value))           # the cell's colour
                dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5        # perceived brightness
                ax.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=8,
                        color="white" if dark else "black")
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if title:
        ax.set_title(title)
    return ax


def attention_heatmap(attention_weights: torch.Tensor, query_tokens: Sequence[str],
                      key_tokens: Sequence[str] | None = None, *, ax: Axes | None = None, title: str | None = None,
                      annotate: bool | None = None) -> Axes:
    """Draw an attention map ``[N_q, N_k]``: one row per query token, one column per key token (``key_tokens``
    defaults to ``query_tokens``); a :func:`heatmap` otherwise, whose other arguments, result and errors these are.
    """
    where = "attention_heatmap"
    weights = _validate.matrix(where, "attention_weights", attention_weights)
    key_tokens = query_tokens if key_tokens is None else key_tokens
    _validate.labels(where, "query_tokens", query_tokens, weights.shape[0])
    _validate.labels(where, "key_tokens", key_tokens, weights.shape[1])
    return _heatmap(weights, query_tokens, key_tokens, ax, title, annotate, "key (attended to)", "query (attending)",
                    "Blues", 0.0, None)


def weight_bars(weights: torch.Tensor, tokens: Sequence[str], *, ax: Axes | None = None, highlight: int | None = None,
                highlight_label: str | None = None, title: str | None = None) -> Axes:
    """Bar chart of one query's attention weights over the tokens.

    Args:
        weights: ``[N_k]``; tokens: ``N_k`` labels.
        ax: where to draw; a new figure when omitted.
        highlight: index of a bar to draw in another colour (e.g. the query itself).
        highlight_label: what the highlighted bar is (e.g. ``'the query, "bank"'``), shown in a legend (none
            without it); needs ``highlight``.
        title: optional title.

    Returns:
        The ``Axes`` drawn on.

    Raises:
        TypeError: weights not a floating tensor, ``highlight`` not an int, ``highlight_label`` not a string.
        ValueError: weights not 1-D, a label count that does not match, ``highlight`` out of range, or
            ``highlight_label`` without ``highlight``.

    Example:
        >>> ax = weight_bars(torch.tensor([0.2, 0.8]), ["bank", "river"], highlight=0,
        ...                  highlight_label="the query")
        >>> [text.get_text() for text in ax.get_legend().get_texts()]
        ['the query']
    """
    where = "weight_bars"
    weights = _validate.floating_tensor(where, "weights", weights)
    if weights.dim() != 1:
        raise ValueError(f"{where}: weights must be 1-D [N_k], got shape {_validate.shape_str(weights)}")
    _validate.labels(where, "tokens", tokens, weights.shape[0])
    if highlight is not None:
        highlight = _validate.integer(where, "highlight", highlight, minimum=0)
        if highlight >= weights.shape[0]:
            raise ValueError(f"{where}: highlight={highlight} is out of range; it must be below {weights.shape[0]}")
    if highlight_label is not None:
        if not isinstance(highlight_label, str):
            raise TypeError(f"{where}: highlight_label must be a str, got {type(highlight_label).__name__}")
        if highlight is None:
            raise ValueError(f"{where}: highlight_label needs highlight, the index of the bar it names")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    values = weights.detach().float().cpu().tolist()
    colors = ["tab:orange" if index == highlight else "tab:blue" for index in range(len(values))]
    bars = ax.bar(range(len(values)), values, color=colors)
    ax.bar_label(bars, labels=[f"{value:.2f}" for value in values], fontsize=8)
    ax.set_xticks(range(len(tokens)), tokens)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("attention weight")
    if highlight_label is not None:
        bars[highlight].set_label(highlight_label)
        ax.legend(handles=[bars[highlight]], loc="upper right", fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def figure_png(figure: Figure, *, dpi: int = 100) -> bytes:
    """Render a matplotlib figure to PNG bytes (for an ``ipywidgets.Image``)."""
    if not isinstance(figure, Figure):
        raise TypeError(f"figure_png: figure must be a matplotlib Figure, got {type(figure).__name__}")
    buffer = io.BytesIO()
    # Matplotlib's PNGs carry no date; without the "Software" entry (matplotlib's version) the
    # bytes depend only on the figure, so a re-run notebook stores the same image.
    figure.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return buffer.getvalue()

