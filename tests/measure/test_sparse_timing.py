"""attn_course.measure.sparse_timing: every timed variant computes what its name says, and the crossover."""

from __future__ import annotations

import pytest
import torch

from attn_course.measure import sparse_timing
from attn_course.measure.sparse_timing import SPARSE_VARIANTS, SparseRow, measure_sparse, sparse_crossover

TINY = dict(heads=2, head_dim=8, top_k=8, block_size=16, top_blocks=1, indexer_dim=4, repeats=1, budget_s=0)


def _float64_masked_attention(q, k, v, mask):
    """Softmax attention under a bool mask, written out in float64."""
    scores = (q.double() @ k.double().transpose(-2, -1)) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v.double()


def test_gathered_attention_equals_attention_under_the_mask_of_the_gathered_keys():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=generator) for _ in range(3))
    index = torch.rand(2, 3, 40, 40, generator=generator).argsort(-1)[..., :6]            # [B, H, N, 6], distinct
    valid = (torch.rand(2, 3, 40, 6, generator=generator) < 0.8) & (index <= torch.arange(40)[:, None])
    mask = torch.zeros(2, 3, 40, 40, dtype=torch.bool).scatter_(-1, index, valid)         # [B, H, N, N]
    out = sparse_timing._gather_attention(q, k, v, index, valid, chunk=16)
    some = valid.any(-1)                                                                   # a row with no key is NaN
    assert some.float().mean() > 0.5
    assert (out.double() - _float64_masked_attention(q, k, v, mask))[some].abs().max() < 1e-5


def test_every_variant_matches_attention_under_its_selection_and_rows_come_in_order():
    rows = measure_sparse((32, 64), **TINY)
    assert [(row.variant, row.n) for row in rows] == [(name, n) for n in (32, 64) for name in SPARSE_VARIANTS]
    assert all(row.max_difference < 1e-5 and row.seconds > 0 for row in rows)
    keys = {(row.variant, row.n): row.keys_per_query for row in rows}
    assert keys["dense sdpa", 64] == 64 and keys["top-k gather", 64] == 8 and keys["blocks gather", 64] == 32
    assert keys["blocks gather", 32] == 32                                                # never above N


def test_the_selections_are_those_of_the_package():
    """The top-k rows read the lightning indexer's top_k_keys; the block rows MoBA's dense_block_mask."""
    from attn_course.variants.block_selection import dense_block_mask, moba_blocks

    generator = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 2, 64, 8, generator=generator), torch.randn(1, 2, 64, 8, generator=generator)
    chosen = moba_blocks(q, k, block_size=16, top_k=2)
    index, valid = sparse_timing._block_index(chosen, 16, 2)
    mask = torch.zeros(1, 2, 64, 64, dtype=torch.bool)
    mask.scatter_(-1, index, valid)                                                        # distinct keys
    assert torch.equal(mask, dense_block_mask(chosen, 16))
    scores = torch.randn(1, 64, 64, generator=generator)
    index, valid = sparse_timing._top_k_index(scores, 5, heads=2)
    mask = torch.zeros(1, 2, 64, 64, dtype=torch.bool).scatter_(-1, index, valid)
    from attn_course.variants.sparse_attention import top_k_keys

    assert torch.equal(mask, top_k_keys(scores, 5)[:, None].expand(-1, 2, -1, -1))


def test_a_variant_that_computes_the_wrong_thing_is_refused_not_timed(monkeypatch):
    real = sparse_timing._gather_attention
    monkeypatch.setattr(sparse_timing, "_gather_attention", lambda *args, **kwargs: real(*args, **kwargs) + 1e-3)
    monkeypatch.setattr(sparse_timing, "best_time", lambda *args, **kwargs: pytest.fail("a wrong result was timed"))
    with pytest.raises(RuntimeError, match=r"^measure_sparse: top-k gather differs from its reference by 0.001 "):
        measure_sparse((32,), **TINY, variants=("top-k gather",))


def test_crossover_finds_where_the_sparse_variant_stays_faster():
    rows = [SparseRow(name, n, 0, seconds, 0.0) for name, n, seconds in (
        ("dense sdpa", 100, 1.0), ("blocks gather", 100, 3.0), ("dense sdpa", 200, 2.0), ("blocks gather", 200, 1.0),
        ("dense sdpa", 400, 4.0), ("blocks gather", 400, 1.0))]
    found = sparse_crossover(rows, "blocks gather")
    assert found.lengths == (100, 200, 400) and found.time_n == 200 and found.seconds_ratio == (3.0, 0.5, 0.25)
    assert 100 < found.time_n_interpolated < 200 and "from N = 200" in found.describe()
    slower = sparse_crossover([SparseRow(r.variant, r.n, 0, 1.0, 0.0) for r in rows], "blocks gather")
    assert slower.time_n is None and "is not faster than dense sdpa for N <= 400" in slower.describe()


@pytest.mark.parametrize("call, error, message", [
    (lambda: measure_sparse((48,), block_size=32), ValueError,
     r"lengths\[0\] must be a multiple of block_size=32, got 48"),
    (lambda: measure_sparse(()), ValueError, r"lengths must not be empty"),
    (lambda: measure_sparse((64,), variants=("dense",)), ValueError, r"variants\[0\] must be one of .*, got 'dense'"),
    (lambda: measure_sparse((64,), top_k=0), ValueError, r"top_k must be >= 1, got 0"),
    (lambda: measure_sparse((64,), indexer_dim=1), ValueError, r"indexer_dim must be >= 2 .*, got 1"),
    (lambda: measure_sparse((64,), budget_s=-1), ValueError, r"budget_s must be >= 0 and finite, got -1"),
    (lambda: measure_sparse((64,), threads=1.0), TypeError, r"threads must be an int, got float"),
])
def test_bad_inputs_name_the_argument_what_it_got_and_what_was_expected(call, error, message):
    with pytest.raises(error, match=rf"^measure_sparse: {message}"):
        call()


def test_crossover_refuses_rows_without_two_common_lengths_and_unknown_names():
    rows = [SparseRow("dense sdpa", 64, 64, 1.0, 0.0), SparseRow("top-k gather", 64, 8, 1.0, 0.0)]
    with pytest.raises(ValueError, match=r"^sparse_crossover: rows must hold 'dense sdpa' and 'top-k gather' at two"):
        sparse_crossover(rows, "top-k gather")
    with pytest.raises(ValueError, match=r"^sparse_crossover: sparse must be one of .*, got 'top-k'"):
        sparse_crossover(rows, "top-k")
    with pytest.raises(TypeError, match=r"^sparse_crossover: rows\[0\] must be SparseRow, got dict"):
        sparse_crossover([{}], "top-k gather")
