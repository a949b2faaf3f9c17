"""attn_course.measure.sparse_retrieval: the retrieval task's limits (all keys, no noise) and its input checks."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.measure.sparse_retrieval import SELECTIONS, RetrievalRow, retrieval_accuracy

SMALL = dict(n=256, head_dim=32, block_size=32, seeds=(0, 1))


def _by(rows):
    return {(row.selection, row.budget): row for row in rows}


def test_reading_every_key_is_dense_attention_for_top_k_and_for_moba():
    rows = _by(retrieval_accuracy(**SMALL, ks=(256,), top_blocks=(7,)))
    dense = rows["dense", 256]
    for key in (("exact top-k", 256), ("indexer top-k", 256), ("MoBA blocks", 7)):
        assert rows[key].accuracy == dense.accuracy, key
        assert rows[key].keys_read == dense.keys_read, key
        assert rows[key].needle_kept == 1.0, key
    # The scored queries are the last N/2: query i reads i + 1 keys, on average (N/2 + N + 1) / 2.
    assert dense.keys_read == pytest.approx((128 + 257) / 2)


def test_without_noise_the_exact_top_1_reads_exactly_the_needle():
    rows = _by(retrieval_accuracy(**SMALL, noise=0.0, ks=(1,), top_blocks=(0,)))
    assert rows["exact top-k", 1].needle_kept == rows["exact top-k", 1].accuracy == 1.0
    assert rows["exact top-k", 1].keys_read == 1.0


def test_curves_fall_as_the_budget_shrinks_and_the_cheap_selections_need_more_keys():
    rows = _by(retrieval_accuracy(**SMALL, ks=(1, 8, 64), top_blocks=(1, 3)))
    indexer = [rows["indexer top-k", k].needle_kept for k in (1, 8, 64)]
    assert indexer == sorted(indexer) and indexer[0] < 0.5 < indexer[-1]
    assert rows["exact top-k", 1].needle_kept > rows["indexer top-k", 1].needle_kept
    # Three MoBA blocks read more keys than k = 64 and still miss more needles than the oracle's top 8.
    assert rows["MoBA blocks", 3].keys_read > 64
    assert rows["MoBA blocks", 3].needle_kept < rows["exact top-k", 8].needle_kept
    assert rows["MoBA blocks", 1].needle_kept < rows["MoBA blocks", 3].needle_kept


def test_rows_are_averages_over_seeds_and_repeatable():
    one = retrieval_accuracy(n=64, head_dim=8, ks=(2,), block_size=16, top_blocks=(1,), seeds=(3,))
    assert one == retrieval_accuracy(n=64, head_dim=8, ks=(2,), block_size=16, top_blocks=(1,), seeds=(3,))
    assert [row.selection for row in one] == ["dense", "exact top-k", "indexer top-k", "MoBA blocks"]
    assert set(SELECTIONS) == {row.selection for row in one} and all(isinstance(r, RetrievalRow) for r in one)
    both = retrieval_accuracy(n=64, head_dim=8, ks=(2,), block_size=16, top_blocks=(1,), seeds=(3, 4))
    four = retrieval_accuracy(n=64, head_dim=8, ks=(2,), block_size=16, top_blocks=(1,), seeds=(4,))
    for mean, a, b in zip(both, one, four):
        assert math.isclose(mean.accuracy, (a.accuracy + b.accuracy) / 2)


def test_the_global_random_state_is_untouched():
    before = torch.random.get_rng_state()
    retrieval_accuracy(n=64, head_dim=8, ks=(1,), block_size=16, top_blocks=(0,), seeds=(0,))
    assert torch.equal(torch.random.get_rng_state(), before)


@pytest.mark.parametrize("arguments, error, message", [
    (dict(n=100, block_size=64), ValueError, r"n must be even and a multiple of block_size=64, got 100"),
    (dict(n=0), ValueError, r"n must be >= 1, got 0"),
    (dict(head_dim=2.0), TypeError, r"head_dim must be an int, got float"),
    (dict(noise=-1.0), ValueError, r"noise must be a finite number >= 0, got -1.0"),
    (dict(noise="1"), TypeError, r"noise must be a number >= 0, got str"),
    (dict(ks=(4, 0)), ValueError, r"ks\[1\] must be >= 1, got 0"),
    (dict(ks=4), TypeError, r"ks must be a sequence of ints, got int"),
    (dict(top_blocks=(-1,)), ValueError, r"top_blocks\[0\] must be >= 0, got -1"),
    (dict(seeds=()), ValueError, r"seeds must not be empty"),
    (dict(indexer_dim=True), TypeError, r"indexer_dim must be an int, got bool"),
])
def test_bad_inputs_name_the_argument_what_it_got_and_what_was_expected(arguments, error, message):
    with pytest.raises(error, match=rf"^retrieval_accuracy: {message}$"):
        retrieval_accuracy(**arguments)
