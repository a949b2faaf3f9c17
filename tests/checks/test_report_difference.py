"""checks.report_difference: the one sentence every chapter uses to compare with a reference."""

from __future__ import annotations

import math
import re

import pytest
import torch

from attn_course.checks import report_difference

ROUNDOFF = re.compile(r"(?<=max difference )[-+0-9.e]+(?=,)")   # the rule in tests/course/nbval_sanitize.cfg


def test_reports_the_largest_absolute_difference_and_the_verdict(capsys):
    got = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    report_difference("ours vs reference", got, got + torch.tensor([[0.0, 3e-6], [-8e-6, 0.0]], dtype=torch.float64))
    report_difference("too far", got, got + 2e-5)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "ours vs reference: max difference 8.0e-06, within the tolerance 1e-05"
    assert lines[1] == "too far: max difference 2.0e-05, above the tolerance 1e-05"


def test_half_precision_is_judged_by_its_own_error_in_float64(capsys):
    exact = torch.tensor([1 / 3], dtype=torch.float64)
    report_difference("float16", exact.half(), exact, tol=1e-3)
    value = float(ROUNDOFF.search(capsys.readouterr().out).group())
    assert value == pytest.approx(abs(float(exact.half().double()) - 1 / 3), rel=0.05)


def test_nan_is_never_within_tolerance(capsys):
    report_difference("broken", torch.tensor([1.0, math.nan]), torch.ones(2), tol=1e9)
    assert capsys.readouterr().out == "broken: max difference nan, above the tolerance 1e+09\n"


def test_the_sanitiser_blanks_exactly_the_number(capsys):
    report_difference("x", torch.ones(3), torch.ones(3) + 1e-7)
    line = capsys.readouterr().out
    assert ROUNDOFF.sub("ROUNDOFF", line) == "x: max difference ROUNDOFF, within the tolerance 1e-05\n"


@pytest.mark.parametrize(
    "args, kwargs, error, fragment",
    [
        ((1, torch.ones(2), torch.ones(2)), {}, TypeError, "report_difference: name must be a str"),
        (("x", [1.0], torch.ones(1)), {}, TypeError, "report_difference: got must be a torch.Tensor"),
        (("x", torch.ones(2), torch.ones(1)), {}, ValueError, r"got \[2\] and expected \[1\] must have one shape"),
        (("x", torch.ones(2), torch.ones(2)), {"tol": 0}, ValueError, "tol must be a positive finite number"),
    ],
)
def test_bad_arguments_are_named(args, kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        report_difference(*args, **kwargs)
