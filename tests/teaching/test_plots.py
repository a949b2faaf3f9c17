"""Tests for attn_course.teaching.plots: what is drawn, where, and the PNG bytes."""

from __future__ import annotations

import struct

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from attn_course.teaching.plots import attention_heatmap, figure_png, heatmap, weight_bars

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Not symmetric, so that a transposed drawing would show.
WEIGHTS = torch.tensor([[0.7, 0.2, 0.1], [0.05, 0.15, 0.8]])         # [N_q=2, N_k=3]
QUERIES = ["cat", "sat"]
KEYS = ["the", "cat", "sat"]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def tick_texts(labels) -> list[str]:
    return [label.get_text() for label in labels]


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from the PNG's IHDR chunk (bytes 16 to 24)."""
    return struct.unpack(">II", data[16:24])


# --- attention_heatmap ----------------------------------------------------------------------


def test_heatmap_returns_axes_with_key_and_query_tick_labels():
    ax = attention_heatmap(WEIGHTS, QUERIES, KEYS, title="a map")
    assert isinstance(ax, Axes)
    assert tick_texts(ax.get_xticklabels()) == KEYS
    assert tick_texts(ax.get_yticklabels()) == QUERIES
    assert ax.get_title() == "a map"


def test_heatmap_key_labels_default_to_query_labels():
    ax = attention_heatmap(torch.eye(3), KEYS)
    assert tick_texts(ax.get_xticklabels()) == KEYS
    assert tick_texts(ax.get_yticklabels()) == KEYS


def test_heatmap_image_holds_weights_with_queries_as_rows():
    ax = attention_heatmap(WEIGHTS, QUERIES, KEYS)
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), WEIGHTS.numpy())


def test_heatmap_annotates_each_cell_with_its_weight():
    ax = attention_heatmap(WEIGHTS, QUERIES, KEYS)
    cells = {(round(text.get_position()[1]), round(text.get_position()[0])): text.get_text()
             for text in ax.texts}                                  # (row, col) -> text
    expected = {(0, 0): "0.70", (0, 1): "0.20", (0, 2): "0.10",
                (1, 0): "0.05", (1, 1): "0.15", (1, 2): "0.80"}
    assert cells == expected


def test_heatmap_annotation_can_be_turned_off():
    assert len(attention_heatmap(WEIGHTS, QUERIES, KEYS, annotate=False).texts) == 0
    big = torch.full((13, 13), 1 / 13)
    assert len(attention_heatmap(big, [str(i) for i in range(13)]).texts) == 0  # default: off


def test_heatmap_draws_on_a_given_axes_and_accepts_weights_that_require_grad():
    figure, ax = plt.subplots()
    weights = WEIGHTS.clone().requires_grad_()
    assert attention_heatmap(weights, QUERIES, KEYS, ax=ax) is ax
    assert ax.figure is figure


@pytest.mark.parametrize(
    ("queries", "keys"),
    [(["cat"], KEYS), (QUERIES, ["the", "cat"]), (QUERIES + ["x"], KEYS)],
    ids=["too-few-query-labels", "too-few-key-labels", "too-many-query-labels"],
)
def test_heatmap_with_wrong_label_count_raises_value_error(queries, keys):
    with pytest.raises(ValueError, match="attention_heatmap: .*labels"):
        attention_heatmap(WEIGHTS, queries, keys)


def test_heatmap_rejects_bad_weights_and_labels():
    with pytest.raises(ValueError, match="2-D"):
        attention_heatmap(WEIGHTS.unsqueeze(0), QUERIES, KEYS)
    with pytest.raises(TypeError, match="attention_weights"):
        attention_heatmap(torch.ones(2, 3, dtype=torch.int64), QUERIES, KEYS)
    with pytest.raises(TypeError, match="query_tokens"):
        attention_heatmap(WEIGHTS, "ab", KEYS)


# --- weight_bars ----------------------------------------------------------------------------


def test_weight_bars_returns_axes_with_token_labels_and_bar_heights():
    weights = torch.tensor([0.1, 0.6, 0.3])
    ax = weight_bars(weights, KEYS, title="one query")
    assert isinstance(ax, Axes)
    assert tick_texts(ax.get_xticklabels()) == KEYS
    np.testing.assert_allclose([bar.get_height() for bar in ax.patches], weights.numpy())
    assert ax.get_title() == "one query"


def test_weight_bars_highlights_only_the_requested_bar():
    ax = weight_bars(torch.tensor([0.1, 0.6, 0.3]), KEYS, highlight=2)
    colors = [bar.get_facecolor() for bar in ax.patches]
    assert colors[0] == colors[1] != colors[2]
    assert colors[2] == to_rgba("tab:orange")


def test_weight_bars_legend_names_only_the_highlighted_bar():
    ax = weight_bars(torch.tensor([0.1, 0.6, 0.3]), KEYS, highlight=2, highlight_label='the query, "sat"')
    legend = ax.get_legend()
    assert [text.get_text() for text in legend.get_texts()] == ['the query, "sat"']
    (handle,) = legend.legend_handles
    assert handle.get_facecolor() == to_rgba("tab:orange")


def test_weight_bars_without_highlight_label_draw_no_legend():
    assert weight_bars(torch.tensor([0.1, 0.6, 0.3]), KEYS, highlight=1).get_legend() is None


