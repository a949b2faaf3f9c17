"""attn_course.checks.softmax: a right softmax passes; each unstable one is named for what it does."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.checks.diagnosis import CheckFailed
from attn_course.checks.softmax import check_softmax, diagnose_non_finite, large_scores


def loop_softmax(scores):
    """Row by row in Python floats (float64), each row shifted by its own maximum."""
    flat = scores.reshape(-1, scores.shape[-1]).double().tolist()
    rows = []
    for row in flat:
        exps = [math.exp(value - max(row)) for value in row]
        rows.append([value / sum(exps) for value in exps])
    return torch.tensor(rows, dtype=scores.dtype).reshape(scores.shape)


def plain_exp(scores):
    exps = scores.exp()
    return exps / exps.sum(dim=-1, keepdim=True)


def global_max(scores):
    exps = (scores - scores.max()).exp()
    return exps / exps.sum(dim=-1, keepdim=True)


def row_mean(scores):
    exps = (scores - scores.mean(dim=-1, keepdim=True)).exp()
    return exps / exps.sum(dim=-1, keepdim=True)


def test_a_right_softmax_passes():
    assert check_softmax(loop_softmax) is True


@pytest.mark.parametrize("shortcut", [lambda s: torch.softmax(s, dim=-1), lambda s: s.softmax(-1),
                                      lambda s: torch.nn.functional.log_softmax(s, -1).exp()])
def test_a_softmax_that_calls_torchs_is_told_it_is_forbidden(shortcut):
    with pytest.raises(CheckFailed, match="softmax, which this exercise forbids: the exercise is to write softmax"):
        check_softmax(shortcut)


MISTAKES = {
    "wrong dimension": (lambda s: (e := (s - s.amax(dim=0, keepdim=True)).exp()) / e.sum(dim=0, keepdim=True),
                        "normalises over the wrong dimension"),
    "stable, but normalised over the batch": (
        lambda s: (e := (s - s.amax(dim=-1, keepdim=True)).exp()) / e.sum(dim=0, keepdim=True),
        "sums to 1 along dimension 0",
    ),
    "plain exp": (plain_exp, "overflows on large scores: exp("),
    "one maximum for the whole tensor": (global_max, "one maximum for the whole tensor"),
    "shifted by the row mean": (row_mean, "overflow"),
    "nan": (lambda s: torch.full_like(s, math.nan), "NaN"),
    "wrong shape": (lambda s: loop_softmax(s)[..., :-1], "has shape"),
    "a constant that sums to 1 over the batch": (lambda s: torch.full_like(s, 0.5), "it ignores its input"),
    "uniform weights": (lambda s: torch.full_like(s, 1 / s.shape[-1]), "it ignores its input"),
    "rows taken as dimension 1": (
        lambda s: (e := (s - s.amax(dim=-1, keepdim=True)).exp()) / e.sum(dim=2 if s.dim() == 3 else 1, keepdim=True),
        "It was called with a tensor of shape [7]"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_mistake_is_named(mistake):
    fn, phrase = MISTAKES[mistake]
    with pytest.raises(CheckFailed) as raised:
        check_softmax(fn)
    assert phrase in str(raised.value)


def test_a_global_maximum_is_not_called_an_overflow():
    """Subtracting one maximum cannot overflow: the rows far below it round to 0, then 0/0."""
    with pytest.raises(CheckFailed) as raised:
        check_softmax(global_max)
    message = str(raised.value)
    assert "overflow" not in message and "0/0" in message


def test_the_messages_of_the_two_unstable_softmaxes_differ():
    messages = []
    for fn in (plain_exp, global_max):
        with pytest.raises(CheckFailed) as raised:
            check_softmax(fn)
        messages.append(str(raised.value).split(":")[0])
    assert messages[0] != messages[1]


def test_large_scores_have_a_finite_softmax_and_break_both_unstable_ones():
    scores = large_scores()
    assert torch.isfinite(torch.softmax(scores, dim=-1)).all()
    assert not torch.isfinite(plain_exp(scores)).all()
    assert not torch.isfinite(global_max(scores)).all()
    # Each row sits at its own offset, so the tensor's maximum lies thousands above most rows.
    assert (scores.max() - scores.amax(dim=-1)).max() > 3000


def test_diagnose_non_finite_is_silent_on_finite_results():
    scores = large_scores()
    assert diagnose_non_finite(torch.softmax(scores, dim=-1), scores) is None


def test_diagnose_non_finite_reads_attention_outputs_row_by_row():
    scores = large_scores((2, 6, 5))
    values = torch.randn(5, 3)
    with pytest.raises(CheckFailed, match="one maximum for the whole tensor"):
        diagnose_non_finite(global_max(scores) @ values, scores)          # [2, 6, 3]: rows follow scores
    with pytest.raises(CheckFailed, match="overflows"):
        diagnose_non_finite(plain_exp(scores) @ values, scores)
