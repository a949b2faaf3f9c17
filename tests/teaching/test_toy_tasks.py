"""attn_course.teaching.experiments.toy_tasks: where the two-relation model's heads look, trained once and over
several seeds and head counts."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.models.two_relations import (
    TwoRelationConfig,
    TwoRelationModel,
    make_two_relation_data,
    train_two_relation_model,
)
from attn_course.teaching.experiments.toy_tasks import compare_head_counts, head_relation_scores, steps_to_reach

CHANCE = math.log(TwoRelationConfig().vocab_size)                   # loss of a uniform guess


@pytest.fixture(scope="module")
def trained():
    """Models trained with the default settings, one per seed, shared by the tests below."""
    return {seed: train_two_relation_model(seed=seed) for seed in (0, 1, 2)}


@pytest.fixture(scope="module")
def probe():
    """Fresh sequences, never seen in training."""
    tokens, targets = make_two_relation_data(256, seed=12345)
    return tokens, targets


def test_an_untrained_model_has_no_specialised_head(probe):
    torch.manual_seed(0)
    _, weights = TwoRelationModel()(probe[0])
    scores = head_relation_scores(weights)
    assert scores.previous.max() < 0.5 and scores.first.max() < 0.5


@pytest.mark.slow
def test_training_drives_the_loss_far_below_chance(trained):
    _, losses = trained[0]
    assert losses.shape == (400,)
    assert abs(losses[0].item() - CHANCE) < 0.3                     # starts near a uniform guess
    assert losses[-20:].mean().item() < 0.05 * CHANCE


@pytest.mark.slow
def test_the_trained_model_answers_both_questions(trained, probe):
    model, _ = trained[0]
    tokens, targets = probe
    with torch.no_grad():
        logits, _ = model(tokens)
    correct = logits.argmax(dim=-1)[:, 1:] == targets[:, 1:]          # [B, N - 1, 2]
    assert correct.float().mean().item() > 0.99
    assert not model.training


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_head_learns_a_different_relation(trained, probe, seed):
    model, _ = trained[seed]
    with torch.no_grad():
        _, weights = model(probe[0])
    scores = head_relation_scores(weights)
    previous_head = int(scores.previous.argmax())
    first_head = int(scores.first.argmax())
    assert previous_head != first_head
    assert scores.previous[previous_head] > 0.8
    assert scores.first[first_head] > 0.8


def test_relation_scores_of_hand_made_heads():
    n = 5
    one_back = torch.zeros(n, n)
    one_back[0, 0] = 1.0
    one_back[torch.arange(1, n), torch.arange(0, n - 1)] = 1.0      # query i looks at key i - 1
    at_start = torch.zeros(n, n)
    at_start[:, 0] = 1.0                                            # every query looks at key 0
    uniform = torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]
    weights = torch.stack([one_back, at_start, uniform])[None]      # [1, 3, N, N]
    scores = head_relation_scores(weights)
    # Queries 2..4 of the uniform head see 3, 4 and 5 keys: weight 1/3, 1/4, 1/5 on each.
    expected_uniform = (1 / 3 + 1 / 4 + 1 / 5) / 3
    assert torch.allclose(scores.previous, torch.tensor([1.0, 0.0, expected_uniform]))
    assert torch.allclose(scores.first, torch.tensor([0.0, 1.0, expected_uniform]))


def test_steps_to_reach_is_the_first_step_below_the_threshold():
    losses = torch.tensor([2.0, 0.3, 0.09, 0.5, 0.01])
    assert steps_to_reach(losses, 0.1) == 2                        # the later rise does not matter
    assert steps_to_reach(losses, 0.01) is None                    # strictly below
    assert steps_to_reach(losses, 3.0) == 0


@pytest.fixture(scope="module")
def compared():
    """Seeds 0 and 1, one and two heads, 60 steps each."""
    return compare_head_counts([0, 1], steps=60, final_window=5)


@pytest.mark.slow
def test_compare_head_counts_repeats_the_single_runs(compared):
    assert [(run.seed, run.num_heads) for run in compared] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    probe, _ = make_two_relation_data(512, seed=1)
    for run in compared:
        model, losses = train_two_relation_model(60, run.seed, config=TwoRelationConfig(num_heads=run.num_heads))
        assert torch.equal(run.losses, losses)
        assert run.steps_to_threshold == steps_to_reach(losses, 0.1)
        assert run.final_loss == pytest.approx(losses[-5:].mean().item())
        with torch.no_grad():
            _, weights = model(probe)
        scores = head_relation_scores(weights)
        assert torch.equal(run.previous, scores.previous) and torch.equal(run.first, scores.first)
        assert run.previous.shape == (run.num_heads,)


@pytest.mark.slow
def test_compare_head_counts_is_deterministic_and_leaves_the_random_state_alone(compared):
    torch.manual_seed(321)
    state = torch.random.get_rng_state()
    again = compare_head_counts([1], steps=60, final_window=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert [torch.equal(a.losses, b.losses) for a, b in zip(again, compared[2:])] == [True, True]


@pytest.mark.slow
def test_two_heads_get_below_the_threshold_sooner_than_one(compared):
    by_run = {(run.seed, run.num_heads): run for run in compared}
    for seed in (0, 1):
        two, one = by_run[seed, 2], by_run[seed, 1]
        assert two.steps_to_threshold is not None
        assert one.steps_to_threshold is None or two.steps_to_threshold < one.steps_to_threshold
        assert two.final_loss < one.final_loss


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: head_relation_scores(torch.ones(2, 3, 3)), ValueError, "attention_weights"),
        (lambda: head_relation_scores(torch.ones(1, 1, 2, 2)), ValueError, "attention_weights"),
        (lambda: head_relation_scores(torch.ones(1, 1, 3, 3, dtype=torch.long)), TypeError, "attention_weights"),
        (lambda: steps_to_reach(torch.ones(2, 2), 0.1), ValueError, "losses"),
        (lambda: steps_to_reach(torch.ones(0), 0.1), ValueError, "losses"),
        (lambda: steps_to_reach([1.0], 0.1), TypeError, "losses"),
        (lambda: steps_to_reach(torch.ones(3), 0.0), ValueError, "threshold"),
        (lambda: compare_head_counts([]), ValueError, "seeds"),
        (lambda: compare_head_counts("01"), TypeError, "seeds"),
        (lambda: compare_head_counts([-1]), ValueError, "seeds"),
        (lambda: compare_head_counts([0], head_counts=[3]), ValueError, "head count 3"),
        (lambda: compare_head_counts([0], steps=5, final_window=6), ValueError, "final_window"),
        (lambda: compare_head_counts([0], threshold=-1.0), ValueError, "threshold"),
        (lambda: compare_head_counts([0], probe_sequences=0), ValueError, "probe_sequences"),
    ],
)
def test_bad_arguments_are_named(call, error, words):
    with pytest.raises(error, match=words):
        call()
