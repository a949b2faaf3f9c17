"""Plots the chapters share: attention heatmaps and weight bar charts."""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from attn_course import _validate

__all__ = ["attention_heatmap", "weight_bars", "figure_png"]


def attention_heatmap(
    attention_weights: torch.Tensor,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str] | None = None,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    annotate: bool | None = None,
) -> Axes:
    """Draw an attention map: one row per query, one column per key.

    Args:
        attention_weights: ``[N_q, N_k]``.
        query_tokens: ``N_q`` row labels.
        key_tokens: ``N_k`` column labels; defaults to ``query_tokens``.
        ax: where to draw; a new figure when omitted.
        title: optional title.
        annotate: write each weight in its cell; defaults to True up to 12 × 12.

    Returns:
        The ``Axes`` drawn on.

    Raises:
        TypeError: weights not a floating tensor.
        ValueError: weights not 2-D, or label counts that do not match.
    """
    where = "attention_heatmap"
    weights = _validate.floating_tensor(where, "attention_weights", attention_weights)
    if weights.dim() != 2:
        raise ValueError(
            f"{where}: attention_weights must be 2-D [N_q, N_k], "
            f"got shape {_validate.shape_str(weights)}"
        )
    key_tokens = query_tokens if key_tokens is None else key_tokens
    _validate.labels(where, "query_tokens", query_tokens, weights.shape[0])
    _validate.labels(where, "key_tokens", key_tokens, weights.shape[1])
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.55 * len(key_tokens), 0.8 + 0.5 * len(query_tokens)))
    weights = weights.detach().float().cpu()
    image = ax.imshow(weights.numpy(), cmap="Blues", vmin=0.0, vmax=max(float(weights.max()), 1e-9))
    ax.set_xticks(range(len(key_tokens)), key_tokens, rotation=45, ha="right")
    ax.set_yticks(range(len(query_tokens)), query_tokens)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if annotate is None:
        annotate = max(weights.shape) <= 12
    if annotate:
        threshold = 0.6 * float(weights.max())
        for row in range(weights.shape[0]):
            for col in range(weights.shape[1]):
                value = float(weights[row, col])
                color = "white" if value > threshold else "black"
                ax.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=8, color=color)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if title:
        ax.set_title(title)
    return ax


def weight_bars(
    weights: torch.Tensor,
    tokens: Sequence[str],
    *,
    ax: Axes | None = None,
    highlight: int | None = None,
    title: str | None = None,
) -> Axes:
    """Bar chart of one query's attention weights over the tokens.

    Args:
        weights: ``[N_k]``.
        tokens: ``N_k`` labels.
        ax: where to draw; a new figure when omitted.
        highlight: index of a bar to draw in a different colour (e.g. the query itself).
        title: optional title.

    Returns:
        The ``Axes`` drawn on.

    Raises:
        TypeError: weights not a floating tensor.
        ValueError: weights not 1-D, or a label count that does not match.
    """
    where = "weight_bars"
    weights = _validate.floating_tensor(where, "weights", weights)
    if weights.dim() != 1:
        raise ValueError(
            f"{where}: weights must be 1-D [N_k], got shape {_validate.shape_str(weights)}"
        )
    _validate.labels(where, "tokens", tokens, weights.shape[0])
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    values = weights.detach().float().cpu().tolist()
    colors = ["tab:orange" if index == highlight else "tab:blue" for index in range(len(values))]
    bars = ax.bar(range(len(values)), values, color=colors)
    ax.bar_label(bars, labels=[f"{value:.2f}" for value in values], fontsize=8)
    ax.set_xticks(range(len(tokens)), tokens)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("attention weight")
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

