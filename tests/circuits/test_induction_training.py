"""train_induction_model: deterministic for a seed, leaves the caller's random state alone, records what it says."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.circuits import InductionSetup, phase_change_step, train_induction_model
from attn_course.circuits.rhymes import RhymesSetup, train_rhymes_model
from attn_course.circuits.training import state_digest

SMALL = InductionSetup(vocab_size=12, length=12, min_period=2, max_period=6, d_model=16, n_heads=2, batch_size=8,
                       evaluation_batch=8)


def test_the_same_seed_gives_the_same_bits_and_another_seed_does_not():
    first_model, first = train_induction_model(3, steps=6, setup=SMALL, record_every=3)
    again_model, again = train_induction_model(3, steps=6, setup=SMALL, record_every=3)
    _, other = train_induction_model(4, steps=6, setup=SMALL, record_every=3)
    assert first.as_dict() == again.as_dict()
    assert state_digest(first_model) == state_digest(again_model) == first.digests[-1]
    assert all(torch.equal(a, b) for a, b in zip(first_model.state_dict().values(), again_model.state_dict().values()))
    assert other.digests[0] != first.digests[0] and other.repeated_loss != first.repeated_loss


def test_a_shorter_run_is_a_prefix_of_a_longer_one():
    """The schedule does not depend on the total number of steps, so the cache can be checked on a prefix."""
    _, short = train_induction_model(1, steps=4, setup=SMALL, record_every=2)
    _, long = train_induction_model(1, steps=8, setup=SMALL, record_every=2)
    for name, values in short.as_dict().items():
        if isinstance(values, list):
            assert long.as_dict()[name][:len(values)] == values, name


def test_training_leaves_the_callers_random_state_and_threads_as_they_were():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    train_induction_model(0, steps=2, setup=SMALL, record_every=1)
    assert torch.equal(torch.rand(3), expected)
    assert torch.get_num_threads() == threads


def test_the_history_records_every_head_at_every_record_and_the_control_stays_at_chance():
    model, history = train_induction_model(0, steps=5, setup=SMALL, record_every=2)
    assert history.steps == [0, 2, 4, 5]
    assert len(history.induction_scores) == 4 and len(history.induction_scores[0]) == 2
    assert all(len(layer) == 2 for layer in history.previous_token_scores[-1])
    assert history.train_loss[0] is None and all(isinstance(x, float) for x in history.train_loss[1:])
    assert len(history.control_induction_scores) == 4 and len(history.control_previous_token_scores[-1][1]) == 2
    # the control's tokens are uniform random with nothing earlier to copy: no model beats ln V there
    # (cross-entropy >= entropy), up to sampling noise
    chance = math.log(SMALL.vocab_size)
    assert all(loss > chance - 0.3 for loss in history.control_loss)
    assert not model.training


def test_phase_change_step_is_the_first_record_at_or_over_the_threshold():
    history = {"steps": [0, 10, 20, 30],
               "induction_scores": [[[0.9, 0.9], [0.1, 0.0]], [[0.9, 0.9], [0.2, 0.29]],
                                    [[0.0, 0.0], [0.1, 0.3]], [[0.0, 0.0], [0.8, 0.1]]]}
    assert phase_change_step(history) == 20
    assert phase_change_step(history, threshold=0.5) == 30
    assert phase_change_step(history, threshold=0.95) is None
    assert phase_change_step(history, layer=0) == 0
    with pytest.raises(ValueError, match="threshold"):
        phase_change_step(history, threshold=1.5)
    with pytest.raises(ValueError, match="layer"):
        phase_change_step(history, layer=2)
    with pytest.raises(TypeError, match="history"):
        phase_change_step([1, 2])


def test_the_rhymes_run_is_deterministic_too():
    setup = RhymesSetup(length=16, half_length=6, d_model=16, n_heads=2, batch_size=4, evaluation_batch=4)
    _, first = train_rhymes_model(2, steps=3, setup=setup, record_every=1)
    _, again = train_rhymes_model(2, steps=3, setup=setup, record_every=1)
    assert first.as_dict() == again.as_dict() and len(first.steps) == 4


@pytest.mark.parametrize("call, error, words", [
    (lambda: train_induction_model(-1, steps=1), ValueError, "seed"),
    (lambda: train_induction_model(0, steps=0), ValueError, "steps"),
    (lambda: train_induction_model(0, steps=1, record_every=0), ValueError, "record_every"),
    (lambda: train_induction_model(0, steps=1, setup={"d_model": 8}), TypeError, "InductionSetup"),
    (lambda: train_rhymes_model(0, steps=1, setup=RhymesSetup(length=8, half_length=5)), ValueError, "half_length"),
    (lambda: train_rhymes_model(0, steps=1, setup=RhymesSetup(corpus="poems")), ValueError, "corpus"),
])
def test_bad_arguments_are_refused_by_name(call, error, words):
    with pytest.raises(error, match=words):
        call()
