"""attn_course.variants.sparse_score_counts: every count equals the True entries of the package's own masks."""

from __future__ import annotations

import pytest
import torch

from attn_course.core.masks import causal_mask
from attn_course.variants.block_selection import dense_block_mask, moba_blocks
from attn_course.variants.sparse_attention import top_k_keys
from attn_course.variants.sparse_score_counts import block_scores, dense_scores, score_count_rows, top_k_scores


def _random(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_dense_count_is_the_causal_mask(n):
    assert dense_scores(n) == int(causal_mask(n).sum())


@pytest.mark.parametrize("n, k", [(1, 1), (5, 2), (40, 7), (40, 40), (40, 100), (64, 1)])
def test_top_k_count_is_the_true_entries_of_top_k_keys(n, k):
    assert top_k_scores(n, k) == int(top_k_keys(_random(2, n, n), k)[0].sum()) == int(top_k_keys(
        _random(2, n, n, seed=1), k)[1].sum())


def _brute_block_scores(n, block_size):
    """Block scores a causal gate needs: for each query, the complete blocks before its own."""
    blocks = torch.arange(n // block_size)
    return int((blocks[None, :] < (torch.arange(n) // block_size)[:, None]).sum())


@pytest.mark.parametrize("n, block_size, top_blocks", [(8, 2, 1), (64, 8, 0), (64, 8, 3), (64, 8, 100), (48, 16, 2),
                                                       (16, 16, 1), (32, 1, 4)])
def test_block_counts_are_the_true_entries_of_moba_s_dense_block_mask(n, block_size, top_blocks):
    q, k = _random(1, 2, n, 8), _random(1, 2, n, 8, seed=1)
    chosen = moba_blocks(q, k, block_size=block_size, top_k=top_blocks)                 # [1, 2, N, n_blocks]
    mask = dense_block_mask(chosen, block_size)                                          # [1, 2, N, N]
    selection, attention = block_scores(n, block_size, top_blocks)
    assert attention == int(mask[0, 0].sum()) == int(mask[0, 1].sum())
    assert selection == _brute_block_scores(n, block_size)


def test_rows_add_the_indexer_and_the_block_scores_to_the_attention_at_their_widths():
    rows = score_count_rows((64, 128), k=16, block_size=32, top_blocks=1, heads=2, head_dim=8, indexer_heads=3,
                            indexer_dim=4)
    by = {(row.scheme, row.n): row for row in rows}
    assert [(row.scheme, row.n) for row in rows] == [(s, n) for n in (64, 128) for s in ("dense", "top-k",
                                                                                          "MoBA blocks")]
    dense = by["dense", 128]
    assert dense.multiply_adds == 2 * 8 * 128 * 129 // 2 and dense.of_dense == 1.0
    top = by["top-k", 128]
    assert top.selection_scores == dense.attention_scores
    assert top.multiply_adds == 12 * dense.attention_scores + 16 * top.attention_scores
    moba = by["MoBA blocks", 128]
    assert moba.multiply_adds == 16 * (moba.selection_scores + moba.attention_scores)
    assert moba.of_dense == pytest.approx(moba.multiply_adds / dense.multiply_adds)


@pytest.mark.parametrize("call, error, message", [
    (lambda: dense_scores(0), ValueError, r"^dense_scores: n must be >= 1, got 0$"),
    (lambda: top_k_scores(8, 1.5), TypeError, r"^top_k_scores: k must be an int, got float$"),
    (lambda: block_scores(10, 4, 1), ValueError, r"^block_scores: n must be a multiple of block_size=4, got 10$"),
    (lambda: block_scores(8, 4, -1), ValueError, r"^block_scores: top_blocks must be >= 0, got -1$"),
    (lambda: score_count_rows((1000,)), ValueError,
     r"^score_count_rows: lengths\[0\] must be a multiple of block_size=512, got 1000$"),
    (lambda: score_count_rows(1024), TypeError, r"^score_count_rows: lengths must be a sequence of ints, got int$"),
    (lambda: score_count_rows(indexer_heads=0), ValueError, r"^score_count_rows: indexer_heads must be >= 1, got 0$"),
])
def test_bad_inputs_name_the_argument_what_it_got_and_what_was_expected(call, error, message):
    with pytest.raises(error, match=message):
        call()
