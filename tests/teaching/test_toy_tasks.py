"""Tests for attn_course.teaching.experiments.toy_tasks: the two-relation task, its model, training and head scores."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.teaching.experiments.toy_tasks import (
    IGNORE_INDEX,
    TwoRelationConfig,
    TwoRelationModel,
    compare_head_counts,
    head_relation_scores,
    make_two_relation_data,
    rotating_position_code,
    steps_to_reach,
    train_two_relation_model,
)

VOCAB = TwoRelationConfig().vocab_size
CHANCE = math.log(VOCAB)                                            # loss of a uniform guess


@pytest.fixture(scope="module")
def trained():
    """Models trained with the default settings, one per seed, shared by the tests below."""
    return {seed: train_two_relation_model(seed=seed) for seed in (0, 1, 2)}


@pytest.fixture(scope="module")
def probe():
    """Fresh sequences, never seen in training."""
    tokens, targets = make_two_relation_data(256, seed=12345)
    return tokens, targets


# --- data ------------------------------------------------------------------------------


def test_targets_are_the_previous_token_and_the_first_token():
    tokens, targets = make_two_relation_data(5, seq_len=7, vocab_size=6, seed=3)
    assert tokens.shape == (5, 7) and targets.shape == (5, 7, 2)
    assert tokens.dtype == targets.dtype == torch.int64
    for b in range(5):
        for i in range(1, 7):
            assert targets[b, i, 0] == tokens[b, i - 1]
            assert targets[b, i, 1] == tokens[b, 0]
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 6


def test_position_zero_has_no_target():
    _, targets = make_two_relation_data(3, seed=0)
    assert (targets[:, 0] == IGNORE_INDEX).all()
    assert (targets[:, 1:] != IGNORE_INDEX).all()


def test_same_seed_gives_the_same_data_and_a_generator_advances():
    first, _ = make_two_relation_data(4, seed=7)
    again, _ = make_two_relation_data(4, seed=7)
    assert torch.equal(first, again)
    generator = torch.Generator().manual_seed(7)
    from_generator, _ = make_two_relation_data(4, generator=generator)
    next_batch, _ = make_two_relation_data(4, generator=generator)
    assert torch.equal(from_generator, first)
    assert not torch.equal(next_batch, first)


# --- position code ---------------------------------------------------------------------


def test_one_step_back_is_the_same_linear_map_at_every_position():
    code = rotating_position_code(64, 16).double()                    # [N, E], N > E
    now, before = code[1:], code[:-1]                               # positions n and n - 1
    step_back = torch.linalg.lstsq(now, before).solution            # [E, E], fitted on all n at once
    assert torch.allclose(now @ step_back, before, atol=1e-5)          # float32 code
    assert torch.allclose(step_back @ step_back.T, torch.eye(16, dtype=torch.float64), atol=1e-5)  # a rotation


def test_position_code_rows_have_equal_norm_and_distinct_positions():
    code = rotating_position_code(10, 32)
    assert torch.allclose(code.norm(dim=-1), torch.full((10,), 4.0))   # √(32 / 2)
    assert torch.equal(code[0], torch.tensor([1.0, 0.0] * 16))
    similarity = code @ code.T                                          # [N, N]
    off_diagonal = similarity[~torch.eye(10, dtype=torch.bool)]
    assert off_diagonal.max() < similarity.diagonal().min()


# --- model -----------------------------------------------------------------------------


def test_model_shapes_and_causal_weights():
    torch.manual_seed(0)
    model = TwoRelationModel(TwoRelationConfig(vocab_size=5, seq_len=6, embed_dim=8, num_heads=2))
    tokens = torch.randint(5, (3, 4))
    logits, weights = model(tokens)
    assert logits.shape == (3, 4, 2, 5)
    assert weights.shape == (3, 2, 4, 4)
    assert torch.allclose(weights.sum(dim=-1), torch.ones(3, 2, 4, dtype=weights.dtype))
    assert (weights.triu(diagonal=1) == 0).all()                        # no looking ahead


def test_an_untrained_model_has_no_specialised_head(probe):
    torch.manual_seed(0)
    _, weights = TwoRelationModel()(probe[0])
    scores = head_relation_scores(weights)
    assert scores.previous.max() < 0.5 and scores.first.max() < 0.5


# --- training --------------------------------------------------------------------------


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


def test_training_is_deterministic():
    _, losses = train_two_relation_model(steps=30, seed=5)
    _, again = train_two_relation_model(steps=30, seed=5)
    _, other = train_two_relation_model(steps=30, seed=6)
    assert torch.equal(losses, again)
    assert not torch.equal(losses, other)


def test_training_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    train_two_relation_model(steps=2, seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)


# --- head scores -----------------------------------------------------------------------


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


# --- several seeds, one and two heads ---------------------------------------------------


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


# --- input checks ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: make_two_relation_data(0), ValueError, "num_sequences"),
        (lambda: make_two_relation_data(2.0), TypeError, "num_sequences"),
        (lambda: make_two_relation_data(2, seq_len=2), ValueError, "seq_len"),
        (lambda: make_two_relation_data(2, vocab_size=1), ValueError, "vocab_size"),
        (lambda: make_two_relation_data(2, seed=-1), ValueError, "seed"),
        (lambda: make_two_relation_data(2, generator=0), TypeError, "generator"),
        (lambda: rotating_position_code(4, 7), ValueError, "embed_dim"),
        (lambda: rotating_position_code(0, 8), ValueError, "seq_len"),
        (lambda: TwoRelationConfig(embed_dim=30, num_heads=4), ValueError, "embed_dim"),
        (lambda: TwoRelationConfig(vocab_size=True), TypeError, "vocab_size"),
        (lambda: TwoRelationConfig(dtype=torch.int64), TypeError, "dtype"),
        (lambda: TwoRelationConfig(dtype="float64"), TypeError, "dtype"),
        (lambda: rotating_position_code(4, 4, dtype=torch.int32), TypeError, "dtype"),
        (lambda: TwoRelationModel(config="small"), TypeError, "config"),
        (lambda: train_two_relation_model(steps=0), ValueError, "steps"),
        (lambda: train_two_relation_model(seed=-2), ValueError, "seed"),
        (lambda: train_two_relation_model(lr=0.0), ValueError, "lr"),
        (lambda: train_two_relation_model(batch_size="64"), TypeError, "batch_size"),
        (lambda: train_two_relation_model(config={}), TypeError, "config"),
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


@pytest.mark.parametrize(
    "tokens, error, words",
    [
        (torch.zeros(2, 4), TypeError, "integer"),
        (torch.zeros(2, 4, 1, dtype=torch.long), ValueError, r"\[B, N\]"),
        (torch.zeros(2, 11, dtype=torch.long), ValueError, "seq_len"),
        (torch.full((2, 4), 8), ValueError, r"\[0, 8\)"),
        ([[0, 1, 2]], TypeError, "tokens"),
    ],
)
def test_model_rejects_bad_tokens(tokens, error, words):
    model = TwoRelationModel()
    with pytest.raises(error, match=words):
        model(tokens)


def test_the_model_is_built_in_its_config_dtype_from_the_same_initial_numbers():
    wide, narrow = (TwoRelationModel(TwoRelationConfig(dtype=dtype)) for dtype in (torch.float64, torch.float32))
    assert {p.dtype for p in wide.parameters()} == {torch.float64} and wide.positions.dtype == torch.float64
    assert {p.dtype for p in narrow.parameters()} == {torch.float32}
    torch.manual_seed(3)
    first = TwoRelationModel(TwoRelationConfig(dtype=torch.float64))
    torch.manual_seed(3)
    second = TwoRelationModel(TwoRelationConfig(dtype=torch.float32))
    for a, b in zip(first.parameters(), second.parameters()):
        assert torch.equal(a, b.double())                # the float32 draws, widened exactly


ONE_HEAD_LOSSES = """
import sys
from attn_course.teaching.experiments.two_relations import TwoRelationConfig, train_two_relation_model
_, losses = train_two_relation_model(400, 0, config=TwoRelationConfig(num_heads=1))
print([f"{losses[step]:.2e}" for step in (0, 25, 50, 100, 200, 399)])   # as chapter 03 prints them
"""


@pytest.mark.slow   # three interpreters, each training 400 steps
def test_float64_training_prints_the_same_numbers_whatever_the_cpu_kernels():
    """Chapter 03 prints the chaotic one-head run's losses to three digits: in float64 they must
    not depend on which vector kernels (AVX2 or the machine's widest) or which BLAS code path the
    CPU takes. (In float32 they did: the loss at step 100 was 0.058 on one path, 0.083 on another.)"""
    import os
    import subprocess
    import sys

    # All three at once: the training runs on one thread (as chapter 03's does).
    started = {name: subprocess.Popen([sys.executable, "-c", ONE_HEAD_LOSSES], env={**os.environ, **extra},
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, extra in {"native": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
                                   "compatible blas": {"MKL_CBWR": "COMPATIBLE"}}.items()}
    runs = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        runs[name] = stdout
    assert runs["avx2"] == runs["native"] and runs["compatible blas"] == runs["native"]
