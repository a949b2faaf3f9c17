"""attn_course.checks: right answers pass, each planted mistake gets its own hint."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attn_course import checks
from attn_course.checks import (
    CheckFailed,
    check_attention,
    check_attention_weights,
    check_causal_attention,
    check_close,
    check_softmax,
    check_split_heads,
)

# --- correct answers, written independently of the package -----------------------------


def sdpa_attention(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def loop_softmax(scores):
    flat = scores.reshape(-1, scores.shape[-1]).double()
    rows = []
    for row in flat:
        shifted = [math.exp(value - max(row.tolist())) for value in row.tolist()]
        rows.append([value / sum(shifted) for value in shifted])
    return torch.tensor(rows, dtype=scores.dtype).reshape(scores.shape)


def test_correct_softmax_passes():
    assert check_softmax(loop_softmax) is True


@pytest.mark.parametrize("with_mask", [False, True])
def test_correct_attention_passes(with_mask):
    assert check_attention(sdpa_attention, with_mask=with_mask) is True


def test_correct_attention_returning_a_tuple_passes():
    assert check_attention(lambda q, k, v: (sdpa_attention(q, k, v), None)) is True


def test_correct_one_query_attention_passes():
    def attend(query, keys, values):
        return sdpa_attention(query[None], keys, values)[0]

    assert check_attention(attend, one_query=True) is True


def test_correct_weights_pass_for_batched_and_plain_inputs():
    def weights(q, k):
        return F.scaled_dot_product_attention(q, k, torch.eye(k.shape[-2]).expand(*k.shape[:-1], -1))

    assert check_attention_weights(weights) is True
    assert check_attention_weights(weights, batched=False) is True


def test_correct_causal_attention_passes():
    def causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    assert check_causal_attention(causal) is True


def test_correct_split_passes():
    def split(x, heads):
        batch, tokens, width = x.shape
        return torch.stack(x.chunk(heads, dim=-1), dim=1)  # [B, H, N, d], another route

    assert check_split_heads(split) is True


# --- each planted mistake gets the matching hint -----------------------------------------


def scores_of(q, k, scale):
    return q @ k.transpose(-2, -1) * scale


def attention_with(scale_of=lambda q: 1 / math.sqrt(q.shape[-1]), dim=-1, invert=False, after=False):
    """A student's attention with one planted mistake."""

    def attention(q, k, v, mask=None):
        scores = scores_of(q, k, scale_of(q))
        if mask is not None and not after:
            scores = scores.masked_fill(mask if invert else ~mask, float("-inf"))
        weights = torch.softmax(scores, dim=dim)
        if mask is not None and after:
            weights = weights * mask
        return weights @ v

    return attention


def unstable_attention(q, k, v):
    exponentials = torch.exp(scores_of(q, k, 1 / math.sqrt(q.shape[-1])))
    return exponentials / exponentials.sum(dim=-1, keepdim=True) @ v


def causal_with(mask_of):
    """A student's causal attention whose mask is ``mask_of(n)`` (None: no mask)."""

    def attention(q, k, v):
        scores = scores_of(q, k, 1 / math.sqrt(q.shape[-1]))
        mask = mask_of(q.shape[-2])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    return attention


PLANTED = {
    "softmax over the wrong dimension": (
        lambda: check_softmax(lambda s: (e := (s - s.amax(0, keepdim=True)).exp()) / e.sum(0, keepdim=True)),
        "normalises over the wrong dimension",
    ),
    "unstable softmax": (
        lambda: check_softmax(lambda s: s.exp() / s.exp().sum(-1, keepdim=True)),
        "overflows",
    ),
    "no scaling": (lambda: check_attention(attention_with(scale_of=lambda q: 1.0)), "forgot the scaling"),
    "scaling by d_k": (
        lambda: check_attention(attention_with(scale_of=lambda q: 1 / q.shape[-1])),
        "divided the scores by d_k",
    ),
    "scaling by d_model": (
        lambda: check_attention(attention_with(scale_of=lambda q: 1 / math.sqrt(q.shape[1] * q.shape[-1]))),
        "instead of the head dimension",
    ),
    "inverted mask": (
        lambda: check_attention(attention_with(invert=True), with_mask=True),
        "mask is inverted",
    ),
    "mask after softmax": (
        lambda: check_attention(attention_with(after=True), with_mask=True),
        "after the softmax",
    ),
    "softmax over queries in attention": (
        lambda: check_attention(attention_with(dim=-2)),
        "wrong dimension (the queries",
    ),
    "unstable softmax in attention": (lambda: check_attention(unstable_attention), "overflows"),
    "weights over the wrong dimension": (
        lambda: check_attention_weights(
            lambda q, k: torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2)
        ),
        "wrong dimension",
    ),
    "causal mask on the wrong triangle": (
        lambda: check_causal_attention(causal_with(lambda n: torch.ones(n, n, dtype=torch.bool).triu())),
        "leaks the future",
    ),
    "causal attention without a mask": (lambda: check_causal_attention(causal_with(lambda n: None)), "not causal"),
    "causal mask without the diagonal": (
        lambda: check_causal_attention(causal_with(lambda n: torch.ones(n, n, dtype=torch.bool).tril(-1))),
        "hides the diagonal",
    ),
    "heads split with a view and no transpose": (
        lambda: check_split_heads(lambda x, h: x.view(x.shape[0], h, x.shape[1], -1)),
        "scrambles tokens and heads",
    ),
    "heads split but not moved in front": (
        lambda: check_split_heads(lambda x, h: x.view(x.shape[0], x.shape[1], h, -1)),
        "did not move the head axis",
    ),
}


