"""attn_course.checks.attention: masked attention and the find-the-bug fix; every mistake named."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attn_course.checks.attention import check_fixed_attention, check_masked_attention
from attn_course.checks.diagnosis import CheckFailed
from attn_course.core.attention import scaled_dot_product, self_attention

# --- right answers, written independently of the package -----------------------------------


def sdpa_attention(q, k, v, mask=None):
    """PyTorch's own attention: from 2.5 it gives a fully masked row zeros (a forbidden answer)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def matrix_attention(q, k, v, mask=None):
    """The formula, by hand: a fully masked row's weights are set to zero."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v


def loop_attention(q, k, v, mask=None):
    """One query at a time in float64; a query with no visible key gets zeros."""
    flat_q = q.reshape(-1, *q.shape[-2:]).double()
    flat_k = k.expand(*q.shape[:-2], *k.shape[-2:]).reshape(-1, *k.shape[-2:]).double()
    flat_v = v.expand(*q.shape[:-2], *v.shape[-2:]).reshape(-1, *v.shape[-2:]).double()
    out = torch.zeros(flat_q.shape[0], q.shape[-2], v.shape[-1], dtype=torch.float64)
    for b in range(flat_q.shape[0]):
        for i in range(q.shape[-2]):
            allowed = torch.ones(k.shape[-2], dtype=torch.bool) if mask is None else mask[i]
            if not allowed.any():
                continue
            scores = flat_k[b][allowed] @ flat_q[b, i] / math.sqrt(q.shape[-1])
            out[b, i] = torch.softmax(scores, dim=0) @ flat_v[b][allowed]
    return out.reshape(*q.shape[:-1], v.shape[-1]).to(q.dtype)


def test_right_masked_attention_passes():
    assert check_masked_attention(matrix_attention) is True
    assert check_masked_attention(loop_attention) is True
    assert check_masked_attention(lambda q, k, v, mask=None: (matrix_attention(q, k, v, mask), None)) is True


def test_right_fixed_attention_passes():
    assert check_fixed_attention(matrix_attention) is True
    assert check_fixed_attention(lambda q, k, v, mask: (loop_attention(q, k, v, mask), "weights")) is True


# --- mistakes -------------------------------------------------------------------------------


def student(scale_of=lambda q: 1 / math.sqrt(q.shape[-1]), mode="right", fill=-math.inf, empty="zeros",
            dim=-1):
    """A student's attention with the chosen mistakes."""

    def attention(q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1) * scale_of(q)
        if mask is not None and mode in ("right", "inverted"):
            allowed = mask if mode == "right" else ~mask
            scores = scores.masked_fill(~allowed, fill)
        weights = torch.softmax(scores, dim=dim)
        if mask is not None and mode == "after":
            weights = weights * mask
        if empty == "zeros":
            weights = torch.nan_to_num(weights, nan=0.0)
        return weights @ v

    return attention


def no_mask_argument(q, k, v, mask):
    return matrix_attention(q, k, v, mask)


