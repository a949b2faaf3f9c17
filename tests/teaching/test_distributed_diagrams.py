"""Chapter 10's diagrams: what they draw, read back from the axes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from attn_course.teaching.distributed_diagrams import plot_causal_pairs, plot_ring_schedule  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_ring_schedule_table_writes_the_block_each_rank_holds_at_each_step():
    ax = plot_ring_schedule(3)
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    assert texts[0, 0] == "K,V 0" and texts[1, 0] == "K,V 2" and texts[2, 1] == "K,V 2"   # [step, rank]: (r - s) mod 3
    assert [label.get_text() for label in ax.get_xticklabels()] == ["rank 0", "rank 1", "rank 2"]


@pytest.mark.parametrize("layout, work", [("contiguous", [1, 2, 3, 4]), ("zigzag", [9, 9, 9, 9]),
                                          ("striped", [4, 4, 4, 4])])
def test_causal_pairs_title_counts_each_ranks_pairs(layout, work):
    assert plot_causal_pairs(4, layout).get_title() == f"{layout}: chunk pairs per rank {work}"