def test_weight_bars_reject_a_highlight_label_without_a_highlight():
    with pytest.raises(ValueError, match="weight_bars: highlight_label needs highlight"):
        weight_bars(torch.tensor([0.1, 0.6, 0.3]), KEYS, highlight_label="the query")
    with pytest.raises(TypeError, match="weight_bars: highlight_label must be a str"):
        weight_bars(torch.tensor([0.1, 0.6, 0.3]), KEYS, highlight=0, highlight_label=3)


@pytest.mark.parametrize("highlight, error", [(3, ValueError), (-1, ValueError), (1.0, TypeError)])
def test_weight_bars_reject_a_highlight_that_is_not_a_bar(highlight, error):
    with pytest.raises(error, match="weight_bars: highlight"):
        weight_bars(torch.tensor([0.1, 0.6, 0.3]), KEYS, highlight=highlight)


def test_weight_bars_label_each_bar_with_its_weight():
    ax = weight_bars(torch.tensor([0.125, 0.5, 0.375]), KEYS)
    assert sorted(text.get_text() for text in ax.texts) == ["0.12", "0.38", "0.50"]


def test_weight_bars_with_wrong_label_count_raises_value_error():
    with pytest.raises(ValueError, match="weight_bars: tokens must have 3 labels, got 2"):
        weight_bars(torch.tensor([0.1, 0.6, 0.3]), ["a", "b"])


def test_weight_bars_reject_two_dimensional_or_integer_weights():
    with pytest.raises(ValueError, match="1-D"):
        weight_bars(WEIGHTS, KEYS)
    with pytest.raises(TypeError, match="weights"):
        weight_bars(torch.tensor([1, 0, 0]), KEYS)


# --- figure_png -----------------------------------------------------------------------------


def test_figure_png_returns_png_bytes_identical_across_renders():
    ax = attention_heatmap(WEIGHTS, QUERIES, KEYS)
    first, second = figure_png(ax.figure), figure_png(ax.figure)
    assert isinstance(first, bytes) and first.startswith(PNG_SIGNATURE)
    assert first == second


def test_figure_png_bytes_differ_for_different_figures():
    first = figure_png(weight_bars(torch.tensor([0.1, 0.6, 0.3]), KEYS).figure)
    second = figure_png(weight_bars(torch.tensor([0.6, 0.1, 0.3]), KEYS).figure)
    assert first != second


def test_figure_png_size_follows_dpi():
    figure = Figure(figsize=(4, 3))
    figure.add_subplot().plot([0, 1], [1, 0])
    assert png_size(figure_png(figure, dpi=50)) == (200, 150)
    assert png_size(figure_png(figure)) == (400, 300)               # default dpi 100


@pytest.mark.parametrize("not_a_figure", [None, "figure.png", 3])
def test_figure_png_rejects_anything_but_a_figure(not_a_figure):
    with pytest.raises(TypeError, match="figure_png: figure must be a matplotlib Figure"):
        figure_png(not_a_figure)


def test_figure_png_rejects_an_axes():
    with pytest.raises(TypeError, match="Axes"):
        figure_png(plt.subplots()[1])


# --- heatmap (any labelled matrix) -------------------------------------------------------------


def test_heatmap_draws_each_value_at_its_row_and_column_on_the_given_scale():
    values = torch.tensor([[0.75, 0.8, 0.95], [0.9, 0.72, 1.0]])          # like cosine similarities
    ax = heatmap(values, ["river", "cash"], ["a", "b", "c"], xlabel="head", ylabel="layer",
                 cmap="viridis", vmin=0.7, vmax=1.0)
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    assert texts[(0, 2)] == "0.95" and texts[(1, 1)] == "0.72"            # (row, column)
    image = ax.images[0]
    assert image.get_clim() == (0.7, 1.0) and image.get_cmap().name == "viridis"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("head", "layer")
    assert tick_texts(ax.get_xticklabels()) == ["a", "b", "c"]
    assert ax.get_xticklabels()[0].get_rotation() == 0                   # short labels stay upright
    colors = {t.get_text(): t.get_color() for t in ax.texts}
    assert colors["0.72"] == "white" and colors["1.00"] == "black"        # viridis: dark low, bright high


def test_attention_heatmap_is_a_heatmap_with_attention_axis_names():
    ax = attention_heatmap(WEIGHTS, QUERIES, KEYS)
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("key (attended to)", "query (attending)")


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda: heatmap(torch.ones(3), ["a"]), ValueError, r"heatmap: values must be 2-D"),
        (lambda: heatmap(torch.ones(2, 2), "ab"), TypeError, "heatmap: row_labels must be a sequence of strings"),
        (lambda: heatmap(torch.ones(2, 2), ["a", "b"], ["c"]), ValueError, "column_labels must have 2 labels"),
        (lambda: heatmap(torch.ones(2, 2), ["a", "b"], vmin=1.0, vmax=0.5), ValueError, "vmax must be above"),
        (lambda: heatmap(torch.ones(2, 2, dtype=torch.long), ["a", "b"]), TypeError, "values must be a floating"),
    ],
)
def test_heatmap_rejects_bad_input_by_name(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call()
