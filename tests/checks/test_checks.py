"""attn_course.checks: right answers pass, each planted mistake gets its own hint."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course import checks
from attn_course.checks import CheckFailed, check_close, check_softmax

# --- correct answers, written independently of the package -----------------------------


def loop_softmax(scores):
    flat = scores.reshape(-1, scores.shape[-1]).double()
    rows = []
    for row in flat:
        shifted = [math.exp(value - max(row.tolist())) for value in row.tolist()]
        rows.append([value / sum(shifted) for value in shifted])
    return torch.tensor(rows, dtype=scores.dtype).reshape(scores.shape)


def test_correct_softmax_passes():
    assert check_softmax(loop_softmax) is True


# --- each planted mistake gets the matching hint -----------------------------------------


PLANTED = {
    "softmax over the wrong dimension": (
        lambda: check_softmax(lambda s: (e := (s - s.amax(0, keepdim=True)).exp()) / e.sum(0, keepdim=True)),
        "normalises over the wrong dimension",
    ),
    "unstable softmax": (
        lambda: check_softmax(lambda s: s.exp() / s.exp().sum(-1, keepdim=True)),
        "overflows",
    ),
}


@pytest.mark.parametrize("mistake", list(PLANTED))
def test_planted_mistake_gets_the_matching_hint(mistake):
    run, hint = PLANTED[mistake]
    with pytest.raises(CheckFailed) as raised:
        run()
    assert hint in str(raised.value)


def test_nan_in_the_answer_is_named():
    with pytest.raises(CheckFailed, match="NaN"):
        check_softmax(lambda s: torch.full_like(s, float("nan")))


def test_check_close_passes_and_fails_with_the_hint():
    assert check_close(torch.tensor([0.25] * 4), torch.full((4,), 0.25)) is True
    assert check_close(8.0, torch.tensor(8.1, dtype=torch.float64), rtol=0.05) is True
    with pytest.raises(CheckFailed, match=r"at \[1\]: expected 0.2500, got 0.7500.*Hint: look again"):
        check_close(torch.tensor([0.25, 0.75, 0.0, 0.0]), torch.full((4,), 0.25), hint="look again")
    with pytest.raises(CheckFailed, match="not there yet"):
        check_close(..., torch.zeros(2))


def test_checks_use_fresh_inputs_each_time():
    seen = []
    check_softmax(lambda s: seen.append(s.clone()) or loop_softmax(s))
    check_softmax(lambda s: seen.append(s.clone()) or loop_softmax(s))
    assert not torch.equal(seen[0], seen[2])


def test_non_callable_is_a_type_error():
    with pytest.raises(TypeError, match="expected your function"):
        check_softmax(torch.zeros(3))


# --- every exported check: a right answer passes, a planted mistake is named -----------------


# check: (a call with a right answer, a call with a planted mistake, what the diagnosis must say)
EXPORTED_CHECKS = {
    "check_softmax": (
        lambda check: check(loop_softmax),
        lambda check: check(lambda s: (e := (s - s.amax(0, keepdim=True)).exp()) / e.sum(0, keepdim=True)),
        "normalises over the wrong dimension",
    ),
    "check_close": (
        lambda check: check(torch.full((4,), 0.25), torch.softmax(torch.zeros(4), dim=-1)),
        lambda check: check(torch.tensor([0.4, 0.2, 0.2, 0.2]), torch.full((4,), 0.25), hint="equal scores"),
        "Hint: equal scores",
    ),
}


@pytest.mark.parametrize("name", sorted(name for name in checks.__all__ if name.startswith("check_")))
def test_every_exported_check_passes_a_right_answer_and_names_a_planted_mistake(name):
    assert name in EXPORTED_CHECKS, f"checks exports {name}: give it a right answer and a planted mistake here"
    right, wrong, diagnosis = EXPORTED_CHECKS[name]
    check = getattr(checks, name)
    assert right(check) is True
    with pytest.raises(CheckFailed) as raised:
        wrong(check)
    assert diagnosis in str(raised.value)
    # otter, and a bare test cell, see an ordinary failed assertion.
    assert isinstance(raised.value, AssertionError)
