"""attn_course.checks.bert: the right MLM loss passes (written three ways); each mistake gets its message."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from planted_07 import PLANTED

from attn_course.checks.bert import (
    ALL_POSITIONS,
    DIVIDED_BY_ALL,
    MEAN_OF_MEANS,
    NO_LOG_SOFTMAX,
    SUMMED,
    check_mlm_loss,
)
from attn_course.checks.diagnosis import CheckFailed


def by_ignore_index(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def by_selection(logits, labels):
    chosen = labels != -100
    return F.cross_entropy(logits[chosen], labels[chosen])


def by_hand(logits, labels):
    chosen = labels != -100
    log_p = logits.log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]    # [B, N]
    return -(log_p * chosen).sum() / chosen.sum()


@pytest.mark.parametrize("solution", [by_ignore_index, by_selection, by_hand, lambda lo, la: by_hand(lo, la).item()])
def test_right_losses_pass(solution):
    assert check_mlm_loss(solution) is True


def per_position(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none").view(labels.shape)


MISTAKES = [
    (lambda lo, la: per_position(lo, la).mean(), ALL_POSITIONS),
    (lambda lo, la: (per_position(lo, la) * (la != -100)).sum() / la.numel(), DIVIDED_BY_ALL),
    (lambda lo, la: F.cross_entropy(lo.flatten(0, 1), la.flatten(), reduction="sum"), SUMMED),
    (lambda lo, la: torch.stack([by_selection(lo[b:b + 1], la[b:b + 1]) for b in range(len(la))]).mean(),
     MEAN_OF_MEANS),
    (lambda lo, la: -lo.gather(-1, la.clamp(min=0)[..., None])[..., 0][la != -100].mean(), NO_LOG_SOFTMAX),
]


@pytest.mark.parametrize("wrong, message", MISTAKES, ids=["all", "denominator", "sum", "mean-of-means", "raw"])
def test_each_mistake_is_named(wrong, message):
    with pytest.raises(CheckFailed) as failed:
        check_mlm_loss(wrong)
    assert str(failed.value) == message


def test_other_answers_say_what_was_expected_crashes_and_shapes_are_explained():
    with pytest.raises(CheckFailed, match="where the mean cross-entropy"):
        check_mlm_loss(lambda lo, la: by_selection(lo, la) + 0.5)
    with pytest.raises(CheckFailed, match="raised IndexError"):
        check_mlm_loss(lambda lo, la: F.cross_entropy(lo.flatten(0, 1), la.flatten(), ignore_index=0))
    with pytest.raises(CheckFailed, match="one number"):
        check_mlm_loss(lambda lo, la: per_position(lo, la))
    with pytest.raises(CheckFailed, match="nothing yet"):
        check_mlm_loss(lambda lo, la: ...)
    with pytest.raises(CheckFailed, match="scalar tensor"):
        check_mlm_loss(lambda lo, la: "1.0")


def test_planted_mistakes_of_chapter_07_get_their_hint():
    from attn_course.checks import check_close  # noqa: F401  (what the notebook imports)

    for functions in PLANTED.values():
        for name, (code, question, hint) in functions.items():
            if question != "q3_find_the_bug_mlm_loss":
                continue
            namespace = {"torch": torch, "F": F}
            exec(code, namespace)
            with pytest.raises(CheckFailed) as failed:
                check_mlm_loss(namespace[name])
            assert hint in str(failed.value)
