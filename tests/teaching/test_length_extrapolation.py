"""Chapter 09's train-short-test-long experiment: the held-out score against a loss computed by hand, the
characters dropped, and the experiment's rows."""

import math

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn

from attn_course.data.rhymes import load_more_rhymes, load_rhymes
from attn_course.data.tokenizers import CharTokenizer
from attn_course.teaching.experiments.length_extrapolation import (
    encode_known,
    held_out_loss,
    length_extrapolation_experiment,
    plot_length_extrapolation,
)


class _InWindowModel(nn.Module):
    """Logits that depend on the token and on its index in the window: W[id] + n · U."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(5)
        self.W = nn.Parameter(torch.randn(4, 4, generator=generator))
        self.U = nn.Parameter(torch.randn(4, generator=generator))

    def forward(self, ids):
        return self.W[ids] + torch.arange(ids.shape[1])[:, None] * self.U         # [B, N, V]


def test_held_out_loss_is_the_cross_entropy_of_non_overlapping_windows():
    model = _InWindowModel()
    tokens = [3, 1, 0, 2, 2, 1, 3, 0]                            # T = 8, length 3: 2 windows, the last id unused
    W, U = model.W.detach().double().tolist(), model.U.detach().double().tolist()
    losses = []
    for start in (0, 3):
        for n in range(3):
            logits = [W[tokens[start + n]][v] + n * U[v] for v in range(4)]
            log_sum = math.log(sum(math.exp(x) for x in logits))
            losses.append(log_sum - logits[tokens[start + n + 1]])
    expected = sum(losses) / len(losses)
    assert held_out_loss(model, torch.tensor(tokens), 3) == pytest.approx(expected, abs=1e-6)


def test_encode_known_drops_and_counts_unknown_characters():
    tokenizer = CharTokenizer("ab ")
    ids, dropped = encode_known(tokenizer, "a, b!\nab")
    assert tokenizer.decode(ids) == "a bab" and dropped == 3
    training, held_out = load_rhymes(), load_more_rhymes()
    _, dropped = encode_known(CharTokenizer(training), held_out)
    assert dropped == sum(c not in set(training) for c in held_out)


def test_experiment_is_deterministic_and_scores_each_length():
    kwargs = dict(positions=("learned", "alibi"), train_length=8, factors=(1, 2, 4), steps=3)
    first, second = length_extrapolation_experiment(**kwargs), length_extrapolation_experiment(**kwargs)
    assert first == second
    assert [(r["position"], r["length"]) for r in first.rows] == [
        ("learned", 8), ("learned", 16), ("learned", 32), ("alibi", 8), ("alibi", 16), ("alibi", 32)]
    assert first.scored_characters % 32 == 0 and first.scored_characters > 6000
    losses = {(r["position"], r["length"]): r["loss"] for r in first.rows}
    assert first.by_length() == [{"position": p, **{f"N={n}": losses[p, n] for n in (8, 16, 32)}}
                                 for p in ("learned", "alibi")]
    ax = plot_length_extrapolation(first)
    assert ax.get_xscale() == "log" and len(ax.get_lines()) == 2 + 1        # two schemes and the L marker
    plt.close(ax.figure)


@pytest.mark.parametrize("call, error, message", [
    (lambda: length_extrapolation_experiment(("alibi", "t5")), ValueError, r"positions\[1\]"),
    (lambda: length_extrapolation_experiment(factors=(1, 0)), ValueError, r"factors\[1\]"),
    (lambda: length_extrapolation_experiment(factors=(1, 2.0)), TypeError, r"factors\[1\]"),
    (lambda: length_extrapolation_experiment(factors=()), ValueError, "factors"),
    (lambda: length_extrapolation_experiment(train_length=0), ValueError, "train_length"),
    (lambda: held_out_loss(_InWindowModel(), torch.arange(5) % 4, 0), ValueError, "length must be >= 1"),
    (lambda: held_out_loss(_InWindowModel(), torch.arange(5.0), 2), TypeError, "tokens must be an integer"),
    (lambda: held_out_loss(_InWindowModel(), torch.arange(3) % 4, 3), ValueError, "T > length"),
    (lambda: held_out_loss(lambda ids: ids, torch.arange(5), 2), TypeError, "model must be"),
    (lambda: plot_length_extrapolation([]), TypeError, "ExtrapolationResult"),
])
def test_bad_input_raises_naming_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()