@pytest.mark.parametrize("mistake", list(PLANTED))
def test_planted_mistake_gets_the_matching_hint(mistake):
    run, hint = PLANTED[mistake]
    with pytest.raises(CheckFailed) as raised:
        run()
    assert hint in str(raised.value)


def test_hints_are_distinct_for_distinct_mistakes():
    messages = set()
    for run, _ in PLANTED.values():
        with pytest.raises(CheckFailed) as raised:
            run()
        messages.add(str(raised.value).split(".")[0])
    assert len(messages) >= 9


def test_unknown_mistake_points_at_the_first_differing_entry():
    def off_by_a_little(q, k, v):
        output = sdpa_attention(q, k, v).clone()
        output[1, 2, 3, 4] += 0.5
        return output

    with pytest.raises(CheckFailed, match=r"\[batch 1, head 2, query 3, feature 4\]: expected"):
        check_attention(off_by_a_little)


def test_unanswered_exercise_says_so_instead_of_crashing():
    def untouched(q, k, v): ...

    with pytest.raises(CheckFailed, match="returns nothing yet"):
        check_attention(untouched)


def test_a_crash_in_student_code_is_reported_with_the_input_shapes():
    def crashes(q, k, v):
        return q @ v  # [.., 5, 16] @ [.., 7, 8]: shapes do not fit

    with pytest.raises(CheckFailed, match=r"raised RuntimeError.*shape \[2, 3, 5, 16\]"):
        check_attention(crashes)


def test_wrong_output_shape_is_named():
    with pytest.raises(CheckFailed, match=r"has shape \[2, 3, 5, 5\] but should have shape \[2, 3, 5, 8\]"):
        check_attention(lambda q, k, v: q @ q.transpose(-2, -1))


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


def causal_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa_weights(q, k):
    return F.scaled_dot_product_attention(q, k, torch.eye(k.shape[-2]).expand(*k.shape[:-1], -1))


def split_by_chunks(x, heads):
    return torch.stack(x.chunk(heads, dim=-1), dim=1)                    # [B, H, N, d]


# check: (a call with a right answer, a call with a planted mistake, what the diagnosis must say)
EXPORTED_CHECKS = {
    "check_softmax": (
        lambda check: check(loop_softmax),
        lambda check: check(lambda s: (e := (s - s.amax(0, keepdim=True)).exp()) / e.sum(0, keepdim=True)),
        "normalises over the wrong dimension",
    ),
    "check_attention": (
        lambda check: check(sdpa_attention, with_mask=True),
        lambda check: check(attention_with(invert=True), with_mask=True),
        "mask is inverted",
    ),
    "check_attention_weights": (
        lambda check: check(sdpa_weights),
        lambda check: check(lambda q, k: torch.softmax(q @ k.transpose(-2, -1), dim=-1)),
        "forgot the scaling",
    ),
    "check_split_heads": (
        lambda check: check(split_by_chunks),
        lambda check: check(lambda x, h: x.view(x.shape[0], h, x.shape[1], -1)),
        "scrambles tokens and heads",
    ),
    "check_causal_attention": (
        lambda check: check(causal_sdpa),
        lambda check: check(causal_with(lambda n: torch.ones(n, n, dtype=torch.bool).triu())),
        "leaks the future",
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
