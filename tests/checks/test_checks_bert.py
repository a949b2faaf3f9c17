"""attn_course.checks.bert: right answers pass (written several ways); each mistake gets its message."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn_course.checks.bert import (
    ALL_MASKED,
    ALL_POSITIONS,
    DIVIDED_BY_ALL,
    FLAT_INDEX,
    IGNORES_GENERATOR,
    MAX_OVER_QUERIES,
    MEAN_OF_MEANS,
    NO_KEPT,
    NO_LOG_SOFTMAX,
    NOT_CHOSEN_CHANGED,
    NOT_VARIED,
    ONE_QUERY,
    ONLY_KEPT,
    RANDOM_AS_KEPT,
    ROW_NOT_COLUMN,
    SPECIALS_DRAWN,
    SUMMED,
    WRONG_SHARES,
    WRONG_UNFLATTEN,
    check_corruption,
    check_head_most_on,
    check_mlm_loss,
    check_unchanged_share,
)
from attn_course.checks.diagnosis import CheckFailed

from support.planted.planted_08 import PLANTED


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
    checks = {"fixed_mlm_loss": check_mlm_loss, "corrupt": check_corruption, "head_most_on": check_head_most_on,
              "predicted_unchanged_share": check_unchanged_share}
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


# --- exercise 1: the 80/10/10 corruption ---------------------------------------------------------

def by_fate(input_ids, chosen, mask_id, special_ids, vocab_size, seed):
    generator = torch.Generator().manual_seed(seed)
    fate = torch.rand(input_ids.shape, generator=generator)                          # [B, N]
    ordinary = torch.tensor([i for i in range(vocab_size) if i not in set(special_ids)])
    random_ids = ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)]
    corrupted = torch.where(chosen & (fate < 0.8), mask_id, input_ids)
    return torch.where(chosen & (fate >= 0.8) & (fate < 0.9), random_ids, corrupted)


def by_loop(input_ids, chosen, mask_id, special_ids, vocab_size, seed):
    """One position at a time, with Python's random module."""
    import random
    rng = random.Random(seed)
    ordinary = [i for i in range(vocab_size) if i not in special_ids]
    out = input_ids.clone()
    for b, i in chosen.nonzero().tolist():
        u = rng.random()
        if u < 0.8:
            out[b, i] = mask_id
        elif u < 0.9:
            out[b, i] = rng.choice(ordinary)
    return out


@pytest.mark.parametrize("right", [by_fate, by_loop])
def test_right_corruptions_pass(right):
    assert check_corruption(right) is True


def with_fate(mask_share, random_share, draw_from_all=False, everywhere=False, fixed_random=False):
    def corrupt(input_ids, chosen, mask_id, special_ids, vocab_size, seed):
        generator = torch.Generator().manual_seed(seed)
        chosen = torch.ones_like(chosen) if everywhere else chosen
        fate = torch.rand(input_ids.shape, generator=generator)
        ordinary = torch.tensor([i for i in range(vocab_size) if i not in set(special_ids)])
        random_ids = (torch.randint(vocab_size, input_ids.shape, generator=generator) if draw_from_all
                      else ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)])
        if fixed_random:
            random_ids = torch.full_like(input_ids, 7)
        corrupted = torch.where(chosen & (fate < mask_share), mask_id, input_ids)
        return torch.where(chosen & (fate >= mask_share) & (fate < mask_share + random_share), random_ids, corrupted)
    return corrupt


CORRUPTION_MISTAKES = [
    (with_fate(1.0, 0.0), ALL_MASKED),
    (with_fate(0.8, 0.1, everywhere=True), NOT_CHOSEN_CHANGED),
    (with_fate(0.8, 0.1, draw_from_all=True), SPECIALS_DRAWN),
    (with_fate(0.8, 0.2), WRONG_SHARES),
    (with_fate(0.1, 0.1), WRONG_SHARES),
    (with_fate(0.8, 0.1, fixed_random=True), NOT_VARIED),
    (lambda ids, chosen, mask_id, specials, size, seed: by_fate(ids, chosen, mask_id, specials, size,
                                                              int(torch.randint(1000, ()))), IGNORES_GENERATOR),
]


