"""attn_course.checks.lookup (chapter 01's exercises): right answers pass, each mistake gets its own message."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attn_course.checks.diagnosis import CheckFailed
from attn_course.checks.lookup import (
    check_attention_from_embeddings,
    check_attention_map,
    check_identical_keys_prediction,
)
from attn_course.checks.rescaled_weights import check_rescaled_weights

# --- exercise 1: attention from embeddings ----------------------------------------------------
# Right answers written independently of the package: the formula with torch.softmax, float64
# loops. PyTorch's SDPA is what the exercise forbids.


def formula_from_embeddings(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v, weights


def sdpa_from_embeddings(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    identity = torch.eye(x.shape[0])
    return F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, identity)


def loop_from_embeddings(x, w_q, w_k, w_v):
    x, w_q, w_k, w_v = (t.double() for t in (x, w_q, w_k, w_v))
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    rows = []
    for i in range(x.shape[0]):
        exps = [math.exp(float(q[i] @ k[j]) / math.sqrt(q.shape[1])) for j in range(x.shape[0])]
        rows.append([value / sum(exps) for value in exps])
    weights = torch.tensor(rows, dtype=torch.float64)
    return weights @ v, weights


@pytest.mark.parametrize("answer", [formula_from_embeddings, loop_from_embeddings])
def test_correct_attention_from_embeddings_passes(answer):
    assert check_attention_from_embeddings(answer) is True


def test_attention_already_written_is_refused_by_name():
    with pytest.raises(CheckFailed, match="calls F.scaled_dot_product_attention, which this exercise forbids"):
        check_attention_from_embeddings(sdpa_from_embeddings)


def test_a_list_of_output_and_weights_is_accepted():
    assert check_attention_from_embeddings(lambda *args: list(formula_from_embeddings(*args))) is True


def weights_with(scores_fn, dim=-1):
    """An answer whose weights are softmax(scores_fn(x, q, k, v)) and whose output follows from them."""

    def answer(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        weights = torch.softmax(scores_fn(x, q, k), dim=dim)
        return weights @ v, weights

    return answer


@pytest.mark.parametrize("answer, message", [
    (weights_with(lambda x, q, k: q @ k.T), "without the scaling"),
    (weights_with(lambda x, q, k: q @ k.T / 4), "divided the scores by d_k = 4"),
    (weights_with(lambda x, q, k: q @ k.T / x.shape[1] ** 0.5), "√E = √10, the width of the embeddings"),
    (weights_with(lambda x, q, k: q @ k.T / 2, dim=0), "normalises over the queries"),
    (weights_with(lambda x, q, k: k @ q.T / 2), "Your map is transposed"),
    (weights_with(lambda x, q, k: q @ q.T / 2), "projected with w_q"),
    (weights_with(lambda x, q, k: x @ x.T / 2), "compare the embeddings x with each other"),
])
def test_each_mistake_in_the_weights_is_named(answer, message):
    with pytest.raises(CheckFailed, match=message):
        check_attention_from_embeddings(answer)


def output_with(mix):
    def answer(x, w_q, w_k, w_v):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        scores = q @ k.T / 2
        weights = torch.softmax(scores, dim=-1)
        return mix(x, scores, weights, v), weights

    return answer


@pytest.mark.parametrize("answer, message", [
    (output_with(lambda x, scores, weights, v: weights @ x), r"shape \[6, 10\], the width E"),
    (output_with(lambda x, scores, weights, v: scores @ v), "with the scores, not with the weights"),
    (output_with(lambda x, scores, weights, v: weights.T @ v), "transposed weights"),
])
def test_each_mistake_in_the_output_is_named(answer, message):
    with pytest.raises(CheckFailed, match=message):
        check_attention_from_embeddings(answer)


def test_a_single_tensor_is_asked_to_become_the_pair():
    with pytest.raises(CheckFailed, match=r"returns one tensor of shape \[6, 3\]; return the pair"):
        check_attention_from_embeddings(lambda *args: formula_from_embeddings(*args)[0])
    with pytest.raises(CheckFailed, match="tuple of 3 items"):
        check_attention_from_embeddings(lambda *args: (*formula_from_embeddings(*args), None))


def test_an_unfinished_or_crashing_answer_is_told_so():
    with pytest.raises(CheckFailed, match="returns nothing yet"):
        check_attention_from_embeddings(lambda *args: ...)
    with pytest.raises(CheckFailed, match="Your function raised RuntimeError"):
        check_attention_from_embeddings(lambda x, w_q, w_k, w_v: (x @ x, x))


def test_an_unknown_mistake_points_at_the_first_differing_weight():
    def off(x, w_q, w_k, w_v):
        output, weights = formula_from_embeddings(x, w_q, w_k, w_v)
        weights = weights.clone()
        weights[2, 3] += 0.1
        return output, weights

    with pytest.raises(CheckFailed, match=r"first entry that differs is at \[query 2, key 3\]"):
        check_attention_from_embeddings(off)


# --- exercise 2: identical keys ---------------------------------------------------------------


def test_the_uniform_prediction_passes_in_any_floating_dtype():
    assert check_identical_keys_prediction(lambda n: torch.ones(n, dtype=torch.float64) / n) is True


@pytest.mark.parametrize("answer, message", [
    (lambda n: torch.ones(n), "for n = 4 sum to 4"),
    (lambda n: torch.zeros(n), "for n = 1 sum to 0"),
    (lambda n: torch.full((n,), 0.25), "for n = 1 sum to 0.25"),
    (lambda n: torch.eye(n)[0], "all the weight on one key"),
    (lambda n: torch.arange(1.0, n + 1) / torch.arange(1.0, n + 1).sum(), "sum to 1 but are not all equal"),
    (lambda n: torch.tensor(1.0 / n), "a single number; return one weight per key"),
    (lambda n: torch.ones(n, dtype=torch.long), "dtype torch.int64"),
])
def test_each_wrong_prediction_is_named(answer, message):
    with pytest.raises(CheckFailed, match=message):
        check_identical_keys_prediction(answer)


def test_a_prediction_that_is_not_a_tensor_is_told_so():
    with pytest.raises(CheckFailed, match="should return a torch.Tensor, but it returned list"):
        check_identical_keys_prediction(lambda n: [1.0 / n] * n)


# --- exercise 3: the attention map ------------------------------------------------------------


def sdpa_map(queries, keys):
    return F.scaled_dot_product_attention(queries, keys, torch.eye(keys.shape[0]))


def test_correct_map_passes():
    assert check_attention_map(sdpa_map) is True
    assert check_attention_map(lambda q, k: (sdpa_map(q, k).double(), None)) is True


def the_buggy_map(queries, keys):
    scores = keys @ queries.T / keys.shape[-1] ** 0.5
    return torch.softmax(scores, dim=-1)


@pytest.mark.parametrize("answer, message", [
    (the_buggy_map, r"shape \[7, 5\] = \[N_k, N_q\]: one row per key"),
    (lambda q, k: torch.softmax(k @ q.T / 4, dim=0), "holds the right weights, but transposed"),
    (lambda q, k: the_buggy_map(q, k).T, "normalises over the queries"),
    (lambda q, k: torch.softmax(q @ k.T / 4, dim=0), "normalises over the queries"),
    (lambda q, k: torch.softmax(q @ k.T, dim=-1), "without the scaling"),
    (lambda q, k: torch.softmax(q @ k.T / 16, dim=-1), "divided the scores by d_k = 16"),
    (lambda q, k: torch.softmax(q @ k.T / k.shape[0] ** 0.5, dim=-1), "number of keys"),
])
def test_each_wrong_map_is_named(answer, message):
    with pytest.raises(CheckFailed, match=message):
        check_attention_map(answer)


# --- exercise 4: rescaled weights -------------------------------------------------------------


def powers(weights, factor):
    powered = weights.double() ** factor
    return powered / powered.sum(dim=-1, keepdim=True)


def test_correct_rescaling_passes_written_two_ways():
    assert check_rescaled_weights(powers) is True
    assert check_rescaled_weights(lambda w, c: torch.softmax(c * torch.log(w), dim=-1)) is True


@pytest.mark.parametrize("answer, message", [
    (lambda w, c: w, "did not change, but multiplying the scores by c = 2 does change them"),
    (lambda w, c: torch.softmax(c * w, dim=-1), "softmax as if they were the scores"),
    (lambda w, c: powers(w, 1 / c), "moved the wrong way"),
    (lambda w, c: w ** c, "proportional to the right ones, but row 0 sums to"),
    (lambda w, c: c * w, "row 0 sums to 2"),
    (lambda w, c: (w ** c) / (w ** c).sum(dim=0, keepdim=True), "along dimension 0"),
    (lambda w, c: torch.softmax(c * torch.log(w), dim=-1).to(torch.int64), "dtype torch.int64"),
])
def test_each_wrong_rescaling_is_named(answer, message):
    with pytest.raises(CheckFailed, match=message):
        check_rescaled_weights(answer)


def test_rescaling_that_is_only_right_for_matrices_is_caught_on_a_vector():
    # Normalising over dimension 1 works for [3, 6] and crashes for [6].
    with pytest.raises(CheckFailed, match="Your function raised IndexError"):
        check_rescaled_weights(lambda w, c: (w ** c) / (w ** c).sum(dim=1, keepdim=True))


# --- every check: input validation, and the caller's random state ---------------------------------

CHECKS = [check_attention_from_embeddings, check_identical_keys_prediction, check_attention_map,
          check_rescaled_weights]


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_checks_reject_anything_but_a_function(check):
    with pytest.raises(TypeError, match=f"{check.__name__}: expected your function, got str"):
        check("attend")


@pytest.mark.parametrize("check, answer", [
    (check_attention_from_embeddings, formula_from_embeddings),
    (check_identical_keys_prediction, lambda n: torch.ones(n) / n),
    (check_attention_map, sdpa_map),
    (check_rescaled_weights, powers),
], ids=lambda item: getattr(item, "__name__", ""))
def test_checks_leave_the_global_random_state_alone(check, answer):
    torch.manual_seed(5)
    before = torch.get_rng_state()
    check(answer)
    assert torch.equal(torch.get_rng_state(), before)
