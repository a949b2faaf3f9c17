"""Tests for attn_course.data.toy_sentence: the hand-built "bank of the river" embedding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attn_course.core.attention import self_attention
from attn_course.data.toy_sentence import FEATURES, SENTENCE, TOKENS, bank_sentence


def feature_space_scores(sentence) -> torch.Tensor:
    """``(X W_Q)(X W_K)ᵀ`` in the six named features, without the lift."""
    x = sentence.embeddings.double()
    return (x @ sentence.w_q.double()) @ (x @ sentence.w_k.double()).T   # [N, N]


def test_tokens_spell_the_sentence():
    assert " ".join(TOKENS).replace(" .", ".") == SENTENCE
    sentence = bank_sentence()
    assert sentence.tokens == TOKENS and sentence.feature_names == FEATURES


def test_two_calls_give_identical_tensors():
    first, second = bank_sentence(), bank_sentence()
    for field in dataclasses.fields(first):
        a, b = getattr(first, field.name), getattr(second, field.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), field.name
        else:
            assert a == b, field.name


@pytest.mark.parametrize("d_k", [6, 64, 128])
def test_lift_rows_are_orthonormal(d_k):
    lift = bank_sentence(d_k, dtype=torch.float64).lift
    assert lift.shape == (len(FEATURES), d_k)
    torch.testing.assert_close(lift @ lift.T, torch.eye(len(FEATURES), dtype=torch.float64))


def test_at_d_k_6_keys_and_values_are_the_features_unrotated():
    # Chapter 01 reads the keys and values as named features: no rotation may hide them.
    sentence = bank_sentence(6)
    assert torch.equal(sentence.keys, sentence.embeddings)
    assert torch.equal(sentence.values, sentence.embeddings)
    wants = torch.tensor([[0, 3, 3, 1, 0.5, 0], [0, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0],
                          [3, 1, 0, 0, 0, 0], [2, 0, 0, 0, 0.5, 0], [1, 1, 1, 1, 1, 0]])
    assert torch.equal(sentence.queries, sentence.embeddings @ wants * 8)


def test_shapes_and_d_k():
    sentence = bank_sentence()
    assert sentence.d_k == 64
    for tensor in (sentence.queries, sentence.keys, sentence.values):
        assert tensor.shape == (len(TOKENS), 64)
        assert tensor.dtype == torch.float32
    assert sentence.embeddings.shape == (len(TOKENS), len(FEATURES))


def test_lifted_scores_equal_feature_space_scores():
    sentence = bank_sentence()
    scores = (sentence.queries @ sentence.keys.T).double()
    torch.testing.assert_close(scores, feature_space_scores(sentence), atol=1e-4, rtol=1e-5)


def test_keys_and_values_are_the_features_themselves():
    sentence = bank_sentence(dtype=torch.float64)
    torch.testing.assert_close(sentence.keys @ sentence.lift.T, sentence.embeddings)
    torch.testing.assert_close(sentence.values @ sentence.lift.T, sentence.embeddings)


@pytest.mark.parametrize("d_k", [6, 128])
def test_scores_do_not_depend_on_d_k(d_k):
    reference = bank_sentence(64, dtype=torch.float64)
    other = bank_sentence(d_k, dtype=torch.float64)
    assert other.queries.shape == (len(TOKENS), d_k)
    torch.testing.assert_close(
        other.queries @ other.keys.T, reference.queries @ reference.keys.T, atol=1e-10, rtol=0
    )


def test_bank_attends_most_to_river_at_scale_one_eighth():
    sentence = bank_sentence()
    bank, river = sentence.index("bank"), sentence.index("river")
    scores = sentence.queries @ sentence.keys.T / 8
    assert int(scores[bank].argmax()) == river
    # The same through self_attention, whose default scale 1/sqrt(64) is 1/8.
    _, weights = self_attention(sentence.queries, sentence.keys, sentence.values)
    assert int(weights[bank].argmax()) == river


def test_muddy_attends_most_to_a_thing():
    # A property looks for the thing it describes: "river" or "bank", not a function word.
    sentence = bank_sentence()
    scores = sentence.queries @ sentence.keys.T
    assert sentence.tokens[int(scores[sentence.index("muddy")].argmax())] in {"river", "bank"}


def test_to_features_round_trips_values_and_queries():
    sentence = bank_sentence(dtype=torch.float64)
    torch.testing.assert_close(sentence.to_features(sentence.values), sentence.embeddings)
    torch.testing.assert_close(
        sentence.to_features(sentence.queries), sentence.embeddings @ sentence.w_q
    )
    batch = sentence.values.expand(3, -1, -1)                         # [3, N, d_k]
    torch.testing.assert_close(sentence.to_features(batch), sentence.embeddings.expand(3, -1, -1))


def test_to_features_rejects_wrong_width_and_integer_vectors():
    sentence = bank_sentence()
    with pytest.raises(ValueError, match="d_k=64"):
        sentence.to_features(torch.zeros(2, 63))
    with pytest.raises(TypeError, match="vectors"):
        sentence.to_features(torch.zeros(2, 64, dtype=torch.int64))


def test_index_finds_tokens_and_is_case_sensitive():
    sentence = bank_sentence()
    assert sentence.index("The") == 0
    assert sentence.index("the") == 3
    assert sentence.index(".") == 7


def test_index_of_unknown_token_raises_value_error():
    with pytest.raises(ValueError, match="'nope'"):
        bank_sentence().index("nope")


@pytest.mark.parametrize("d_k", [5, 1, 0, -3])
def test_d_k_below_six_raises_value_error(d_k):
    with pytest.raises(ValueError, match="d_k must be >= 6"):
        bank_sentence(d_k)


@pytest.mark.parametrize("d_k", [64.0, "64", True])
def test_non_integer_d_k_raises_type_error(d_k):
    with pytest.raises(TypeError, match="d_k"):
        bank_sentence(d_k)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32"])
def test_non_floating_dtype_raises_type_error(dtype):
    with pytest.raises(TypeError, match="dtype"):
        bank_sentence(dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_dtype_applies_to_every_tensor(dtype):
    sentence = bank_sentence(dtype=dtype)
    for name in ("embeddings", "w_q", "w_k", "w_v", "lift", "queries", "keys", "values"):
        assert getattr(sentence, name).dtype == dtype, name
