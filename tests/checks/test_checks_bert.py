"""attn_course.checks.bert: the right MLM loss passes (written three ways); each mistake gets its message."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn_course.checks.bert import (
    ALL_POSITIONS,
    DIVIDED_BY_ALL,
    FLAT_INDEX,
    LINEAR,
    MAX_OVER_QUERIES,
    MEAN_OF_MEANS,
    NO_LOG_SOFTMAX,
    NO_SELF,
    ONE_HEAD_PER_LAYER,
    ONE_LAYER,
    ONE_QUERY,
    ROW_NOT_COLUMN,
    SPECIALS_TWICE,
    SUMMED,
    WRONG_UNFLATTEN,
    check_attention_weight_count,
    check_head_most_on,
    check_masked_mean,
    check_mlm_loss,
)
from attn_course.checks.diagnosis import CheckFailed

from support.planted.planted_07 import PLANTED


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
    checks = {"fixed_mlm_loss": check_mlm_loss, "predicted_weight_count": check_attention_weight_count,
              "head_most_on": check_head_most_on, "masked_mean": check_masked_mean}
    tried = 0
    for functions in PLANTED.values():
        for name, (code, _, hint) in functions.items():
            assert name in checks, name
            namespace = {"torch": torch, "F": F}
            exec(code, namespace)
            with pytest.raises(CheckFailed) as failed:
                checks[name](namespace[name])
            assert hint in str(failed.value)
            tried += 1
    assert tried == sum(len(functions) for functions in PLANTED.values())


# --- exercise 2: the attention-weight count --------------------------------------------------------

@pytest.mark.parametrize("right", [lambda n: 6 * 12 * n**2, lambda n: float(72 * n * n),
                                   lambda n: torch.tensor(72 * n * n)])
def test_right_counts_pass(right):
    assert check_attention_weight_count(right) is True


@pytest.mark.parametrize("wrong, message", [
    (lambda n: 12 * n**2, ONE_LAYER),
    (lambda n: 6 * n**2, ONE_HEAD_PER_LAYER),
    (lambda n: 72 * n, LINEAR),
    (lambda n: 72 * (n + 2) ** 2, SPECIALS_TWICE),
    (lambda n: 72 * n * (n - 1), NO_SELF),
], ids=["one-layer", "one-head", "linear", "specials", "no-self"])
def test_each_counting_mistake_is_named(wrong, message):
    with pytest.raises(CheckFailed) as failed:
        check_attention_weight_count(wrong)
    assert str(failed.value) == message


def test_other_counts_say_what_was_expected():
    with pytest.raises(CheckFailed, match="the model computes 7200"):
        check_attention_weight_count(lambda n: 7000)
    with pytest.raises(CheckFailed, match="should be a number"):
        check_attention_weight_count(lambda n: "7200")
    with pytest.raises(CheckFailed, match="nothing yet"):
        check_attention_weight_count(lambda n: ...)


# --- exercise 4: the head that gives a key the most attention ---------------------------------------

def by_mean(attentions, key):
    on_key = torch.stack([a[0, :, :, key].mean(-1) for a in attentions])         # [L, H]
    return divmod(int(on_key.argmax()), on_key.shape[1])


def by_loops(attentions, key):
    best = max((a[0, h, :, key].sum().item(), layer, h) for layer, a in enumerate(attentions)
               for h in range(a.shape[1]))
    return torch.tensor(best[1:])


@pytest.mark.parametrize("right", [by_mean, by_loops])
def test_right_heads_pass(right):
    assert check_head_most_on(right) is True


def flat(on_key):
    return int(on_key.argmax())


@pytest.mark.parametrize("wrong, message", [
    (lambda att, key: divmod(flat(torch.stack([a[0, :, :, key].amax(-1) for a in att])), 4), MAX_OVER_QUERIES),
    (lambda att, key: divmod(flat(torch.stack([a[0, :, 0, key] for a in att])), 4), ONE_QUERY),
    (lambda att, key: divmod(flat(torch.stack([a[0, :, key].mean(-1) for a in att])), 4), ROW_NOT_COLUMN),
    (lambda att, key: divmod(flat(torch.stack([a[0, :, :, key].mean(-1) for a in att])), len(att)), WRONG_UNFLATTEN),
    (lambda att, key: flat(torch.stack([a[0, :, :, key].mean(-1) for a in att])), FLAT_INDEX),
], ids=["max", "first-query", "row", "unflatten", "flat"])
def test_each_head_mistake_is_named(wrong, message):
    with pytest.raises(CheckFailed) as failed:
        check_head_most_on(wrong)
    assert str(failed.value) == message


def test_another_head_says_which_was_expected():
    with pytest.raises(CheckFailed, match=r"is \(2, 1\)"):
        check_head_most_on(lambda att, key: (0, 0))
    with pytest.raises(CheckFailed, match="two integers"):
        check_head_most_on(lambda att, key: ("a", "b"))
