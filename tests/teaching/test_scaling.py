"""attn_course.teaching.experiments.scaling: the variance of q · k, the gradients through the softmax, saturation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attn_course.teaching.experiments.scaling import (
    attention_gradients,
    dot_product_spread,
    scaling_experiment,
    softmax_jacobian,
    softmax_saturation,
)

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
TEMPERATURES = [1e3, 64.0, 8.0, 2.0, 1.0, 0.5, 0.1]                # decreasing


def test_saturation_matches_float64_numpy_math():
    result = softmax_saturation(SCORES, TEMPERATURES)
    scores = SCORES.double().numpy()
    for index, temperature in enumerate(TEMPERATURES):
        exps = np.exp(scores / temperature - np.max(scores / temperature))
        p = exps / exps.sum()
        assert result["temperature"][index].item() == temperature
        assert result["max_weight"][index].item() == pytest.approx(p.max(), rel=1e-12)
        assert result["entropy"][index].item() == pytest.approx(-(p * np.log(p)).sum(), rel=1e-9)


def test_jacobian_norms_are_those_of_the_autograd_jacobians():
    result = softmax_saturation(SCORES, TEMPERATURES)
    for index, temperature in enumerate(TEMPERATURES):
        # With respect to the softmax's input s / τ ...
        jacobian = autograd_softmax_jacobian(SCORES.double() / temperature)
        expected = torch.linalg.matrix_norm(jacobian).item()   # Frobenius
        assert result["jacobian_scaled"][index].item() == pytest.approx(expected, rel=1e-9, abs=1e-15)
        # ... and with respect to the raw scores s, through the division by τ.
        raw = torch.autograd.functional.jacobian(lambda s, t=temperature: torch.softmax(s / t, dim=-1),
                                                 SCORES.double())
        expected_raw = torch.linalg.matrix_norm(raw).item()
        assert result["jacobian_raw"][index].item() == pytest.approx(expected_raw, rel=1e-9, abs=1e-15)


def test_raw_gradient_falls_on_both_sides_of_its_peak():
    temperatures = [2.0 ** (e / 4) for e in range(-8, 25)]
    raw = softmax_saturation(SCORES * 4, temperatures)["jacobian_raw"]
    peak = int(raw.argmax())
    assert 0 < peak < len(temperatures) - 1
    assert (raw[: peak + 1].diff() > 0).all() and (raw[peak:].diff() < 0).all()


def test_max_weight_strictly_increases_as_temperature_decreases():
    result = softmax_saturation(SCORES, TEMPERATURES)
    assert (result["max_weight"].diff() > 0).all()
    assert (result["entropy"].diff() < 0).all()


@FAST
@given(n=st.integers(2, 8), seed=st.integers(0, 2**31 - 1))
def test_max_weight_never_decreases_as_temperature_decreases(n, seed):
    scores = 3 * randn(n, seed=seed)
    temperatures = sorted((10.0 ** e for e in np.linspace(-2, 3, 12)), reverse=True)
    result = softmax_saturation(scores, temperatures)
    assert (result["max_weight"].diff() >= 0).all()
    assert (result["max_weight"] <= 1).all() and (result["max_weight"] >= 1 / n).all()


def test_tiny_temperature_saturates_and_kills_the_gradient():
    result = softmax_saturation(SCORES, [1e-3])
    assert result["max_weight"].item() == pytest.approx(1.0, abs=1e-12)
    assert result["jacobian_scaled"].item() < 1e-12 and result["jacobian_raw"].item() < 1e-9
    assert result["entropy"].item() < 1e-12


def test_huge_temperature_gives_uniform_weights_with_entropy_log_n():
    result = softmax_saturation(SCORES, [1e6])
    n = SCORES.numel()
    assert result["entropy"].item() == pytest.approx(math.log(n), abs=1e-6)
    assert result["max_weight"].item() == pytest.approx(1 / n, abs=1e-6)
    # At uniform p the Jacobian is I/N - 1/N², Frobenius norm sqrt(N-1)/N.
    assert result["jacobian_scaled"].item() == pytest.approx(math.sqrt(n - 1) / n, abs=1e-6)
    assert result["jacobian_raw"].item() == pytest.approx(math.sqrt(n - 1) / n / 1e6, abs=1e-12)


def test_constant_scores_stay_uniform_for_every_temperature():
    result = softmax_saturation(torch.full((4,), 2.5), [1e-3, 1.0, 1e3])
    close(result["max_weight"], torch.full((3,), 0.25, dtype=torch.float64), 1e-7)


def test_saturation_results_are_float64_one_per_temperature():
    result = softmax_saturation(SCORES, [1.0, 2.0])
    assert set(result) == {"temperature", "max_weight", "entropy", "jacobian_scaled", "jacobian_raw"}
    for column in result.values():
        assert column.dtype == torch.float64 and column.shape == (2,)


SATURATION_BAD_ARGUMENTS = [
    pytest.param(torch.tensor([1, 2, 3]), [1.0], TypeError, "scores", id="integer-scores"),
    pytest.param([1.0, 2.0], [1.0], TypeError, "scores", id="list-scores"),
    pytest.param(torch.zeros(2, 3), [1.0], ValueError, "scores", id="two-dimensional-scores"),
    pytest.param(torch.tensor(1.0), [1.0], ValueError, "scores", id="zero-dimensional-scores"),
    pytest.param(SCORES, [1.0, 0.0], ValueError, r"temperatures\[1\]", id="zero-temperature"),
    pytest.param(SCORES, [-2.0], ValueError, r"temperatures\[0\]", id="negative-temperature"),
    pytest.param(SCORES, [math.inf], ValueError, r"temperatures\[0\]", id="infinite-temperature"),
    pytest.param(SCORES, [math.nan], ValueError, r"temperatures\[0\]", id="nan-temperature"),
    pytest.param(SCORES, ["2"], TypeError, r"temperatures\[0\]", id="string-temperature"),
    pytest.param(SCORES, [True], TypeError, r"temperatures\[0\]", id="bool-temperature"),
]


@pytest.mark.parametrize(("scores", "temperatures", "error", "name"), SATURATION_BAD_ARGUMENTS)
def test_softmax_saturation_rejects_bad_arguments(scores, temperatures, error, name):
    with pytest.raises(error, match=rf"softmax_saturation: {name}"):
        softmax_saturation(scores, temperatures)


def test_empty_scores_raise_value_error():
    with pytest.raises(ValueError, match="softmax_saturation: scores"):
        softmax_saturation(torch.zeros(0), [1.0])


def test_bare_number_temperatures_raise_type_error_naming_the_argument():
    with pytest.raises(TypeError, match="softmax_saturation: temperatures"):
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


# --- attention_gradients: the chain rule by hand against autograd --------------------------


def autograd_gradients(x, w_q, w_k, upstream, temperature):
    """The same quantities as attention_gradients, by automatic differentiation."""
    w_q = w_q.clone().requires_grad_()
    q = x @ w_q
    q.retain_grad()
    scores = q @ (x @ w_k).transpose(-2, -1)
    scores.retain_grad()
    weights = torch.softmax(scores / temperature, dim=-1)
    (weights * upstream).sum().backward()
    return {"weights": weights.detach(), "scores": scores.grad, "queries": q.grad, "w_q": w_q.grad}


@pytest.mark.parametrize("temperature", [0.25, 1.0, 8.0, 64.0])
def test_gradient_with_respect_to_raw_scores_is_jacobian_times_upstream_over_temperature(temperature):
    x, w_q, w_k = randn(5, 6, seed=1), randn(6, 4, seed=2) / 2, randn(6, 4, seed=3) / 2
    upstream = randn(5, 5, seed=4)
    grads = attention_gradients(x, w_q, w_k, upstream, temperature=temperature)
    scores = (x @ w_q) @ (x @ w_k).T
    for row in range(5):
        # ∂a/∂(s/τ) by autograd, times the upstream gradient, times 1/τ for the division.
        jacobian = autograd_softmax_jacobian(scores[row] / temperature)   # [N, N]: ∂a_i/∂z_j
        expected = jacobian.T @ upstream[row] / temperature
        close(grads["scores"][row], expected, 1e-10)


@pytest.mark.parametrize("temperature", [0.5, 3.0])
def test_gradients_match_autograd_down_to_w_q(temperature):
    x, w_q, w_k = randn(2, 7, 5, seed=1), randn(2, 5, 3, seed=2), randn(2, 5, 3, seed=3)
    upstream = randn(2, 7, 7, seed=4)
    ours = attention_gradients(x, w_q, w_k, upstream, temperature=temperature)
    theirs = autograd_gradients(x, w_q, w_k, upstream, temperature)
    for name, expected in theirs.items():
        close(ours[name], expected, 1e-10)


def test_each_querys_share_of_the_w_q_gradient_is_the_gradient_of_its_own_row():
    x, w_q, w_k = randn(4, 5, seed=1), randn(5, 3, seed=2), randn(5, 3, seed=3)
    upstream = randn(4, 4, seed=4)
    shares = attention_gradients(x, w_q, w_k, upstream, temperature=2.0)["w_q_per_query"]
    for row in range(4):
        only_this_row = torch.zeros_like(upstream)
        only_this_row[row] = upstream[row]
        expected = autograd_gradients(x, w_q, w_k, only_this_row, 2.0)["w_q"].norm()
        close(shares[row], expected, 1e-10)


def test_batched_gradients_equal_one_trial_at_a_time():
    x, w_q, w_k = randn(3, 4, 5, seed=1), randn(3, 5, 2, seed=2), randn(3, 5, 2, seed=3)
    upstream = randn(3, 4, 4, seed=4)
    batched = attention_gradients(x, w_q, w_k, upstream, temperature=1.5)
    for t in range(3):
        single = attention_gradients(x[t], w_q[t], w_k[t], upstream[t], temperature=1.5)
        for name in single:
            close(batched[name][t], single[name], 1e-12)


GRADIENT_BAD_ARGUMENTS = [
    pytest.param({"x": randn(4, 5).long()}, TypeError, "x", id="integer-x"),
    pytest.param({"w_q": randn(5, 3).float()}, TypeError, "dtype", id="mixed-dtypes"),
    pytest.param({"w_q": randn(6, 3)}, ValueError, "w_q", id="w_q-wrong-width"),
    pytest.param({"w_k": randn(5, 2)}, ValueError, "w_k", id="w_k-differs-from-w_q"),
    pytest.param({"upstream": randn(4, 3)}, ValueError, "upstream", id="upstream-not-square"),
    pytest.param({"x": randn(5)}, ValueError, "x", id="one-dimensional-x"),
    pytest.param({"temperature": 0.0}, ValueError, "temperature", id="zero-temperature"),
    pytest.param({"temperature": "1"}, TypeError, "temperature", id="string-temperature"),
]


@pytest.mark.parametrize(("changes", "error", "name"), GRADIENT_BAD_ARGUMENTS)
def test_attention_gradients_rejects_bad_arguments(changes, error, name):
    arguments = {"x": randn(4, 5), "w_q": randn(5, 3), "w_k": randn(5, 3), "upstream": randn(4, 4),
                 "temperature": 1.0, **changes}
    temperature = arguments.pop("temperature")
    with pytest.raises(error, match=rf"attention_gradients: .*{name}"):
        attention_gradients(*arguments.values(), temperature=temperature)


# --- scaling_experiment ---------------------------------------------------------------------


def test_experiment_statistics_match_an_independent_autograd_computation():
    """Redraw the experiment's random numbers in its order and recompute with autograd."""
    d_k, n_tokens, width, n_trials = 8, 5, 6, 3
    result = scaling_experiment([d_k], n_tokens=n_tokens, width=width, n_trials=n_trials, seed=3)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(n_trials, n_tokens, width, generator=generator, dtype=torch.float64)
    w_q, w_k = (torch.randn(n_trials, width, d_k, generator=generator, dtype=torch.float64) / math.sqrt(width)
                for _ in range(2))
    upstream = torch.randn(n_trials, n_tokens, n_tokens, generator=generator, dtype=torch.float64)
    shares = {}
    for run, temperature in (("unscaled", 1.0), ("scaled", math.sqrt(d_k))):
        grads = autograd_gradients(x, w_q, w_k, upstream, temperature)
        shares[run] = x.norm(dim=-1) * grads["queries"].norm(dim=-1)
        expected = {
            "max_weight": grads["weights"].amax(dim=-1).mean(),
            "score_gradient": grads["scores"].norm(dim=-1).median(),
            "w_q_gradient": shares[run].median(),
        }
        for name, value in expected.items():
            assert result[run][name].item() == pytest.approx(value.item(), rel=1e-10)
        # The total W_Q gradient of one trial is the gradient of that trial's loss alone.
        totals = [autograd_gradients(x[t], w_q[t], w_k[t], upstream[t], temperature)["w_q"].norm()
                  for t in range(n_trials)]
        assert result[run]["w_q_gradient_total"].item() == pytest.approx(sum(totals).item() / n_trials, rel=1e-10)
    typical = shares["scaled"].median()
    for run in shares:
        assert result[run]["starved"].item() == pytest.approx((shares[run] < typical / 100).double().mean().item())


