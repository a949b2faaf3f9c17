"""Chapter 11's exercise checks: the solutions pass, each known mistake gets its own hint, the course's own
scores (and, for the prediction, any measurement) are refused by name, and the references agree with scores
written as loops and with an independent float64 forward pass."""

from __future__ import annotations

import pytest
import torch

from attn_course.checks import CheckFailed
from attn_course.checks.circuits import (
    check_fixed_induction_scores,
    check_induction_score,
    check_previous_token_detector,
    stripe_mean,
)
from attn_course.checks.circuits_ablation import check_ablation_prediction


def hint(check, fn) -> str:
    with pytest.raises(CheckFailed) as failed:
        check(fn)
    return str(failed.value)


def loop_score(pattern: torch.Tensor, back: int, start: int, *, transposed: bool = False,
               divisor: int | None = None) -> torch.Tensor:
    """Σ over queries i ≥ start of pattern[..., i, i − back], one Python step at a time (float64)."""
    n = pattern.shape[-1]
    total = torch.zeros(pattern.shape[:-2], dtype=torch.float64)
    for i in range(start, n):
        total += (pattern[..., i - back, i] if transposed else pattern[..., i, i - back]).double()
    return total / (n - start if divisor is None else divisor)


# The solutions, written as loops over query positions (not as the checks' references).
def induction(pattern, period):
    return loop_score(pattern, period - 1, period)


def previous_token(pattern):
    return loop_score(pattern, 1, 1)


def fixed(patterns, period):
    return loop_score(patterns, period - 1, period).mean(dim=1)


# --- the reference --------------------------------------------------------------------------------

@pytest.mark.parametrize("back, start", [(0, 0), (1, 1), (2, 5), (4, 5), (5, 5)])
@pytest.mark.parametrize("transposed", [False, True])
def test_stripe_mean_equals_a_loop_over_the_queries(back, start, transposed):
    pattern = torch.rand(2, 3, 7, 7, generator=torch.Generator().manual_seed(back + 10 * start))
    assert torch.allclose(stripe_mean(pattern, back, start, transposed=transposed),
                          loop_score(pattern, back, start, transposed=transposed), atol=1e-12)


def test_the_checks_references_agree_with_the_courses_scores():
    # The checks do not use attn_course.circuits (the answers may not), but must mean the same scores.
    from attn_course.circuits.scores import induction_score, previous_token_score

    pattern = torch.softmax(torch.randn(3, 4, 10, 10, generator=torch.Generator().manual_seed(0)), -1).double()
    for period in (1, 3, 5, 9):
        assert torch.allclose(stripe_mean(pattern, period - 1, period), induction_score(pattern, period), atol=1e-12)
    assert torch.allclose(stripe_mean(pattern, 1, 1), previous_token_score(pattern), atol=1e-12)


def test_a_perfect_induction_pattern_scores_one():
    n, period = 8, 4
    perfect = torch.zeros(n, n)
    perfect[torch.arange(period, n), torch.arange(period, n) - period + 1] = 1.0
    assert stripe_mean(perfect, period - 1, period).item() == 1.0
    assert stripe_mean(perfect, period, period).item() == 0.0            # the off-by-one sees none of it


def test_stripe_mean_refuses_a_pattern_that_is_not_square_and_a_stripe_outside_it():
    with pytest.raises(ValueError, match=r"\[\.\.\., N, N\]"):
        stripe_mean(torch.zeros(3, 4), 1, 1)
    with pytest.raises(ValueError, match="outside"):
        stripe_mean(torch.zeros(4, 4), 2, 1)


# --- (a) the induction score ---------------------------------------------------------------------------

def test_induction_solution_passes():
    assert check_induction_score(induction)


def test_a_float_answer_for_one_pattern_is_accepted():
    assert check_induction_score(lambda p, period: induction(p, period) if p.dim() > 2
                                 else float(induction(p, period)))


