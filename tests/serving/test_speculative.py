"""Speculative decoding's verification keeps the target's distribution exactly.

The draft proposes k = 2 tokens from its own distributions q; rejection sampling keeps or replaces them. Over
10,000 seeded runs the first token produced must follow the target's p_1 and the second (when there is one)
p_2: Pearson's chi-square test at significance 0.001 (scipy's chi2 quantile). The same test rejects the
natural mistake, drawing the replacement from p instead of the residual max(0, p - q): the test can fail.
"""

from __future__ import annotations

import pytest
import torch

from attn_course.serving.speculative import verify_greedy, verify_sampled

stats = pytest.importorskip("scipy.stats")

RUNS, SIGNIFICANCE = 10_000, 0.001
# The target and the draft over 5 tokens, at two places (and the target's third, after both drafts).
P = torch.tensor([[0.40, 0.30, 0.15, 0.10, 0.05], [0.05, 0.05, 0.20, 0.30, 0.40], [0.2] * 5], dtype=torch.float64)
Q = torch.tensor([[0.10, 0.20, 0.30, 0.20, 0.20], [0.30, 0.30, 0.20, 0.10, 0.10]], dtype=torch.float64)


def resampling_from_p(draft_tokens, q, p, *, generator):
    """The mistake: at a rejection, draw from the target's p, not from the residual max(0, p - q)."""
    for index, token in enumerate(draft_tokens):
        if torch.rand((), dtype=torch.float64, generator=generator) * q[index, token] < p[index, token]:
            continue
        return draft_tokens[:index] + [int(torch.multinomial(p[index], 1, generator=generator))]
    return draft_tokens + [int(torch.multinomial(p[-1], 1, generator=generator))]


def produced(verify) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of the first token produced, and of the second where two or more were produced."""
    generator = torch.Generator().manual_seed(2024)
    first, second = torch.zeros(5), torch.zeros(5)
    for _ in range(RUNS):
        draft = [int(torch.multinomial(Q[index], 1, generator=generator)) for index in range(2)]
        tokens = verify(draft, Q, P, generator=generator)
        first[tokens[0]] += 1
        if len(tokens) > 1:
            second[tokens[1]] += 1
    return first, second


def chi_square_holds(counts: torch.Tensor, probabilities: torch.Tensor) -> bool:
    expected = probabilities * counts.sum()
    statistic = float(((counts - expected) ** 2 / expected).sum())
    return statistic < stats.chi2.ppf(1 - SIGNIFICANCE, df=len(counts) - 1)


def test_the_tokens_kept_follow_the_target_distribution():
    first, second = produced(verify_sampled)
    assert chi_square_holds(first, P[0]), first
    assert chi_square_holds(second, P[1]), second
    assert 0 < second.sum() < RUNS                    # some runs rejected the first draft token, some kept it


def test_drawing_the_replacement_from_p_is_caught():
    first, _ = produced(resampling_from_p)
    assert not chi_square_holds(first, P[0]), first


def test_greedy_keeps_the_draft_while_it_agrees():
    logits = torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0], [0.0, 9.0, 0.0]])   # 1, 2, 0, 1
    assert verify_greedy([2, 2, 0], logits) == [1]
    assert verify_greedy([1, 2, 1], logits) == [1, 2, 0]
    assert verify_greedy([1, 2, 0], logits) == [1, 2, 0, 1]
    assert verify_greedy([], logits[:1]) == [1]


def test_a_draft_the_target_always_agrees_with_keeps_every_token():
    certain = torch.eye(3, dtype=torch.float64)
    assert verify_sampled([0, 1], certain[:2], certain, generator=torch.Generator().manual_seed(0)) == [0, 1, 2]


@pytest.mark.parametrize("call, error, message", [
    (lambda: verify_greedy([1], torch.zeros(1, 3)), ValueError, r"target_logits must be \[k \+ 1, V\] = \[2, V\]"),
    (lambda: verify_greedy([3], torch.zeros(2, 3)), ValueError, "draft token 3 is outside the vocabulary 0..2"),
    (lambda: verify_greedy([1.0], torch.zeros(2, 3)), TypeError, r"draft_tokens\[0\] must be an int"),
    (lambda: verify_sampled([1], torch.zeros(2, 3), torch.zeros(2, 3)), ValueError,
     r"draft_probabilities must be \[k, V\] = \[1, 3\]"),
    (lambda: verify_sampled([1], torch.tensor([[1.0, 0.0, 0.0]]), torch.ones(2, 3) / 3), ValueError,
     "draft token 1 at place 0 has draft probability 0"),
])
def test_bad_input_is_named(call, error, message):
    with pytest.raises(error, match=message):
        call()
