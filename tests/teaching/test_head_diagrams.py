"""Tests for attn_course.teaching.head_diagrams: chapter 03's picture of multi-head attention."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from attn_course.teaching.head_diagrams import multi_head_data_flow  # noqa: E402

GREY = "#bbbbbb"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("num_tokens, embed_dim, num_heads", [(3, 8, 2), (2, 12, 3), (4, 4, 1)])
def test_every_matrix_has_its_cells_and_each_heads_columns_share_one_colour(num_tokens, embed_dim, num_heads):
    figure = multi_head_data_flow(num_tokens, embed_dim, num_heads)
    cells = [patch for patch in figure.axes[0].patches if isinstance(patch, Rectangle)]
    d = embed_dim // num_heads
    # X, Q, K, V, the heads side by side and the output are N x E; each head's own output is N x d.
    assert len(cells) == num_tokens * (6 * embed_dim + num_heads * d)
    coloured = {to_hex(cell.get_facecolor()) for cell in cells} - {GREY}
    assert len(coloured) == num_heads
    labels = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert labels == [f"head {h}: columns {h * d}-{(h + 1) * d - 1}" for h in range(num_heads)]


@pytest.mark.parametrize("arguments, error, message", [
    ((3, 8, 3), ValueError, "embed_dim must be a multiple of num_heads, got 8 and 3"),
    ((3, 18, 9), ValueError, "num_heads must be at most 8"),
    ((17, 8, 2), ValueError, "at most 16 tokens and embed_dim 64 are drawn, got 17 and 8"),
    ((3, 128, 2), ValueError, "at most 16 tokens and embed_dim 64 are drawn, got 3 and 128"),
    ((0, 8, 2), ValueError, "num_tokens must be >= 1, got 0"),
    ((3, 8.0, 2), TypeError, "embed_dim must be an int, got float"),
])
def test_bad_sizes_are_refused(arguments, error, message):
    with pytest.raises(error, match=rf"^multi_head_data_flow: {message}"):
        multi_head_data_flow(*arguments)