@pytest.mark.parametrize("fn, fragment", [
    (lambda p, period: loop_score(p, period, period), "the earlier copy of token i itself"),
    (lambda p, period: p.diagonal(-period, -2, -1).mean(-1), "the earlier copy of token i itself"),
    (lambda p, period: p.diagonal(1 - period, -2, -1).mean(-1), "includes i = period − 1"),
    (lambda p, period: loop_score(p, period - 2, period) if period >= 2 else induction(p, period),
     "one past the right key"),
    (lambda p, period: loop_score(p, period + 1, period + 1), "one further back"),
    (lambda p, period: induction(p.transpose(-2, -1), period), "transposed"),
    (lambda p, period: loop_score(p, period - 1, period, divisor=1), "the sum of the right entries"),
    (lambda p, period: loop_score(p, period - 1, period, divisor=p.shape[-1]), "You divided by N"),
    (lambda p, period: induction(p, p.shape[-1] // 2), "not half the length"),
    (lambda p, period: induction(p, period).mean(), "one number for the whole tensor"),
    (lambda p, period: p.diagonal(1 - period, -2, -1), "one entry per query position"),
    (lambda p, period: torch.zeros(p.shape[:-2]), "differs from the reference"),
    (lambda p, period: ..., "returns nothing yet"),
    (lambda p, period: "high", "a tensor of scores"),
])
def test_each_induction_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_induction_score, fn)


def test_the_courses_induction_score_is_refused_by_name():
    from attn_course.circuits.scores import induction_score

    assert "calls induction_score, which this exercise forbids" in hint(check_induction_score, induction_score)


# --- (c) the previous-token detector ---------------------------------------------------------------------

def test_previous_token_solution_passes():
    assert check_previous_token_detector(previous_token)


@pytest.mark.parametrize("fn, fragment", [
    (lambda p: p.diagonal(0, -2, -1).mean(-1), "the diagonal"),
    (lambda p: loop_score(p, 0, 1), "the diagonal"),
    (lambda p: p.diagonal(1, -2, -1).mean(-1), "pattern[..., i − 1, i]"),
    (lambda p: previous_token(p.transpose(-2, -1)), "pattern[..., i − 1, i]"),
    (lambda p: (p * torch.eye(p.shape[-1], dtype=p.dtype).roll(-1, dims=1)).sum(-1).mean(-1), "wrapped around"),
    (lambda p: loop_score(p, 2, 2), "two tokens back"),
    (lambda p: loop_score(p, 1, 1, divisor=1), "the sum of the right entries"),
    (lambda p: loop_score(p, 1, 1, divisor=p.shape[-1]), "You divided by N"),
    (lambda p: previous_token(p).mean(), "one number for the whole tensor"),
    (lambda p: p.diagonal(-1, -2, -1), "one entry per query position"),
    (lambda p: p.diagonal(-1).mean(-1), "diagonal runs over the wrong dimensions"),
])
def test_each_previous_token_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_previous_token_detector, fn)


def test_the_courses_previous_token_score_is_refused_by_name():
    from attn_course.circuits.scores import previous_token_score

    message = hint(check_previous_token_detector, lambda p: previous_token_score(p))
    assert "calls previous_token_score, which this exercise forbids" in message


# --- (d) the classmate's scores, fixed --------------------------------------------------------------------

def test_fixed_solution_passes():
    assert check_fixed_induction_scores(fixed)


