"""Tests for attn_course.scaling: the variance of q · k and softmax saturation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attn_course.scaling import dot_product_spread, softmax_jacobian, softmax_saturation

from helpers import FAST, close


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


def autograd_softmax_jacobian(scores: torch.Tensor) -> torch.Tensor:
    """∂softmax(s)_i / ∂s_j by automatic differentiation, for one row ``[N]``."""
    return torch.autograd.functional.jacobian(lambda s: torch.softmax(s, dim=-1), scores)


# --- dot_product_spread ---------------------------------------------------------------------


def test_raw_variance_is_d_k_and_scaled_variance_is_one():
    d_k_values = [1, 16, 256]
    spread = dot_product_spread(d_k_values, n_pairs=20_000)
    theory = torch.tensor(d_k_values, dtype=torch.float64)   # Var(q · k) = d_k for N(0, 1)
    assert torch.equal(spread["d_k"], theory)
    torch.testing.assert_close(spread["raw_variance"], theory, rtol=0.1, atol=0)
    torch.testing.assert_close(spread["scaled_variance"], torch.ones(3, dtype=torch.float64),
                               rtol=0.1, atol=0)
    # Dividing by √d_k divides the variance by d_k exactly.
    close(spread["scaled_variance"], spread["raw_variance"] / theory, 1e-7)


def test_unscaled_spread_grows_with_d_k():
    spread = dot_product_spread([2, 8, 32, 128], n_pairs=4000)
    assert (spread["raw_variance"].diff() > 0).all()


def test_same_seed_gives_same_numbers_and_another_seed_differs():
    first = dot_product_spread([4, 32], n_pairs=500, seed=7)
    second = dot_product_spread([4, 32], n_pairs=500, seed=7)
    other = dot_product_spread([4, 32], n_pairs=500, seed=8)
    for name in first:
        assert torch.equal(first[name], second[name])
    assert not torch.equal(first["raw_variance"], other["raw_variance"])


SPREAD_BAD_ARGUMENTS = [
    pytest.param({"d_k_values": 16}, TypeError, "d_k_values", id="bare-int"),
    pytest.param({"d_k_values": "16"}, TypeError, "d_k_values", id="string"),
    pytest.param({"d_k_values": [16.0]}, TypeError, r"d_k_values\[0\]", id="float-size"),
    pytest.param({"d_k_values": [4, 0]}, ValueError, r"d_k_values\[1\]", id="zero-size"),
    pytest.param({"d_k_values": [4], "n_pairs": 1}, ValueError, "n_pairs", id="one-pair"),
    pytest.param({"d_k_values": [4], "n_pairs": 10.0}, TypeError, "n_pairs", id="float-pairs"),
    pytest.param({"d_k_values": [4], "seed": 0.5}, TypeError, "seed", id="float-seed"),
]


@pytest.mark.parametrize(("arguments", "error", "name"), SPREAD_BAD_ARGUMENTS)
def test_dot_product_spread_rejects_bad_arguments(arguments, error, name):
    with pytest.raises(error, match=rf"dot_product_spread: {name}"):
        dot_product_spread(**arguments)


# --- softmax_saturation ---------------------------------------------------------------------

SCORES = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0])
DIVISORS = [1e3, 64.0, 8.0, 2.0, 1.0, 0.5, 0.1]                    # decreasing


def test_saturation_matches_float64_numpy_math():
    result = softmax_saturation(SCORES, DIVISORS)
    scores = SCORES.double().numpy()
    for index, divisor in enumerate(DIVISORS):
        exps = np.exp(scores / divisor - np.max(scores / divisor))
        p = exps / exps.sum()
        assert result["divisor"][index].item() == divisor
        assert result["max_weight"][index].item() == pytest.approx(p.max(), rel=1e-12)
        assert result["entropy"][index].item() == pytest.approx(-(p * np.log(p)).sum(), rel=1e-9)


def test_gradient_norm_is_the_norm_of_the_autograd_jacobian():
    result = softmax_saturation(SCORES, DIVISORS)
    for index, divisor in enumerate(DIVISORS):
        jacobian = autograd_softmax_jacobian(SCORES.double() / divisor)
        expected = torch.linalg.matrix_norm(jacobian).item()   # Frobenius
        assert result["gradient_norm"][index].item() == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_max_weight_strictly_increases_as_divisor_decreases():
    result = softmax_saturation(SCORES, DIVISORS)
    assert (result["max_weight"].diff() > 0).all()
    assert (result["entropy"].diff() < 0).all()


@FAST
@given(n=st.integers(2, 8), seed=st.integers(0, 2**31 - 1))
def test_max_weight_never_decreases_as_divisor_decreases(n, seed):
    scores = 3 * randn(n, seed=seed)
    divisors = sorted((10.0 ** e for e in np.linspace(-2, 3, 12)), reverse=True)
    result = softmax_saturation(scores, divisors)
    assert (result["max_weight"].diff() >= 0).all()
    assert (result["max_weight"] <= 1).all() and (result["max_weight"] >= 1 / n).all()


def test_tiny_divisor_saturates_and_kills_the_gradient():
    result = softmax_saturation(SCORES, [1e-3])
    assert result["max_weight"].item() == pytest.approx(1.0, abs=1e-12)
    assert result["gradient_norm"].item() < 1e-12
    assert result["entropy"].item() < 1e-12


def test_huge_divisor_gives_uniform_weights_with_entropy_log_n():
    result = softmax_saturation(SCORES, [1e6])
    n = SCORES.numel()
    assert result["entropy"].item() == pytest.approx(math.log(n), abs=1e-6)
    assert result["max_weight"].item() == pytest.approx(1 / n, abs=1e-6)
    # At uniform p the Jacobian is I/N - 1/N², Frobenius norm sqrt(N-1)/N.
    assert result["gradient_norm"].item() == pytest.approx(math.sqrt(n - 1) / n, abs=1e-6)


def test_constant_scores_stay_uniform_for_every_divisor():
    result = softmax_saturation(torch.full((4,), 2.5), [1e-3, 1.0, 1e3])
    close(result["max_weight"], torch.full((3,), 0.25, dtype=torch.float64), 1e-7)


def test_saturation_results_are_float64_one_per_divisor():
    result = softmax_saturation(SCORES, [1.0, 2.0])
    assert set(result) == {"divisor", "max_weight", "entropy", "gradient_norm"}
    for column in result.values():
        assert column.dtype == torch.float64 and column.shape == (2,)


SATURATION_BAD_ARGUMENTS = [
    pytest.param(torch.tensor([1, 2, 3]), [1.0], TypeError, "scores", id="integer-scores"),
    pytest.param([1.0, 2.0], [1.0], TypeError, "scores", id="list-scores"),
    pytest.param(torch.zeros(2, 3), [1.0], ValueError, "scores", id="two-dimensional-scores"),
    pytest.param(torch.tensor(1.0), [1.0], ValueError, "scores", id="zero-dimensional-scores"),
    pytest.param(SCORES, [1.0, 0.0], ValueError, r"divisors\[1\]", id="zero-divisor"),
    pytest.param(SCORES, [-2.0], ValueError, r"divisors\[0\]", id="negative-divisor"),
    pytest.param(SCORES, [math.inf], ValueError, r"divisors\[0\]", id="infinite-divisor"),
    pytest.param(SCORES, [math.nan], ValueError, r"divisors\[0\]", id="nan-divisor"),
    pytest.param(SCORES, ["2"], TypeError, r"divisors\[0\]", id="string-divisor"),
    pytest.param(SCORES, [True], TypeError, r"divisors\[0\]", id="bool-divisor"),
]


@pytest.mark.parametrize(("scores", "divisors", "error", "name"), SATURATION_BAD_ARGUMENTS)
def test_softmax_saturation_rejects_bad_arguments(scores, divisors, error, name):
    with pytest.raises(error, match=rf"softmax_saturation: {name}"):
        softmax_saturation(scores, divisors)


def test_empty_scores_raise_value_error():
    with pytest.raises(ValueError, match="softmax_saturation: scores"):
        softmax_saturation(torch.zeros(0), [1.0])


def test_bare_number_divisors_raise_type_error_naming_the_argument():
    with pytest.raises(TypeError, match="softmax_saturation: divisors"):
        softmax_saturation(SCORES, 8.0)


# --- softmax_jacobian -----------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 5])
def test_softmax_jacobian_equals_autograd_jacobian(n):
    scores = randn(n, seed=n)
    expected = autograd_softmax_jacobian(scores)
    close(softmax_jacobian(torch.softmax(scores, dim=-1)), expected, 1e-7)


def test_softmax_jacobian_works_row_by_row_on_batches():
    scores = randn(2, 3, 4, seed=1)
    jacobians = softmax_jacobian(torch.softmax(scores, dim=-1))
    assert jacobians.shape == (2, 3, 4, 4)
    for b in range(2):
        for row in range(3):
            close(jacobians[b, row], autograd_softmax_jacobian(scores[b, row]), 1e-7)


def test_softmax_jacobian_rows_sum_to_zero_and_is_symmetric():
    jacobian = softmax_jacobian(torch.softmax(randn(6, seed=3), dim=-1))
    close(jacobian.sum(dim=-1), torch.zeros(6, dtype=torch.float64), 1e-7)
    close(jacobian, jacobian.T, 1e-7)


def test_softmax_jacobian_rejects_integer_and_scalar_weights():
    with pytest.raises(TypeError, match="softmax_jacobian: weights"):
        softmax_jacobian(torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="softmax_jacobian: weights"):
        softmax_jacobian(torch.tensor(1.0))