@pytest.mark.parametrize("wrong, message", CORRUPTION_MISTAKES,
                         ids=["all-mask", "everywhere", "specials", "no-unchanged", "10-10-80", "fixed", "no-gen"])
def test_each_corruption_mistake_is_named(wrong, message):
    with pytest.raises(CheckFailed) as failed:
        check_corruption(wrong)
    assert str(failed.value).startswith(message.split("{")[0])


def test_other_corruptions_are_explained_and_the_course_function_is_refused():
    def in_place(input_ids, chosen, mask_id, special_ids, vocab_size, seed):
        input_ids[chosen] = mask_id
        chosen.zero_()                     # on its own copies: the check's inputs stay as they were
        return input_ids
    with pytest.raises(CheckFailed, match="turns every chosen token into"):
        check_corruption(in_place)
    with pytest.raises(CheckFailed, match="integers"):
        check_corruption(lambda ids, chosen, *rest: ids.float())
    with pytest.raises(CheckFailed, match="outside 0..39"):
        check_corruption(lambda ids, chosen, *rest: ids + 100)
    with pytest.raises(CheckFailed, match="nothing yet"):
        check_corruption(lambda *args: ...)

    def shortcut(input_ids, chosen, mask_id, special_ids, vocab_size, seed):
        from attn_course.models.bert import mask_tokens
        return mask_tokens(input_ids, mask_id=mask_id, vocab_size=vocab_size, special_ids=special_ids,
                           probability=1.0, generator=torch.Generator().manual_seed(seed)).input_ids
    with pytest.raises(CheckFailed, match="calls mask_tokens, which this exercise forbids"):
        check_corruption(shortcut)


# --- exercise 2: the share of chosen tokens seen unchanged ---------------------------------------

def measured_unchanged_share(n_ordinary, positions=400_000):
    """The share measured by drawing the rule itself, float64 counts: the reference the formula must meet."""
    generator = torch.Generator().manual_seed(0)
    original = torch.randint(n_ordinary, (positions,), generator=generator)
    fate = torch.rand(positions, generator=generator, dtype=torch.float64)
    drawn = torch.randint(n_ordinary, (positions,), generator=generator)
    seen = torch.where(fate < 0.8, -1, torch.where(fate < 0.9, drawn, original))
    return (seen == original).double().mean().item()


@pytest.mark.parametrize("right", [lambda n: 0.1 + 0.1 / n, lambda n: torch.tensor(0.1 * (n + 1) / n),
                                   lambda n: (n + 1) / (10 * n)])
def test_right_shares_pass_and_meet_the_measured_share(right):
    assert check_unchanged_share(right) is True
    for n in (51, 4, 1):
        assert float(right(n)) == pytest.approx(measured_unchanged_share(n), abs=3e-3)


@pytest.mark.parametrize("wrong, message", [(lambda n: 0.1, ONLY_KEPT), (lambda n: 0.2, RANDOM_AS_KEPT),
                                            (lambda n: 0.1 / n, NO_KEPT)], ids=["kept", "all-random", "no-kept"])
def test_each_share_mistake_is_named(wrong, message):
    with pytest.raises(CheckFailed) as failed:
        check_unchanged_share(wrong)
    assert str(failed.value) == message


def test_other_shares_say_what_was_expected_and_sampling_is_refused():
    with pytest.raises(CheckFailed, match="the expected share is 0.1020"):
        check_unchanged_share(lambda n: 0.5)
    with pytest.raises(CheckFailed, match="should be a number"):
        check_unchanged_share(lambda n: "0.1")
    with pytest.raises(CheckFailed, match="which this exercise forbids"):
        check_unchanged_share(lambda n: float((torch.rand(10_000) < 0.1 + 0.1 / n).double().mean()))


# --- exercise 3: the head that gives a key the most attention ---------------------------------------

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
