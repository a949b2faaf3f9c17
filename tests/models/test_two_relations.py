"""attn_course.models.two_relations: chapter 03's two-relation data, its position code, its model and training."""

from __future__ import annotations

import pytest
import torch

from attn_course.models.two_relations import (
    IGNORE_INDEX,
    TwoRelationConfig,
    TwoRelationModel,
    make_two_relation_data,
    rotating_position_code,
    train_two_relation_model,
)


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


def test_model_shapes_and_causal_weights():
    torch.manual_seed(0)
    model = TwoRelationModel(TwoRelationConfig(vocab_size=5, seq_len=6, embed_dim=8, num_heads=2))
    tokens = torch.randint(5, (3, 4))
    logits, weights = model(tokens)
    assert logits.shape == (3, 4, 2, 5)
    assert weights.shape == (3, 2, 4, 4)
    assert torch.allclose(weights.sum(dim=-1), torch.ones(3, 2, 4, dtype=weights.dtype))
    assert (weights.triu(diagonal=1) == 0).all()                        # no looking ahead


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
from attn_course.models.two_relations import TwoRelationConfig, train_two_relation_model
_, losses = train_two_relation_model(400, 0, config=TwoRelationConfig(num_heads=1))
print([f"{losses[step]:.2e}" for step in (0, 25, 50, 100, 200, 399)])   # as chapter 03 prints them
"""


@pytest.mark.slow   # two interpreters, each training 400 steps
def test_float64_training_prints_the_same_numbers_whatever_the_cpu_kernels():
    """Chapter 03 prints the chaotic one-head run's losses to three digits: in float64 they must
    not depend on which vector kernels (AVX2 or the machine's widest) or which BLAS code path the
    CPU takes. (In float32 they did: the loss at step 100 was 0.058 on one path, 0.083 on another.)
    The other run changes both paths at once (a third process, each alone, cost the suite about 20 s
    of a core); make test-other-cpu-path runs this test again from the other ATen path."""
    import os
    import subprocess
    import sys

    # Both at once: the training runs on one thread (as chapter 03's does). "native" is the CPU's own
    # path even where the caller forced another (make test-other-cpu-path sets ATEN_CPU_CAPABILITY).
    own = {key: value for key, value in os.environ.items() if key != "ATEN_CPU_CAPABILITY"}
    started = {name: subprocess.Popen([sys.executable, "-c", ONE_HEAD_LOSSES], env={**own, **extra},
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, extra in {"native": {},
                                   "avx2, compatible blas": {"ATEN_CPU_CAPABILITY": "avx2",
                                                             "MKL_CBWR": "COMPATIBLE"}}.items()}
    runs = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        runs[name] = stdout
    assert runs["avx2, compatible blas"] == runs["native"]
