"""The repeated-token datasets and the span losses read on them."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.circuits import first_half_span, loss_from_logits, repeated_span, span_loss, token_losses
from attn_course.data.repeated_tokens import character_windows, repeated_random_tokens, repeated_segment_tokens


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


def test_repeated_segments_end_the_sequence_and_their_lengths_cover_the_range():
    tokens, periods = repeated_segment_tokens(500, 20, 50, periods=(4, 10), generator=torch.Generator().manual_seed(1))
    assert tokens.shape == (500, 20) and set(periods.tolist()) == set(range(4, 11))
    for row, p in zip(tokens, periods.tolist()):
        assert torch.equal(row[20 - p:], row[20 - 2 * p:20 - p])
    full, _ = repeated_segment_tokens(3, 8, 5, periods=(4, 4), generator=torch.Generator().manual_seed(2))
    assert torch.equal(full[:, 4:], full[:, :4])


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
    (lambda: repeated_segment_tokens(2, 10, 5, periods=(3, 6)), ValueError, "periods"),
    (lambda: repeated_segment_tokens(2, 10, 5, periods=(4, 3)), ValueError, "periods"),
    (lambda: repeated_segment_tokens(2, 10, 5, periods=(0, 3)), ValueError, "periods"),
    (lambda: repeated_segment_tokens(2, 10, 5, periods=3), TypeError, "periods"),
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


def test_span_losses_separate_the_predictable_repeat_from_the_random_first_half():
    half, vocab = 5, 11
    tokens = repeated_random_tokens(4, half, vocab, generator=torch.Generator().manual_seed(4))
    copier = Copier(half, vocab)
    assert span_loss(copier, tokens, repeated_span(half)) == pytest.approx(0.0, abs=1e-6)
    assert span_loss(copier, tokens, first_half_span(half)) == pytest.approx(math.log(vocab))
    losses = token_losses(copier, tokens)
    assert losses.shape == (4, 9)
    assert losses[:, half - 1].tolist() == pytest.approx([math.log(vocab)] * 4)   # token L: nothing to copy yet
    assert repeated_span(half) == (6, 10) and first_half_span(half) == (1, 5)


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
