"""attn_course.checks.scaling: the score-size prediction and the query gradient; each mistake named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attn_course.checks.diagnosis import CheckFailed
from attn_course.checks.scaling import SCORE_STD_CASES, check_query_gradient, check_score_std_prediction

# --- predicting the standard deviation of q·k -----------------------------------------------


def test_the_right_prediction_passes_as_a_float_or_a_tensor():
    assert check_score_std_prediction(lambda d_k, std_q, std_k: math.sqrt(d_k) * std_q * std_k) is True
    assert check_score_std_prediction(lambda d_k, std_q, std_k: torch.tensor(d_k * (std_q * std_k) ** 2).sqrt())
    assert check_score_std_prediction(lambda d_k, std_q, std_k: torch.tensor([d_k**0.5 * std_q * std_k]))
    assert check_score_std_prediction(lambda d_k, std_q, std_k: np.float32(math.sqrt(d_k) * std_q * std_k))


def test_the_right_prediction_passes_for_other_cases_and_seeds():
    cases = ((1, 1.0, 1.0), (1000, 0.1, 3.0), (33, 2.0, 0.5))
    for seed in (1, 7):
        assert check_score_std_prediction(lambda d, a, b: math.sqrt(d) * a * b, cases=cases, seed=seed)


def measure(d_k, std_q, std_k):
    return (torch.randn(2000, d_k) * std_q * torch.randn(2000, d_k) * std_k).sum(-1).std()


def measure_unwatched(d_k, std_q, std_k):
    """Issue 31, attack 7: a measurement through torch.ops.aten, which the watch does not see, from the
    global generator (in the grader's sandbox that is the sandbox's own, which the grader never sees move)."""
    pairs = torch.ops.aten.randn.default([2, 2000, d_k], dtype=torch.float64)
    return float((pairs[0] * std_q * pairs[1] * std_k).sum(-1).std())


def measure_seeded_unwatched(d_k, std_q, std_k):
    """The same, with a NumPy generator of its own: the same answer every time, about 1 % off."""
    pairs = np.random.default_rng(0).standard_normal((2, 2000, d_k))
    return float((pairs[0] * std_q * pairs[1] * std_k).sum(-1).std())


def measure_with(generator, d_k, std_q, std_k):
    pairs = torch.randn(2, 2000, d_k, generator=generator)
    return (pairs[0] * std_q * pairs[1] * std_k).sum(-1).std()


PREDICTIONS = {
    "a constant": (lambda d_k, std_q, std_k: torch.tensor(8.0), "whatever d_k"),
    "the variance": (lambda d_k, std_q, std_k: d_k * std_q**2 * std_k**2, "the variance of q·k"),
    "ignores the stds": (lambda d_k, std_q, std_k: math.sqrt(d_k), "ignores std_q and std_k"),
    "grows as d_k": (lambda d_k, std_q, std_k: d_k * std_q * std_k, "grows in proportion to d_k"),
    "squared stds": (lambda d_k, std_q, std_k: math.sqrt(d_k) * std_q**2 * std_k**2, "σ_q² σ_k²"),
    "added variances": (lambda d_k, std_q, std_k: math.sqrt(d_k * (std_q**2 + std_k**2)), "variances multiply"),
    "measured, not predicted": (measure, "your answer calls torch.randn, which this exercise forbids"),
    "measured with a generator of its own": (
        lambda d_k, std_q, std_k: measure_with(torch.Generator().manual_seed(0), d_k, std_q, std_k),
        "must not draw random numbers"),
    "measured where the watch does not look": (measure_unwatched, "it measures instead of predicting"),
    "measured with a NumPy generator of its own": (measure_seeded_unwatched, "a prediction is exact"),
    "a list": (lambda d_k, std_q, std_k: [1.0], "should be a number"),
    "a vector": (lambda d_k, std_q, std_k: torch.ones(3), "a tensor of shape [3]"),
    "untouched": (lambda d_k, std_q, std_k: ..., "returns nothing yet"),
    "crashes": (lambda d_k, std_q, std_k: d_k / 0, "raised ZeroDivisionError"),
    "off in some other way": (lambda d_k, std_q, std_k: math.sqrt(d_k + 4) * std_q * std_k,
                              "but the standard deviation of q·k is"),
}


@pytest.mark.parametrize("mistake", list(PREDICTIONS))
def test_each_wrong_prediction_is_named(mistake):
    fn, phrase = PREDICTIONS[mistake]
    with pytest.raises(CheckFailed) as raised:
        check_score_std_prediction(fn)
    assert phrase in str(raised.value)


def test_a_prediction_that_draws_random_numbers_leaves_the_generator_as_it_was():
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    with pytest.raises(CheckFailed):
        check_score_std_prediction(measure)
    assert torch.equal(before, torch.random.get_rng_state())


def test_the_cases_test_several_head_sizes_and_stds():
    assert len({d_k for d_k, _, _ in SCORE_STD_CASES}) >= 3
    assert len({std_q * std_k for _, std_q, std_k in SCORE_STD_CASES}) >= 3


def test_non_callable_is_a_type_error():
    with pytest.raises(TypeError, match="check_score_std_prediction: expected your function"):
        check_score_std_prediction(8.0)


# --- the gradient with respect to the queries -----------------------------------------------


def jacobian_gradient(q, k, upstream):
    """Another right answer: build each row's Jacobian diag(a) - a aᵀ explicitly."""
    d_k = q.shape[-1]
    a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1)          # [..., N_q, N_k]
    jacobian = torch.diag_embed(a) - a.unsqueeze(-1) * a.unsqueeze(-2)           # [..., N_q, N_k, N_k]
    through = (jacobian @ upstream.unsqueeze(-1)).squeeze(-1)
    return through @ k / math.sqrt(d_k)