def test_scaled_weights_stay_put_while_unscaled_weights_saturate_as_d_k_grows():
    result = scaling_experiment([16, 256, 1024], n_trials=16)
    scaled, unscaled = result["scaled"], result["unscaled"]
    # Scaled: the softmax sees unit-variance scores whatever d_k; statistics do not drift.
    assert (scaled["max_weight"] - scaled["max_weight"].mean()).abs().max() < 0.03
    assert scaled["w_q_gradient"].max() / scaled["w_q_gradient"].min() < 1.2
    assert (scaled["starved"] == 0).all()
    # Unscaled: ever closer to one-hot, and the typical query's gradient collapses.
    assert (unscaled["max_weight"].diff() > 0).all() and unscaled["max_weight"][-1] > 0.9
    assert unscaled["w_q_gradient"][-1] < 1e-2 * unscaled["w_q_gradient"][0]
    assert unscaled["starved"][-1] > 0.3
    # With the scaling, ∂L/∂s shrinks as 1/√d_k (the 1/τ of the chain rule).
    ratio = scaled["score_gradient"][0] / scaled["score_gradient"][-1]
    assert ratio.item() == pytest.approx(math.sqrt(1024 / 16), rel=0.25)


def test_experiment_is_repeatable_by_seed():
    first = scaling_experiment([4, 32], n_trials=2, seed=5)
    second = scaling_experiment([4, 32], n_trials=2, seed=5)
    other = scaling_experiment([4, 32], n_trials=2, seed=6)
    assert torch.equal(first["d_k"], torch.tensor([4.0, 32.0], dtype=torch.float64))
    for run in ("unscaled", "scaled"):
        for name, column in first[run].items():
            assert torch.equal(column, second[run][name]) and column.dtype == torch.float64
    assert not torch.equal(first["scaled"]["max_weight"], other["scaled"]["max_weight"])


EXPERIMENT_BAD_ARGUMENTS = [
    pytest.param({"d_k_values": 16}, TypeError, "d_k_values", id="bare-int"),
    pytest.param({"d_k_values": [16, 0]}, ValueError, r"d_k_values\[1\]", id="zero-size"),
    pytest.param({"d_k_values": [4], "n_tokens": 1}, ValueError, "n_tokens", id="one-token"),
    pytest.param({"d_k_values": [4], "width": 0}, ValueError, "width", id="zero-width"),
    pytest.param({"d_k_values": [4], "n_trials": 2.0}, TypeError, "n_trials", id="float-trials"),
    pytest.param({"d_k_values": [4], "seed": "0"}, TypeError, "seed", id="string-seed"),
]


@pytest.mark.parametrize(("arguments", "error", "name"), EXPERIMENT_BAD_ARGUMENTS)
def test_scaling_experiment_rejects_bad_arguments(arguments, error, name):
    with pytest.raises(error, match=rf"scaling_experiment: {name}"):
        scaling_experiment(**arguments)