def plain_exp_attention(q, k, v, mask=None):
    """Right on ordinary scores (empty rows included), but exp of large scores is inf."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    exps = scores.exp()
    return exps / exps.sum(dim=-1, keepdim=True).clamp_min(1e-30) @ v


def d_model(q):
    return 1 / math.sqrt(q.shape[1] * q.shape[-1])


MASKED = {
    "NaN on the fully masked row": (student(empty="nan"), "NaN for query 4"),
    "-1e9 makes the empty row uniform": (student(fill=-1e9), "plain average of all the values"),
    "inverted mask": (student(mode="inverted"), "mask is inverted"),
    "mask after the softmax": (student(mode="after"), "after the softmax"),
    "no scaling": (student(scale_of=lambda q: 1.0), "forgot the scaling"),
    "scaled by d_k": (student(scale_of=lambda q: 1 / q.shape[-1]), "divided the scores by d_k"),
    "softmax over the queries": (student(dim=-2), "wrong dimension (the queries"),
    "mask is required": (no_mask_argument, "must also work without a mask"),
    "plain exp overflows": (plain_exp_attention, "overflows on large scores"),
}


@pytest.mark.parametrize("mistake", list(MASKED))
def test_each_masked_attention_mistake_is_named(mistake):
    fn, phrase = MASKED[mistake]
    with pytest.raises(CheckFailed) as raised:
        check_masked_attention(fn)
    assert phrase in str(raised.value)


@pytest.mark.parametrize("check", [check_masked_attention, check_fixed_attention])
@pytest.mark.parametrize("shortcut, called", [
    (sdpa_attention, "F.scaled_dot_product_attention"),
    (lambda q, k, v, mask=None: self_attention(q, k, v, mask), "self_attention"),
    (lambda q, k, v, mask=None: scaled_dot_product(q, k, v, mask), "scaled_dot_product"),
])
def test_calling_an_existing_attention_is_told_it_is_forbidden(check, shortcut, called):
    with pytest.raises(CheckFailed, match=f"your answer calls {called}, which this exercise forbids"):
        check(shortcut)


def test_a_wrong_empty_row_of_another_kind_is_pointed_at():
    def ones_on_empty_rows(q, k, v, mask=None):
        output = matrix_attention(q, k, v, mask).clone()
        if mask is not None:
            output[..., (~mask).all(dim=-1), :] = 1.0
        return output

    with pytest.raises(CheckFailed, match=r"except query 4.*must be all zeros"):
        check_masked_attention(ones_on_empty_rows)


FIXED = {
    "the bug untouched: √d_model and the mask after the softmax": (
        student(scale_of=d_model, mode="after"), "Two mistakes remain"),
    "only √d_model left": (student(scale_of=d_model), "instead of the head dimension"),
    "only the mask after the softmax left": (student(mode="after"), "after the softmax"),
    "a 'fix' that divides by d_k": (student(scale_of=lambda q: 1 / q.shape[-1]), "divided the scores by d_k"),
}


@pytest.mark.parametrize("mistake", list(FIXED))
def test_each_find_the_bug_mistake_is_named(mistake):
    fn, phrase = FIXED[mistake]
    with pytest.raises(CheckFailed) as raised:
        check_fixed_attention(fn)
    assert phrase in str(raised.value)


def test_two_remaining_mistakes_are_both_named():
    with pytest.raises(CheckFailed) as raised:
        check_fixed_attention(student(scale_of=d_model, mode="after"))
    message = str(raised.value)
    assert "√d_model" in message and "after the softmax" in message


def test_a_global_maximum_is_named_as_underflow_not_overflow():
    def global_max_attention(q, k, v, mask):
        scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, -math.inf)
        exps = (scores - scores.max()).exp()
        return exps / exps.sum(dim=-1, keepdim=True) @ v

    with pytest.raises(CheckFailed) as raised:
        check_fixed_attention(global_max_attention)
    assert "one maximum for the whole tensor" in str(raised.value)


def test_unknown_mistake_points_at_the_first_differing_entry():
    def off_by_a_little(q, k, v, mask=None):
        output = matrix_attention(q, k, v, mask).clone()
        output[1, 2, 3, 4] += 0.5
        return output

    with pytest.raises(CheckFailed, match=r"\[batch 1, head 2, query 3, feature 4\]: expected"):
        check_masked_attention(off_by_a_little)


def test_unanswered_exercise_says_so_instead_of_crashing():
    def untouched(q, k, v, mask=None): ...

    with pytest.raises(CheckFailed, match="returns nothing yet"):
        check_masked_attention(untouched)


def test_a_crash_in_student_code_is_reported_with_the_input_shapes():
    def crashes(q, k, v, mask=None):
        return q @ v  # [.., 5, 16] @ [.., 7, 8]: shapes do not fit

    with pytest.raises(CheckFailed, match=r"raised RuntimeError.*shape \[2, 3, 5, 16\]"):
        check_masked_attention(crashes)


def test_wrong_output_shape_is_named():
    with pytest.raises(CheckFailed, match=r"has shape \[2, 3, 5, 5\] but should have shape \[2, 3, 5, 8\]"):
        check_masked_attention(lambda q, k, v, mask=None: q @ q.transpose(-2, -1))
