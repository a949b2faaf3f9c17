"""Tests for attn_course.teaching.flash_diagrams: what each figure of chapter 07 draws."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

from attn_course.flash.schedule import decode_splits, tile_kinds  # noqa: E402
from attn_course.teaching.flash_diagrams import (  # noqa: E402
    TILE_COLOURS,
    flash_decoding,
    grouped_query_heads,
    tile_schedule,
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# --- figures ---------------------------------------------------------------------------------


def tile_patches(figure) -> list[Rectangle]:
    return [patch for patch in figure.axes[0].patches if patch.get_label().startswith("tile ")]


@pytest.mark.parametrize("n_q, n_k, block_m, block_n, causal", [(300, 300, 128, 64, True), (300, 300, 128, 64, False),
                                                                (100, 700, 64, 64, True), (1, 1000, 128, 64, True)])
def test_tile_schedule_draws_one_cell_per_tile_in_its_kinds_colour(n_q, n_k, block_m, block_n, causal):
    kinds = tile_kinds(n_q, n_k, block_m, block_n, causal=causal)
    figure = tile_schedule(n_q, n_k, block_m, block_n, causal=causal)
    patches = tile_patches(figure)
    assert len(patches) == len(kinds) * len(kinds[0])
    for patch in patches:
        t, s = (int(index) for index in patch.get_label().split()[1].rstrip(":").split(","))
        assert patch.get_xy() == (s * block_n, t * block_m)
        assert patch.get_facecolor() == to_rgba(TILE_COLOURS[kinds[t][s]])
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert legend == [f"{kind}: {sum(row.count(kind) for row in kinds)}" for kind in TILE_COLOURS]
    assert f"N_q = {n_q}, N_k = {n_k}" in figure.axes[0].get_title()


def test_grouped_query_heads_links_each_query_head_to_its_group():
    figure = grouped_query_heads(8, 2)
    axis = figure.axes[0]
    texts = [text.get_text() for text in axis.texts]
    assert [t for t in texts if t.startswith("q ")] == [f"q {h}" for h in range(8)]
    assert [t for t in texts if t.startswith("K/V head")] == ["K/V head 0", "K/V head 1"]
    assert [t for t in texts if t.startswith("dK")] == ["dK, dV: sum over q 0–3", "dK, dV: sum over q 4–7"]
    lines = axis.get_lines()
    assert len(lines) == 8
    centres = {0: 1.5, 1: 5.5}                                   # under the middle of each group of 4
    for h, line in enumerate(lines):
        assert list(line.get_xdata()) == [h, centres[h // 4]]
    assert "h // 4" in axis.get_title()


@pytest.mark.parametrize("num_heads, num_kv_heads", [(1, 1), (4, 4), (8, 1), (12, 3)])
def test_grouped_query_heads_draws_every_head(num_heads, num_kv_heads):
    axis = grouped_query_heads(num_heads, num_kv_heads).axes[0]
    texts = [text.get_text() for text in axis.texts]
    assert sum(t.startswith("q ") for t in texts) == num_heads
    assert sum(t.startswith("K/V head") for t in texts) == num_kv_heads
    assert len(axis.get_lines()) == num_heads


def test_flash_decoding_draws_a_chunk_and_a_program_per_split_and_arrows_into_the_merge():
    splits = decode_splits(1000, 4)
    axis = flash_decoding(1000, 4, 64).axes[0]
    texts = [text.get_text() for text in axis.texts]
    assert [t for t in texts if t.startswith("keys ")] == [f"keys {a}–{b - 1}" for a, b in splits]
    assert [t.splitlines()[0] for t in texts if t.startswith("program")] == [f"program {s}" for s in range(4)]
    assert sum(t.startswith("merge") for t in texts) == 1
    assert len([p for p in axis.patches if isinstance(p, FancyArrowPatch)]) == 2 * 4
    drawn = [p for p in axis.patches if p.get_label().startswith("split")]
    assert [(p.get_x(), p.get_x() + p.get_width()) for p in drawn] == [tuple(map(float, s)) for s in splits]


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("arguments, causal, error, name", [
    ((0, 10, 64, 64), False, ValueError, "n_q"),
    ((10, 10, 64, 64), 1, TypeError, "causal"),
    ((20, 10, 64, 64), True, ValueError, "n_q <= n_k"),
])
def test_tile_schedule_names_the_bad_argument(arguments, causal, error, name):
    with pytest.raises(error, match=name):
        tile_schedule(*arguments, causal=causal)


def test_grouped_query_heads_needs_whole_groups():
    with pytest.raises(ValueError, match="num_heads must be a multiple of num_kv_heads"):
        grouped_query_heads(8, 3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        grouped_query_heads(8, 0)
    with pytest.raises(TypeError, match="num_heads"):
        grouped_query_heads("8", 2)


def test_flash_decoding_names_the_bad_argument():
    with pytest.raises(ValueError, match=r"num_splits must be at most max\(n_k // align, 1\) = 7"):
        flash_decoding(1000, 8, 64)
    with pytest.raises(ValueError, match="block_n must divide align=128"):
        flash_decoding(1000, 4, 48)
    with pytest.raises(TypeError, match="block_n"):
        flash_decoding(1000, 4, "64")
