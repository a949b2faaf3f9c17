"""previous_token_score and induction_score on hand-built attention whose answer is known."""

from __future__ import annotations

import pytest
import torch

from attn_course.circuits import duplicate_token_score, induction_score, previous_token_score


def _causal_uniform(n: int) -> torch.Tensor:
    """Row i spreads 1 evenly over keys 0 .. i."""
    return torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]


def _offset_pattern(n: int, back: int) -> torch.Tensor:
    """Row i puts all its weight on key i − back (on key 0 while i < back)."""
    pattern = torch.zeros(n, n)
    for i in range(n):
        pattern[i, max(0, i - back)] = 1.0
    return pattern


def test_a_pure_previous_token_head_scores_one_and_an_identity_head_zero():
    assert previous_token_score(_offset_pattern(6, 1)).item() == 1.0
    assert previous_token_score(torch.eye(6)).item() == 0.0


def test_uniform_causal_attention_gives_the_harmonic_mean_of_its_rows():
    n = 10
    expected = sum(1 / (i + 1) for i in range(1, n)) / (n - 1)          # row i: weight 1/(i+1) on key i-1
    assert previous_token_score(_causal_uniform(n)).item() == pytest.approx(expected, rel=1e-6)
    period = 4
    expected = sum(1 / (i + 1) for i in range(period, n)) / (n - period)
    assert induction_score(_causal_uniform(n), period).item() == pytest.approx(expected, rel=1e-6)


def test_an_induction_head_attends_one_after_the_earlier_copy():
    n, period = 12, 5
    perfect = _offset_pattern(n, period - 1)                             # i -> i - P + 1
    assert induction_score(perfect, period).item() == 1.0
    # the off-by-one: attending to the earlier copy itself (i -> i - P) is a duplicate-token head, not induction
    assert induction_score(_offset_pattern(n, period), period).item() == 0.0


def test_only_queries_from_the_period_on_count():
    n, period = 8, 3
    pattern = _offset_pattern(n, period - 1)
    pattern[:period] = 0.0                                               # rows before the repeat do not matter
    pattern[: period, 0] = 1.0
    assert induction_score(pattern, period).item() == 1.0
    half = torch.zeros(n, n)
    half[period:, :] = _offset_pattern(n, period - 1)[period:] * 0.5     # half of every counted row
    assert induction_score(half, period).item() == 0.5


def test_one_number_per_leading_index():
    patterns = torch.stack([_offset_pattern(6, 1), torch.eye(6), _offset_pattern(6, 2)]).view(3, 1, 6, 6)
    patterns = patterns.expand(3, 2, 6, 6)                               # [B, H, N, N]
    assert previous_token_score(patterns).shape == (3, 2)
    # two back: only row 1 (clamped to key 0 = its previous token) counts, 1 of the 5 rows
    assert previous_token_score(patterns)[:, 0].tolist() == pytest.approx([1.0, 0.0, 0.2])
    assert induction_score(patterns, 3)[:, 1].tolist() == [0.0, 0.0, 1.0]


def test_period_one_reads_the_main_diagonal():
    assert induction_score(torch.eye(5), 1).item() == 1.0


@pytest.mark.parametrize("pattern, error, words", [
    (torch.ones(3, 4), ValueError, "square"),
    (torch.ones(5), ValueError, "square"),
    (torch.ones(1, 1), ValueError, "N >= 2"),
    (torch.ones(4, 4, dtype=torch.long), TypeError, "floating"),
    ([[0.0, 1.0], [1.0, 0.0]], TypeError, "torch.Tensor"),
    (torch.tensor([[1.0, 0.0], [float("nan"), 1.0]]), ValueError, "NaN"),
])
def test_bad_patterns_are_refused_by_name(pattern, error, words):
    with pytest.raises(error, match=words):
        previous_token_score(pattern)
    with pytest.raises(error, match=words):
        induction_score(pattern, 1)


@pytest.mark.parametrize("period, error", [(0, ValueError), (6, ValueError), (-1, ValueError), (2.0, TypeError),
                                           (True, TypeError)])
def test_a_period_outside_one_to_n_minus_one_is_refused(period, error):
    with pytest.raises(error, match="period"):
        induction_score(torch.eye(6), period)


def test_a_duplicate_token_head_scores_one_where_the_induction_score_is_zero():
    n, period = 10, 4
    twin = _offset_pattern(n, period)                                    # i -> i - P, its own earlier copy
    assert duplicate_token_score(twin, period).item() == 1.0
    assert induction_score(twin, period).item() == 0.0
    assert duplicate_token_score(_offset_pattern(n, period - 1), period).item() == 0.0
    expected = sum(1 / (i + 1) for i in range(period, n)) / (n - period)
    assert duplicate_token_score(_causal_uniform(n), period).item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="period"):
        duplicate_token_score(twin, n)


def test_a_period_per_sequence_and_chosen_queries_read_each_sequence_at_its_own_offset():
    from attn_course.data.repeated_tokens import placed_repeats

    batch = placed_repeats(40, 16, 30, periods=(2, 8), generator=torch.Generator().manual_seed(5))
    pattern = torch.softmax(torch.randn(40, 3, 16, 16, generator=torch.Generator().manual_seed(6),
                                        dtype=torch.float64), dim=-1)
    for score, back in ((induction_score, 0), (duplicate_token_score, 1)):
        got = score(pattern, batch.periods, batch.second_copy)                        # [B, H]
        for b in range(40):                                                          # a loop, one sequence at a time
            p = batch.periods[b].item()
            queries = batch.second_copy[b].nonzero().flatten().tolist()
            expected = torch.stack([pattern[b, :, i, i - p + 1 - back] for i in queries]).mean(0)
            torch.testing.assert_close(got[b], expected)
    # an int period with the default queries is the classic score
    torch.testing.assert_close(induction_score(pattern, torch.full((40,), 5)), induction_score(pattern, 5))


@pytest.mark.parametrize("period, queries, error, words", [
    (torch.full((3,), 2), None, ValueError, "pattern"),                           # [N, N]: no batch to index
    (torch.full((4,), 2), None, ValueError, "one per sequence"),
    (torch.full((2,), 2.0), None, TypeError, "period"),
    (2, torch.ones(2, 6, dtype=torch.long), TypeError, "queries"),
    (2, torch.ones(2, 5, dtype=torch.bool), ValueError, "queries"),
    (2, torch.ones(2, 6, dtype=torch.bool), ValueError, "i < P"),
    (2, torch.zeros(2, 6, dtype=torch.bool), ValueError, "at least one query"),
])
def test_per_sequence_periods_and_queries_are_checked(period, queries, error, words):
    pattern = torch.softmax(torch.randn(2, 6, 6), dim=-1)
    if words == "pattern":
        pattern = pattern[0]
    with pytest.raises(error, match=words):
        induction_score(pattern, period, queries)
