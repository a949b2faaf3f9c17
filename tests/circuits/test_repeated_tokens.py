"""The repeated-token datasets and the span losses read on them."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.circuits import loss_from_logits, span_loss, token_losses
from attn_course.data.repeated_tokens import character_windows, placed_repeats, repeated_random_tokens


def test_the_second_half_repeats_the_first_and_tokens_are_uniform():
    tokens = repeated_random_tokens(2000, 10, 7, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (2000, 20) and tokens.dtype == torch.long
    assert torch.equal(tokens[:, 10:], tokens[:, :10])
    counts = torch.bincount(tokens[:, :10].flatten(), minlength=7).double()
    expected = 20000 / 7
    chi_square = ((counts - expected) ** 2 / expected).sum().item()
    assert chi_square < 22.5                                   # chi-square, 6 degrees of freedom, p = 0.001


def test_a_generator_makes_the_draw_repeatable():
    first = repeated_random_tokens(3, 4, 9, generator=torch.Generator().manual_seed(5))
    again = repeated_random_tokens(3, 4, 9, generator=torch.Generator().manual_seed(5))
    assert torch.equal(first, again)


def test_placed_repeats_hold_one_segment_twice_anywhere_and_the_control_only_removes_its_first_copy():
    batch = placed_repeats(2000, 20, 50, periods=(2, 10), generator=torch.Generator().manual_seed(1))
    tokens, control, periods, starts = batch.tokens, batch.control, batch.periods, batch.starts
    assert tokens.shape == control.shape == (2000, 20) and set(periods.tolist()) == set(range(2, 11))
    assert bool((starts >= 0).all() and (starts + 2 * periods <= 20).all())
    assert set(starts[periods == 2].tolist()) == set(range(0, 17))          # every place a period-2 repeat fits
    for row, other, p, s, second, predictable in zip(tokens[:200], control[:200], periods.tolist(), starts.tolist(),
                                                     batch.second_copy[:200], batch.predictable[:200]):
        assert torch.equal(row[s + p:s + 2 * p], row[s:s + p])
        assert second.nonzero().flatten().tolist() == list(range(s + p, s + 2 * p))
        assert predictable.nonzero().flatten().tolist() == list(range(s + p + 1, s + 2 * p))
        outside = torch.ones(20, dtype=torch.bool)
        outside[s:s + p] = False
        assert torch.equal(other[outside], row[outside])                       # only the first copy differs
    first_copy = (torch.arange(20) >= starts[:, None]) & (torch.arange(20) < (starts + periods)[:, None])
    same = (control == tokens)[first_copy].double().mean().item()
    assert same == pytest.approx(1 / 50, abs=0.01)                           # fresh draws: equal by chance only


def test_placed_repeats_with_a_fixed_half_period_are_repeated_random_tokens_in_layout():
    batch = placed_repeats(3, 8, 5, periods=(4, 4), generator=torch.Generator().manual_seed(2))
    assert torch.equal(batch.tokens[:, 4:], batch.tokens[:, :4]) and batch.starts.tolist() == [0, 0, 0]


def test_character_windows_are_consecutive_slices():
    ids = torch.arange(100)
    windows = character_windows(ids, 50, 7, generator=torch.Generator().manual_seed(3))
    assert torch.equal(windows - windows[:, :1], torch.arange(7).expand(50, 7))
    assert windows.max() < 100


@pytest.mark.parametrize("call, error, words", [
    (lambda: repeated_random_tokens(0, 3, 5), ValueError, "batch"),
    (lambda: repeated_random_tokens(2, 0, 5), ValueError, "half_length"),
    (lambda: repeated_random_tokens(2, 3, 1), ValueError, "vocab_size"),
    (lambda: repeated_random_tokens(2, 3.0, 5), TypeError, "half_length"),
    (lambda: repeated_random_tokens(2, 3, 5, generator=0), TypeError, "generator"),
    (lambda: placed_repeats(2, 10, 5, periods=(3, 6)), ValueError, "periods"),
    (lambda: placed_repeats(2, 10, 5, periods=(4, 3)), ValueError, "periods"),
    (lambda: placed_repeats(2, 10, 5, periods=(0, 3)), ValueError, "periods"),
    (lambda: placed_repeats(2, 10, 5, periods=3), TypeError, "periods"),
    (lambda: placed_repeats(2, 10, 1, periods=(2, 3)), ValueError, "vocab_size"),
    (lambda: character_windows(torch.arange(5), 2, 6), ValueError, "length"),
    (lambda: character_windows(torch.arange(5.0), 2, 3), TypeError, "integer"),
])
def test_bad_arguments_are_refused_by_name(call, error, words):
    with pytest.raises(error, match=words):
        call()


class Copier(torch.nn.Module):
    """Predicts token i + 1 as tokens[i − L + 1] once i ≥ L − 1 ... with certainty, uniform before (V tokens)."""

    def __init__(self, half: int, vocab: int) -> None:
        super().__init__()
        self.half, self.vocab = half, vocab

    def forward(self, tokens):
        logits = torch.zeros(*tokens.shape, self.vocab)
        for i in range(self.half, tokens.shape[1] - 1):        # position i predicts token i + 1 = token i + 1 - L
            logits[torch.arange(tokens.shape[0]), i, tokens[:, i + 1 - self.half]] = 100.0
        return logits


def test_span_losses_separate_the_predictable_repeat_from_the_random_tokens():
    half, vocab = 5, 11
    tokens = repeated_random_tokens(4, half, vocab, generator=torch.Generator().manual_seed(4))
    copier = Copier(half, vocab)
    position = torch.arange(2 * half).expand(4, -1)
    assert span_loss(copier, tokens, (half + 1, 2 * half)) == pytest.approx(0.0, abs=1e-6)
    assert span_loss(copier, tokens, position > half) == pytest.approx(0.0, abs=1e-6)         # the same, as a mask
    assert span_loss(copier, tokens, (1, half)) == pytest.approx(math.log(vocab))
    losses = token_losses(copier, tokens)
    assert losses.shape == (4, 9)
    assert losses[:, half - 1].tolist() == pytest.approx([math.log(vocab)] * 4)   # token L: nothing to copy yet
    mixed = (position > half) | (position == 1)                                   # 4 copied tokens, 1 random
    assert span_loss(copier, tokens, mixed) == pytest.approx(math.log(vocab) / 5)


def test_loss_from_logits_scores_only_the_span():
    logits = torch.zeros(1, 4, 3)
    logits[0, 0, 2] = 50.0                                       # token 1 predicted as 2 with certainty
    targets = torch.tensor([[0, 2, 1, 1]])
    assert loss_from_logits(logits, targets, (1, 2)).item() == pytest.approx(0.0, abs=1e-6)
    assert loss_from_logits(logits, targets, (2, 4)).item() == pytest.approx(math.log(3))
    with pytest.raises(ValueError, match="span"):
        loss_from_logits(logits, targets, (0, 2))
    with pytest.raises(ValueError, match="span"):
        loss_from_logits(logits, targets, (2, 5))
    assert loss_from_logits(logits, targets, torch.tensor([[False, True, False, False]])).item() == pytest.approx(
        0.0, abs=1e-6)
    with pytest.raises(ValueError, match="token 0"):
        loss_from_logits(logits, targets, torch.tensor([[True, True, False, False]]))
    with pytest.raises(ValueError, match="span"):
        loss_from_logits(logits, targets, torch.tensor([[0, 1, 0, 0]]))
