"""Chapter 05's "does RoPE help?" curves: held-out losses of position schemes trained alike."""

import math

import pytest
import torch

from attn_course.data.rhymes import held_out_split, load_rhymes
from attn_course.data.tokenizers import CharTokenizer
from attn_course.models.position_model import PositionConfig, PositionLanguageModel
from attn_course.teaching.experiments.learning_curves import position_learning_curves

SMALL = {"train_length": 8, "embed_dim": 16, "num_heads": 2, "num_layers": 1, "batch_size": 4}


def _hand_loss(model, ids, length):
    """Mean next-character cross-entropy over non-overlapping windows, by a loop and log-softmax in float64."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - length, length):
            window = ids[start : start + length + 1]
            log_probs = torch.log_softmax(model(window[None, :-1])[0].double(), dim=-1)   # [N, V]
            total -= float(log_probs[torch.arange(length), window[1:]].sum())
            count += length
    return total / count


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_first_point_is_the_untrained_models_held_out_loss(position):
    text = load_rhymes()
    curves = position_learning_curves((position,), text, steps=1, eval_every=1, seed=3, **SMALL)
    tokenizer = CharTokenizer(text)
    held_out = tokenizer.encode(held_out_split(text, 0.1)[1])
    torch.manual_seed(3)                                                   # the seed builds the weights
    model = PositionLanguageModel(PositionConfig(tokenizer.vocab_size, position, 8, 16, 2, 1)).eval()
    assert curves[position].validation_losses[0] == pytest.approx(_hand_loss(model, held_out, 8), rel=1e-5)
    assert curves[position].validation_losses[0] == pytest.approx(math.log(tokenizer.vocab_size), abs=0.5)


def test_curves_are_scored_every_eval_every_steps_and_at_the_end():
    curves = position_learning_curves(("rope", "learned", "none"), steps=7, eval_every=3, **SMALL)
    assert list(curves) == ["rope", "learned", "none"]
    for history in curves.values():
        assert history.validation_steps == [0, 3, 6, 7]
        assert len(history.validation_losses) == 4
        assert len(history.train_losses) == 7


def test_training_lowers_the_held_out_loss_and_is_deterministic():
    first = position_learning_curves(("learned", "rope"), steps=40, eval_every=20, **SMALL)
    again = position_learning_curves(("learned", "rope"), steps=40, eval_every=20, **SMALL)
    for position, history in first.items():
        assert history.validation_losses[-1] < history.validation_losses[0] - 0.5
        assert history.validation_losses == again[position].validation_losses


def test_each_scheme_is_trained_from_the_seed_whatever_comes_before():
    # Each scheme starts from the seed, not from what training the previous one left behind: a
    # "learned" model trained alone gets the very curve it gets after a "rope" model.
    both = position_learning_curves(("rope", "learned"), steps=5, eval_every=5, **SMALL)
    alone = position_learning_curves(("learned",), steps=5, eval_every=5, **SMALL)
    assert both["learned"].validation_losses == alone["learned"].validation_losses
    assert both["learned"].train_losses == alone["learned"].train_losses


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"positions": "rope"}, TypeError, "non-empty tuple or list"),
        ({"positions": ()}, TypeError, "non-empty tuple or list"),
        ({"positions": ("rope", "rope")}, ValueError, "distinct"),
        ({"positions": ("rotary",)}, ValueError, "position must be one of"),
        ({"validation_fraction": 0.0}, ValueError, "must lie in (0, 1)"),
        ({"validation_fraction": 1.0}, ValueError, "validation_fraction must lie in [0, 1)"),
        ({"train_length": 0}, ValueError, "train_length"),
        ({"steps": 0}, ValueError, "steps"),
    ],
)
def test_bad_arguments_are_refused_with_their_name(kwargs, error, fragment):
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        position_learning_curves(**{"steps": 1, **kwargs})