def test_right_gradients_pass():
    assert check_query_gradient(jacobian_gradient) is True
    assert check_query_gradient(lambda q, k, g: (jacobian_gradient(q, k, g), "extra")) is True


def student_gradient(factor=lambda d_k: 1 / math.sqrt(d_k), through="right"):
    def gradient(q, k, upstream):
        d_k = q.shape[-1]
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1)
        if through == "right":
            g = a * (upstream - (a * upstream).sum(-1, keepdim=True))
        elif through == "diagonal":
            g = a * upstream
        else:
            g = a * (upstream - (a * upstream).sum(-2, keepdim=True))
        return g @ k * factor(d_k)

    return gradient


def autograd_switched_on(q, k, upstream):
    with torch.enable_grad():
        q = q.clone().requires_grad_()
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        (grad,) = torch.autograd.grad(a, q, upstream)
    return grad


GRADIENTS = {
    "no 1/√d_k on the way back": (student_gradient(factor=lambda d_k: 1.0), "times too large"),
    "1/√d_k twice": (student_gradient(factor=lambda d_k: 1 / d_k), "times too small"),
    "only the Jacobian's diagonal": (student_gradient(through="diagonal"), "only the diagonal"),
    "sum over the queries": (student_gradient(through="queries"), "runs over the queries"),
    "diagonal and no scale": (student_gradient(factor=lambda d_k: 1.0, through="diagonal"), "Two mistakes"),
    "gradient for k": (lambda q, k, g: torch.softmax(q @ k.mT, -1).mT @ q, "shape of k"),
    "uses autograd": (lambda q, k, g: torch.autograd.grad(torch.softmax(q @ k.mT, -1).sum(), q)[0],
                      "calls torch.autograd.grad, which this exercise forbids"),
    "switches autograd back on": (autograd_switched_on, "which this exercise forbids: the exercise is to derive"),
    "hard-coded √16": (lambda q, k, g: student_gradient()(q, k, g) * math.sqrt(q.shape[-1]) / 4, "differs"),
}


@pytest.mark.parametrize("mistake", list(GRADIENTS))
def test_each_gradient_mistake_is_named(mistake):
    fn, phrase = GRADIENTS[mistake]
    with pytest.raises(CheckFailed) as raised:
        check_query_gradient(fn)
    assert phrase in str(raised.value)


def test_autograd_inside_the_students_function_does_not_help():
    """The check switches autograd off and forbids it: an answer that only calls autograd is told so."""
    def only_autograd(q, k, upstream):
        weights = torch.softmax(q.requires_grad_() @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        return torch.autograd.grad((weights * upstream).sum(), q)[0]

    with pytest.raises(CheckFailed, match="calls Tensor.requires_grad_, which this exercise forbids"):
        check_query_gradient(only_autograd)
    assert torch.is_grad_enabled()
