"""attn_course.checks.heads: right answers pass; each planted mistake gets its own message."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.checks.diagnosis import CheckFailed
from attn_course.checks.grouped_heads import (
    check_gqa_parameter_count,
    check_grouped_query_attention,
    check_mean_pooled_kv_heads,
)
from attn_course.checks.heads import check_multi_head_attention, check_split_fused_qkv
from attn_course.core.attention import self_attention
from attn_course.core.multihead import MultiHeadAttention

from support.planted import planted_03

# --- right answers, written without the package ------------------------------------------------


def split_by_chunks(qkv, num_heads, num_kv_heads):
    d = qkv.shape[-1] // (num_heads + 2 * num_kv_heads)
    heads = torch.stack(qkv.chunk(num_heads + 2 * num_kv_heads, dim=-1), dim=1)   # [B, H + 2 H_kv, N, d]
    assert heads.shape[-1] == d
    return heads[:, :num_heads], heads[:, num_heads:num_heads + num_kv_heads], heads[:, num_heads + num_kv_heads:]


def attention_by_einsum(x, w_q, w_k, w_v, w_o, num_heads):
    batch, tokens, width = x.shape
    d = width // num_heads
    q, k, v = (torch.einsum("bne,fe->bnf", x, w).unflatten(-1, (num_heads, d)) for w in (w_q, w_k, w_v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v).flatten(2)
    return out @ w_o.T


def gqa_by_loop(q, k, v):
    groups = q.shape[1] // k.shape[1]
    # One head at a time with the course's plain attention, which the exercise allows.
    heads = [self_attention(q[:, h], k[:, h // groups], v[:, h // groups])[0] for h in range(q.shape[1])]
    return torch.stack(heads, dim=1)


def pool_by_loop(w, num_heads, num_kv_heads):
    d, groups = w.shape[0] // num_heads, num_heads // num_kv_heads
    blocks = [w[h * d:(h + 1) * d] for h in range(num_heads)]
    return torch.cat([sum(blocks[g * groups:(g + 1) * groups]) / groups for g in range(num_kv_heads)])


@pytest.mark.parametrize("check, answer", [
    (check_split_fused_qkv, split_by_chunks),
    (check_multi_head_attention, attention_by_einsum),
    (check_grouped_query_attention, gqa_by_loop),
    (check_mean_pooled_kv_heads, pool_by_loop),
])
def test_a_right_answer_passes(check, answer):
    assert check(answer) is True


def test_a_right_answer_returning_a_list_passes_the_split():
    assert check_split_fused_qkv(lambda *a: list(split_by_chunks(*a))) is True


# --- planted mistakes ----------------------------------------------------------------------------


def split_in_thirds(qkv, num_heads, num_kv_heads):
    q, k, v = qkv.chunk(3, dim=-1)
    counts = (num_heads, num_kv_heads, num_kv_heads)
    return tuple(t.unflatten(-1, (h, -1)).transpose(1, 2) for t, h in zip((q, k, v), counts))


def split_with(view_only=False, no_transpose=False, swap=False):
    def split(qkv, num_heads, num_kv_heads):
        batch, tokens, _ = qkv.shape
        q, k, v = split_by_chunks(qkv, num_heads, num_kv_heads)              # [B, h, N, d] each
        parts = [t.transpose(1, 2).flatten(2) for t in (q, k, v)]            # back to [B, N, h·d]
        out = []
        for part, h in zip(parts, (num_heads, num_kv_heads, num_kv_heads)):
            if view_only:
                out.append(part.reshape(batch, h, tokens, -1))
            elif no_transpose:
                out.append(part.unflatten(-1, (h, -1)))
            else:
                out.append(part.unflatten(-1, (h, -1)).transpose(1, 2))
        return (out[0], out[2], out[1]) if swap else tuple(out)

    return split


def mha_with(*, merge_transpose=True, scale_by_width=False, no_scale=False, weights_transposed=True,
             softmax_dim=-1):
    def attention(x, w_q, w_k, w_v, w_o, num_heads):
        batch, tokens, width = x.shape
        d = width // num_heads

        def project(w):
            return x @ (w.T if weights_transposed else w)

        q, k, v = (project(w).view(batch, tokens, num_heads, d).transpose(1, 2) for w in (w_q, w_k, w_v))
        scale = 1.0 if no_scale else 1 / math.sqrt(width if scale_by_width else d)
        heads = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=softmax_dim) @ v
        merged = heads.transpose(1, 2) if merge_transpose else heads
        return merged.reshape(batch, tokens, width) @ (w_o.T if weights_transposed else w_o)

    return attention


def gqa_with(order="interleave", no_scale=False):
    def attention(q, k, v):
        groups = q.shape[1] // k.shape[1]
        if order == "interleave":
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        elif order == "tile":
            k, v = k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1)
        elif order == "first":
            k, v = k[:, :1].expand(-1, q.shape[1], -1, -1), v[:, :1].expand(-1, q.shape[1], -1, -1)
        scale = 1.0 if no_scale else 1 / math.sqrt(q.shape[-1])
        return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v

    return attention


def pool_with(kind):
    def pool(w, num_heads, num_kv_heads):
        groups = num_heads // num_kv_heads
        if kind == "strided":
            return w.unflatten(0, (groups, num_kv_heads, -1)).mean(dim=0).flatten(0, 1)
        by_head = w.unflatten(0, (num_kv_heads, groups, -1))
        if kind == "first":
            return by_head[:, 0].flatten(0, 1)
        if kind == "sum":
            return by_head.sum(dim=1).flatten(0, 1)
        if kind == "weights only":                                    # breaks on a 1-D bias
            rows, columns = w.shape
            return w.view(num_kv_heads, groups, rows // num_heads, columns).mean(dim=1).reshape(-1, columns)
        raise AssertionError(kind)

    return pool


PLANTED = {
    "split in equal thirds": (lambda: check_split_fused_qkv(split_in_thirds), "the three parts are not equal"),
    "split with a view only": (lambda: check_split_fused_qkv(split_with(view_only=True)), "scrambles tokens"),
    "split without moving the heads": (
        lambda: check_split_fused_qkv(split_with(no_transpose=True)), "head axis is not in front"),
    "keys and values swapped": (lambda: check_split_fused_qkv(split_with(swap=True)), "keys and values are swapped"),
    "merge without transpose": (
        lambda: check_multi_head_attention(mha_with(merge_transpose=False)), "merge the heads without a transpose"),
    "scaled by the model width": (
        lambda: check_multi_head_attention(mha_with(scale_by_width=True)), "instead of √d = √4"),
    "both classic bugs": (
        lambda: check_multi_head_attention(mha_with(merge_transpose=False, scale_by_width=True)),
        "2 mistakes: (1) You merge the heads without a transpose"),
    "no scaling in multi-head": (lambda: check_multi_head_attention(mha_with(no_scale=True)), "forgot the scaling"),
    "weights used as stored": (
        lambda: check_multi_head_attention(mha_with(weights_transposed=False)), "x @ w.T, not x @ w"),
    "multi-head softmax over queries": (
        lambda: check_multi_head_attention(mha_with(softmax_dim=-2)), "softmax runs over the queries"),
    "GQA heads tiled": (lambda: check_grouped_query_attention(gqa_with("tile")), "h % H_kv"),
    "GQA only key/value head 0": (lambda: check_grouped_query_attention(gqa_with("first")), "Every query head used"),
    "GQA without groups": (lambda: check_grouped_query_attention(gqa_with("none")), "works when H_kv = H"),
    "GQA without scaling": (lambda: check_grouped_query_attention(gqa_with(no_scale=True)), "forgot the scaling"),

    "pooled strided groups": (lambda: check_mean_pooled_kv_heads(pool_with("strided")), "consecutive heads"),
    "kept the first head": (lambda: check_mean_pooled_kv_heads(pool_with("first")), "kept the first head"),
    "summed the group": (lambda: check_mean_pooled_kv_heads(pool_with("sum")), "summed the G heads"),
    "pooling breaks on a bias": (
        lambda: check_mean_pooled_kv_heads(pool_with("weights only")), "on a bias [H·d]"),
}


@pytest.mark.parametrize("mistake", list(PLANTED))
def test_a_planted_mistake_is_named(mistake):
    run, message = PLANTED[mistake]
    with pytest.raises(CheckFailed) as raised:
        run()
    assert message in str(raised.value)


def test_messages_are_distinct_for_distinct_mistakes():
    messages = set()
    for run, _ in PLANTED.values():
        with pytest.raises(CheckFailed) as raised:
            run()
        messages.add(str(raised.value))
    assert len(messages) == len(PLANTED)


def test_a_fixed_bug_is_no_longer_named():
    """After the merge is fixed, only the scaling is named (the feedback a student needs next)."""
    with pytest.raises(CheckFailed) as raised:
        check_multi_head_attention(mha_with(scale_by_width=True))
    assert "merge" not in str(raised.value)


def test_two_mistakes_are_named_together_where_both_show():
    """With H_kv = H tiling changes nothing, so the missing scaling is named first; with groups, both."""
    tiled_unscaled = gqa_with("tile", no_scale=True)
    with pytest.raises(CheckFailed, match="^You forgot the scaling"):
        check_grouped_query_attention(tiled_unscaled)

    def scaled_only_without_groups(q, k, v):
        if q.shape[1] == k.shape[1]:
            return gqa_by_loop(q, k, v)
        return tiled_unscaled(q, k, v)

    with pytest.raises(CheckFailed, match=r"^2 mistakes: \(1\) Query head h used key/value head h % H_kv"):
        check_grouped_query_attention(scaled_only_without_groups)


def test_an_unknown_mistake_points_at_the_first_differing_entry():
    def off_by_a_little(q, k, v):
        out = gqa_by_loop(q, k, v)
        out[0, 1, 2, 3] += 0.5
        return out

    with pytest.raises(CheckFailed, match=r"\[batch 0, head 1, query 2, feature 3\]: expected"):
        check_grouped_query_attention(off_by_a_little)


@pytest.mark.parametrize("check, arity", [
    (check_split_fused_qkv, 3), (check_multi_head_attention, 6), (check_grouped_query_attention, 3),
    (check_mean_pooled_kv_heads, 3),
])
def test_an_untouched_exercise_says_so(check, arity):
    untouched = eval("lambda " + ", ".join(f"a{i}" for i in range(arity)) + ": ...")
    with pytest.raises(CheckFailed, match="returns nothing yet"):
        check(untouched)


def test_a_crash_is_reported_with_what_it_raised():
    def crashes(x, w_q, w_k, w_v, w_o, num_heads):
        return x @ w_q[:3]

    with pytest.raises(CheckFailed, match="raised RuntimeError"):
        check_multi_head_attention(crashes)


def test_a_wrong_return_type_is_named():
    with pytest.raises(CheckFailed, match=r"return 3 tensors, \(q, k, v\)"):
        check_split_fused_qkv(lambda qkv, h, kv: qkv)
    with pytest.raises(CheckFailed, match="should be a torch.Tensor"):
        check_split_fused_qkv(lambda qkv, h, kv: (1, 2, 3))


def test_failures_are_assertion_errors_for_otter():
    with pytest.raises(AssertionError):
        check_mean_pooled_kv_heads(pool_with("sum"))


# --- the parameters of a grouped-query layer ----------------------------------------------------

def count_by_shapes(embed_dim, num_heads, num_kv_heads, bias):
    """Each projection's weight and bias counted from its shape, nothing built."""
    d = embed_dim // num_heads
    shapes = [(embed_dim, embed_dim), (num_kv_heads * d, embed_dim), (num_kv_heads * d, embed_dim),
              (embed_dim, embed_dim)]
    return sum(rows * cols + (rows if bias else 0) for rows, cols in shapes)


def test_the_parameter_count_from_the_shapes_passes_and_matches_nn_multiheadattention():
    assert check_gqa_parameter_count(count_by_shapes) is True
    reference = torch.nn.MultiheadAttention(64, 8, bias=True)              # H_kv = H: PyTorch's own count
    assert count_by_shapes(64, 8, 8, True) == sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize("student", [student for student, answers in planted_03.PLANTED.items()
                                     if "gqa_parameter_count" in answers])
def test_each_planted_parameter_count_gets_its_hint(student):
    code, _, hint = planted_03.PLANTED[student]["gqa_parameter_count"]
    namespace = {"MultiHeadAttention": MultiHeadAttention}
    exec(code, namespace)
    with pytest.raises(CheckFailed) as failed:
        check_gqa_parameter_count(namespace["gqa_parameter_count"])
    assert hint in str(failed.value)
