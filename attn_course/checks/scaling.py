"""Check chapter 02's √d_k exercises: predicting the size of a score, and the gradient that flows back
through ``softmax(q kᵀ / √d_k)`` to the queries."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_answer, call_student, diagnose, name_mistake, watched
from attn_course.checks.forbidden import AUTOGRAD, RANDOM, Forbidden

__all__ = ["check_score_std_prediction", "check_query_gradient", "SCORE_STD_CASES"]

# (d_k, std_q, std_k): head sizes from tiny to large, entries that are not all of size 1.
SCORE_STD_CASES = ((4, 1.0, 1.0), (16, 0.5, 3.0), (100, 0.2, 0.2), (256, 1 / math.sqrt(3), 2.0))

RANDOM_PREDICTION = ("Your function draws random numbers: it measures instead of predicting. Return a "
                     "formula in d_k, std_q and std_k, with no random numbers.")
NOT_A_NUMBER = ("Your prediction should be a number (a float, or a tensor with one element), but for "
                "d_k = {d_k} it is {what}.")
CONSTANT = ("Your prediction is {value:.4g} whatever d_k, std_q and std_k are. The score q·k is a sum of "
            "d_k products q_i k_i: how does the spread of a sum of d_k independent terms grow with d_k, "
            "and how big is one product?")
PREDICTED_VARIANCE = ("You predicted the variance of q·k (d_k σ_q² σ_k²); the exercise asks for its standard "
                      "deviation, the square root of the variance.")
IGNORES_STDS = ("Your prediction is right for entries of standard deviation 1 but ignores std_q and std_k: "
                "a product q_i k_i of independent zero-mean numbers has variance σ_q² σ_k².")
GROWS_AS_D_K = ("Your prediction grows in proportion to d_k; the variance of a sum of d_k independent terms "
                "grows as d_k, so its standard deviation grows as √d_k.")
SQUARED_STDS = ("You multiplied √d_k by σ_q² σ_k², the variance of one product q_i k_i; the standard deviation "
                "of the product is the square root of that, σ_q σ_k.")
ADDED_VARIANCES = ("You added the variances of q_i and k_i; for a product of independent zero-mean numbers the "
                   "variances multiply: Var(q_i k_i) = σ_q² σ_k².")
OFF = ("Your prediction for d_k = {d_k}, std_q = {std_q:.3g}, std_k = {std_k:.3g} is {got:.6g}, but the "
       "standard deviation of q·k is {exact:.6g} (measured over 20 000 random pairs: {measured:.4g}; a "
       "measurement is good to about 1 %, a prediction is exact). Hint: write q·k as a sum of d_k independent "
       "products q_i k_i, and find the mean and the variance of one product.")


def _as_number(where: str, value: object, d_k: int) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool:
        return float(value.item())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):   # int, float, numpy scalars
        return float(value)
    what = (f"a tensor of shape {list(value.shape)}" if isinstance(value, torch.Tensor)
            else f"a {type(value).__name__}")
    raise CheckFailed(NOT_A_NUMBER.format(d_k=d_k, what=what))


def _measured_score_std(d_k: int, std_q: float, std_k: float, *, n_pairs: int = 20_000, seed: int = 0) -> float:
    """The standard deviation of ``q·k`` over ``n_pairs`` random pairs with N(0, σ²) entries (float64), drawn in
    chunks of at most a million numbers."""
    generator = torch.Generator().manual_seed(seed)
    chunk = max(1, 1_000_000 // d_k)
    dots = []
    for start in range(0, n_pairs, chunk):
        rows = min(chunk, n_pairs - start)
        q = torch.randn(rows, d_k, generator=generator, dtype=torch.float64) * std_q
        k = torch.randn(rows, d_k, generator=generator, dtype=torch.float64) * std_k
        dots.append((q * k).sum(dim=-1))
    return torch.cat(dots).std().item()


#: What chapter 02's prediction may not do: measure instead of predicting.
PREDICTION_RULES = (Forbidden(RANDOM, "a prediction follows from d_k, std_q and std_k alone: it must not draw "
                                      "random numbers (that would be measuring, not predicting)"),)
#: What chapter 02's backward pass by hand may not call.
GRADIENT_RULES = (Forbidden(AUTOGRAD, "the exercise is to derive the gradient by hand, without autograd"),)


def check_score_std_prediction(predict_fn: Callable, *, cases=SCORE_STD_CASES, seed: int = 0,
                               rtol: float = 1e-5) -> bool:
    """Check ``fn(d_k, std_q, std_k)``: the predicted standard deviation of ``q·k`` for independent zero-mean
    entries of standard deviations ``std_q`` and ``std_k``.

    For each of ``cases`` the prediction (a float or a one-element tensor) is compared, to ``rtol``, with the
    exact standard deviation (a measurement, good to about 1 %, is shown when it is off; ``seed`` seeds it).
    The answer may not draw random numbers: they are watched, and each case is asked twice, with PyTorch's
    generator in another state each time.

    Raises:
        CheckFailed: naming a constant, the variance instead of the standard deviation, stds
            ignored, squared or added, growth as d_k, random numbers, or the first case off.

    Example (a wrong answer, and what it is told):
        >>> check_score_std_prediction(lambda d_k, std_q, std_k: d_k * std_q**2 * std_k**2)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You predicted the variance of q·k (d_k σ_q² σ_k²); the exercise ...
    """
    where = "check_score_std_prediction"
    predictions = []
    state = torch.random.get_rng_state()
    try:
        for d_k, std_q, std_k in cases:
            answers = []
            for draw in (1, 2):
                # Here, a different state of PyTorch's generator for each call; in the grader's sandbox the
                # sandbox's own generator moves on between the calls. Either way a draw the watch does not
                # see (through torch.ops.aten) gives two different answers. A generator the answer seeds
                # itself gives the same answer twice: the exactness below refuses that measurement.
                torch.default_generator.manual_seed(seed * 2 + draw)     # the CPU generator, restored below
                value = call_answer(where, predict_fn, d_k, std_q, std_k, forbidden=PREDICTION_RULES,
                                    described=f"predicted_score_std({d_k}, {std_q:.3g}, {std_k:.3g})")
                answers.append(_as_number(where, value, d_k))
            if answers[0] != answers[1] and not all(math.isnan(a) for a in answers):
                raise CheckFailed(RANDOM_PREDICTION)
            predictions.append(answers[0])
    finally:
        torch.random.set_rng_state(state)                    # the caller's generator, as it was
    exact = [math.sqrt(d_k) * std_q * std_k for d_k, std_q, std_k in cases]
    right = [abs(got - want) <= rtol * want for got, want in zip(predictions, exact)]
    if all(right):
        return True
    got = torch.tensor(predictions, dtype=torch.float64)
    d_k, std_q, std_k = (torch.tensor(column, dtype=torch.float64) for column in zip(*cases))
    mistakes = [
        (PREDICTED_VARIANCE, d_k * std_q**2 * std_k**2),
        (IGNORES_STDS, d_k.sqrt()),
        (GROWS_AS_D_K, d_k * std_q * std_k),
        (GROWS_AS_D_K, d_k),
        (SQUARED_STDS, d_k.sqrt() * std_q**2 * std_k**2),
        (ADDED_VARIANCES, (d_k * (std_q**2 + std_k**2)).sqrt()),
        (ADDED_VARIANCES, d_k.sqrt() * (std_q + std_k)),
    ]
    name_mistake(got, mistakes, lambda got, wrong: torch.allclose(got, wrong, rtol=1e-3))
    if torch.allclose(got, got[:1].expand_as(got)):
        raise CheckFailed(CONSTANT.format(value=predictions[0]))
    index = right.index(False)
    case = cases[index]
    raise CheckFailed(OFF.format(d_k=case[0], std_q=case[1], std_k=case[2], got=predictions[index],
                                 exact=exact[index], measured=_measured_score_std(*case, seed=seed + index)))


NO_SCALE_ON_THE_WAY_BACK = ("Your gradient is √d_k = {sqrt_d_k:g} times too large: the forward pass divides "
                            "the scores by √d_k, so the chain rule multiplies ∂L/∂scores by 1/√d_k on the way "
                            "back to q.")
SCALED_TWICE = ("Your gradient is √d_k = {sqrt_d_k:g} times too small: you divided by √d_k twice (or by d_k). "
                "The division happens once in the forward pass, so once on the way back.")
DIAGONAL_ONLY = ("You used only the diagonal of the softmax Jacobian, as if a_i depended on s_i alone (a ⊙ g). "
                 "Each weight also depends on every other score of its row through the normalisation: "
                 "J = diag(a) - a aᵀ, so J·g subtracts a term from each row.")
SIGMOID_DERIVATIVE = ("You multiplied g by a(1 - a), each weight's derivative with respect to its own score, as "
                      "for a sigmoid: that is only the diagonal of the softmax Jacobian. Each weight also "
                      "depends on every other score of its row: ∂a_i/∂s_j = a_i(δ_ij - a_j), so J·g = "
                      "a ⊙ (g - Σ_j a_j g_j), one sum per row.")
SUM_OVER_QUERIES = ("In the term that J = diag(a) - a aᵀ subtracts, your sum runs over the queries (dim=-2). "
                    "Each row (one query) has its own softmax: sum a ⊙ g over that row's keys, dim=-1.")
GRADIENT_FOR_K = ("Your result has the shape of k. The gradient with respect to q is ∂L/∂scores (one row per "
                  "query) times k, not its transpose times q.")


def _reference_gradient(q: torch.Tensor, k: torch.Tensor, upstream: torch.Tensor) -> torch.Tensor:
    """∂L/∂q for L = Σ softmax(q kᵀ/√d_k) ⊙ upstream, by autograd, in float64."""
    q = q.detach().double().requires_grad_()
    with torch.enable_grad():
        weights = torch.softmax(q @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        (gradient,) = torch.autograd.grad((weights * upstream.double()).sum(), q)
    return gradient.to(k.dtype)


def _gradient_mistakes(q, k, upstream) -> list[tuple[str, torch.Tensor]]:
    sqrt_d_k = math.sqrt(q.shape[-1])
    weights = torch.softmax(q @ k.transpose(-2, -1) / sqrt_d_k, dim=-1)          # [..., N_q, N_k]
    right = weights * (upstream - (weights * upstream).sum(-1, keepdim=True))
    facts = {"sqrt_d_k": sqrt_d_k}
    found = []
    for through, message in ((right, None), (weights * upstream, DIAGONAL_ONLY),
                             (weights * (1 - weights) * upstream, SIGMOID_DERIVATIVE),
                             (weights * (upstream - (weights * upstream).sum(-2, keepdim=True)), SUM_OVER_QUERIES)):
        for factor, scale_message in ((1 / sqrt_d_k, None), (1.0, NO_SCALE_ON_THE_WAY_BACK),
                                      (1 / sqrt_d_k**2, SCALED_TWICE)):
            hints = [hint.format(**facts) for hint in (message, scale_message) if hint]
            if hints:
                text = hints[0] if len(hints) == 1 else "Two mistakes remain. " + " And: ".join(hints)
                found.append((text, through * factor @ k))
    found.sort(key=lambda item: item[0].count(" And: "))
    return found


def check_query_gradient(gradient_fn: Callable) -> bool:
    """Check ``fn(q [..., N_q, d_k], k [..., N_k, d_k], upstream [..., N_q, N_k]) -> [..., N_q, d_k]``: ∂L/∂q for
    ``L = Σ softmax(q kᵀ/√d_k) ⊙ upstream``, against autograd. Called with autograd off, on ``[2, 3, 5, 16]``
    queries and ``[2, 3, 7, 16]`` keys, then on plain ``[4, 9]`` and ``[6, 9]`` matrices.

    Raises:
        CheckFailed: naming a missing or doubled ``1/√d_k``, a Jacobian reduced to its diagonal,
            a sum over the wrong dimension, the shape of ``k``, or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> def gradient(q, k, upstream):
        ...     a = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
        ...     return a * (1 - a) * upstream @ k / q.shape[-1] ** 0.5
        >>> check_query_gradient(gradient)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You multiplied g by a(1 - a), each weight's derivative with ...
    """
    where = "check_query_gradient"
    gradient_fn = watched(where, gradient_fn, GRADIENT_RULES)
    for batch, n_q, n_k, d_k in (((2, 3), 5, 7, 16), ((), 4, 6, 9)):
        q, k = torch.randn(*batch, n_q, d_k) * 2, torch.randn(*batch, n_k, d_k) * 2
        upstream = torch.randn(*batch, n_q, n_k)
        expected = _reference_gradient(q, k, upstream)
        with torch.no_grad():
            got = call_student(where, gradient_fn, q, k, upstream)
        if got.shape == k.shape and k.shape != q.shape:
            raise CheckFailed(GRADIENT_FOR_K)
        diagnose(got, expected, _gradient_mistakes(q, k, upstream), ("batch", "head", "query", "feature"),
                 "Your gradient")
    return True