@pytest.mark.parametrize("fn, fragment", [
    (lambda ps, period: ps.diagonal(-period, -2, -1).mean(dim=(1, -1)), "the classmate's scores, unchanged"),
    (lambda ps, period: ps.diagonal(1 - period, -2, -1).mean(dim=(1, -1)), "includes i = period − 1"),
    (lambda ps, period: ps.diagonal(-period - 1, -2, -1).mean(dim=(1, -1)), "one further back"),
    (lambda ps, period: ps.diagonal(2 - period, -2, -1)[..., 2:].mean(dim=(1, -1)), "one past the right key"),
    (lambda ps, period: fixed(ps.transpose(-2, -1), period), "transposed"),
    (lambda ps, period: loop_score(ps, period - 1, period, divisor=ps.shape[-1]).mean(dim=1), "You divided by N"),
    (lambda ps, period: loop_score(ps, period - 1, period, divisor=1).mean(dim=1), "the sum of the right entries"),
    (lambda ps, period: fixed(ps, ps.shape[-1] // 2), "not half the length"),
    (lambda ps, period: loop_score(ps, period - 1, period).mean(dim=2), "you averaged over the heads"),
    (lambda ps, period: loop_score(ps, period - 1, period), "average over the batch too"),
])
def test_each_fixing_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_fixed_induction_scores, fn)


def test_the_courses_score_is_refused_in_the_fix_too():
    from attn_course.circuits.scores import induction_score

    message = hint(check_fixed_induction_scores, lambda ps, period: induction_score(ps, period).mean(dim=1))
    assert "calls induction_score, which this exercise forbids" in message


# --- what every check shares -------------------------------------------------------------------------------

@pytest.mark.parametrize("check", [check_induction_score, check_previous_token_detector, check_fixed_induction_scores])
def test_a_check_refuses_what_is_not_a_function(check):
    with pytest.raises(TypeError, match="expected your function"):
        check(torch.zeros(3))


def test_the_checks_leave_the_callers_random_state_as_it_was():
    state = torch.random.get_rng_state()
    check_induction_score(induction)
    check_previous_token_detector(previous_token)
    check_fixed_induction_scores(fixed)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_an_answer_that_changes_its_input_in_place_cannot_change_the_reference():
    def zeroes_then_scores(pattern, period):
        score = induction(pattern, period)
        pattern.zero_()
        return score

    assert check_induction_score(zeroes_then_scores)


# --- (b) which head's ablation hurts most --------------------------------------------------------------------

def strongest_route_head(previous_token_scores, duplicate_token_scores, induction_scores):
    # The layer-0 head whose pattern layer 1 reads: previous-token (seed 0) or duplicate-token (seed 1).
    return 0, int(torch.maximum(previous_token_scores[0], duplicate_token_scores[0]).argmax())


@pytest.mark.parametrize("dead_head", [None, 1])
def test_ablation_effects_are_those_of_an_independent_float64_forward(dead_head):
    # The check's measurement against tests/circuits' forward pass written from the formulas, a head left out;
    # with a dead head, against that forward pass on the model with the head's weights zeroed by hand.
    from circuits.circuits_reference import reference_forward

    from attn_course.checks.circuits_ablation import ablation_effects
    from attn_course.circuits.trained import load_trained
    from attn_course.data.repeated_tokens import repeated_random_tokens

    model = load_trained(0)
    if dead_head is not None:
        attention, d = model.layers[0].attention, model.config.d_model // model.config.n_heads
        with torch.no_grad():
            for weight in (attention.q_proj.weight, attention.k_proj.weight):
                weight[dead_head * d:(dead_head + 1) * d] = 0.0
            attention.out_proj.weight[:, dead_head * d:(dead_head + 1) * d] = 0.0
    half, vocab = model.config.max_len // 2, model.config.vocab_size
    tokens = repeated_random_tokens(64, half, vocab, generator=torch.Generator().manual_seed(2024))

    def repeated_loss(zero_heads=()):
        logits = reference_forward(model, tokens, zero_heads=zero_heads)["logits"]        # [B, N, V] float64
        predicted = logits[:, half:2 * half - 1]                                           # predicts L+1 .. 2L-1
        return torch.nn.functional.cross_entropy(predicted.flatten(0, 1), tokens[:, half + 1:].flatten()).item()

    previous, duplicate, induction, rises = ablation_effects(0, dead_head)
    patterns = reference_forward(model, tokens)["patterns"]
    by_layer = [patterns[layer] for layer in range(2)]
    assert torch.allclose(previous, torch.stack([loop_score(p, 1, 1).mean(0) for p in by_layer]).float(), atol=1e-5)
    assert torch.allclose(duplicate, torch.stack([loop_score(p, half, half).mean(0) for p in by_layer]).float(),
                          atol=1e-5)
    assert torch.allclose(induction, torch.stack([loop_score(p, half - 1, half).mean(0) for p in by_layer]).float(),
                          atol=1e-5)
    intact = repeated_loss()
    for layer, head in [(0, int(previous[0].argmax())), (1, 0), (0, int(previous[0].argmin()))]:
        assert rises[layer, head].item() == pytest.approx(repeated_loss([(layer, head)]) - intact, abs=1e-4)
    if dead_head is not None:            # uniform causal attention: query i puts 1 / (i + 1) on each key
        n = 2 * half
        assert previous[0, dead_head].item() == pytest.approx(sum(1 / (i + 1) for i in range(1, n)) / (n - 1), abs=1e-5)
        assert rises[0, dead_head].item() == pytest.approx(0.0, abs=1e-6)


def test_the_layer_zero_head_that_layer_one_reads_is_the_right_prediction():
    assert check_ablation_prediction(strongest_route_head)
    assert check_ablation_prediction(strongest_route_head, seed=7)


@pytest.mark.parametrize("fn, fragment", [
    (lambda previous, duplicate, induction: (1, int(induction[1].argmax())), "You picked the head that copies best"),
    (lambda previous, duplicate, induction: (0, int(induction[0].argmax())), "raised it by"),
    # the rules that fit one model only: the "lowest induction score", one route's score
    (lambda previous, duplicate, induction: (0, int(induction[0].argmin())), "That head is the dead one"),
    (lambda previous, duplicate, induction: (0, int(previous[0].argmax())), "seed 1's model"),
    (lambda previous, duplicate, induction: (0, int(duplicate[0].argmax())), "no duplicate-token head"),
    (lambda previous, duplicate, induction: (0, int(previous[0].argmax())), "no previous-token head"),
    (lambda previous, duplicate, induction: (1, 0), "whatever the scores"),
    (lambda previous, duplicate, induction: (int(previous[0].argmax()), 0), "You return (head, layer)"),
    (lambda previous, duplicate, induction: (2, 0), "There is no layer 2"),
    (lambda previous, duplicate, induction: previous.argmax(), "two ints"),
    (lambda previous, duplicate, induction: (0.0, 3.0), "two ints"),
    (lambda previous, duplicate, induction: ..., "returns nothing yet"),
])
def test_each_prediction_mistake_gets_its_hint(fn, fragment):
    assert fragment in hint(check_ablation_prediction, fn)


def measured(previous_token_scores, duplicate_token_scores, induction_scores):
    from attn_course.circuits.trained import load_trained

    load_trained(0)
    return strongest_route_head(previous_token_scores, duplicate_token_scores, induction_scores)


@pytest.mark.parametrize("fn, fragment", [
    (lambda previous, duplicate, induction: (0, int(torch.randint(4, ()))),
     "calls torch.randint, which this exercise forbids"),
    (measured, "calls load_trained, which this exercise forbids"),
])
def test_a_prediction_that_measures_or_guesses_is_refused(fn, fragment):
    assert fragment in hint(check_ablation_prediction, fn)


def test_a_prediction_that_changes_with_the_random_state_is_caught_even_unwatched():
    answers = iter([(0, 1), (0, 2)] * 50)
    assert "two different answers" in hint(check_ablation_prediction, lambda previous, duplicate, induction:
                                           next(answers))


def test_the_check_refuses_to_pass_without_its_models():
    with pytest.raises(FileNotFoundError, match="cached models"):
        check_ablation_prediction(strongest_route_head, models=(0, 999))


def test_the_duplicate_token_score_is_refused_too():
    # duplicate_token_score(pattern, period - 1) reads the right keys (over one query too many): still the course's.
    from attn_course.circuits.scores import duplicate_token_score

    def shifted(pattern, period):
        return duplicate_token_score(pattern[..., 1:, 1:], period - 1) if period > 1 else pattern.diagonal(0, -2, -1)

    assert "calls duplicate_token_score, which this exercise forbids" in hint(check_induction_score, shifted)
