"""Check chapter 03's grouped-query exercises: the parameters of a layer whose ``G`` query heads share one
key/value head, its attention, and converting a multi-head checkpoint by mean-pooling its key/value heads."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import (
    CheckFailed,
    call_answer,
    call_student,
    check_shape,
    crash_message,
    diagnose,
    name_mistake,
    number,
    same,
    sentence_list,
    watched,
)
from attn_course.checks.forbidden import Forbidden
from attn_course.core.multihead import MultiHeadAttention

__all__ = ["check_gqa_parameter_count", "check_grouped_query_attention", "check_mean_pooled_kv_heads"]

KV_FULL_WIDTH = ("You counted W_K and W_V at the full width E, as in multi-head attention: with H_kv key/value heads "
                 "of d = E/H numbers each, they are E × H_kv·d, not E × E.")
KV_HEADS_TIMES_E = ("Your W_K and W_V are E × H_kv·E: a key/value head has d = E/H numbers, not E, so the two are "
                    "E × H_kv·d = E × H_kv·E/H each.")
NO_OUTPUT = "You left out W_O, the output projection: it is E × E (with a bias of E), whatever H_kv is."
ONLY_ONE_SHRUNK = "Only one of W_K and W_V shrank: both have H_kv heads, E × H_kv·d each."
NO_BIASES = ("You left out the biases: with bias=True each projection has one, E for W_Q and W_O and H_kv·d for "
             "W_K and W_V.")
BIASES_ANYWAY = "You counted biases although bias=False: then the four projections are weights only."
COUNT_WRONG = ("Your count is not right for E = {E}, H = {H}, H_kv = {kv}, bias={bias}: expected {expected:,}, "
               "got {got:,}. Count W_Q, W_K, W_V and W_O one by one, with their biases when bias=True.")

_PREDICT = "a prediction follows from the shapes alone: build no layer and no tensor to count"
#: What chapter 03's parameter prediction may not do: build what it counts.
COUNT_RULES = (*(Forbidden(name, _PREDICT) for name in (
    "attn_course.core.multihead.MultiHeadAttention", "torch.nn.Linear", "torch.nn.MultiheadAttention")),
               *(Forbidden(f"torch.{name}", _PREDICT) for name in ("empty", "zeros", "ones", "full", "randn", "rand")))
#: (E, H, H_kv, bias): multi-head, grouped, multi-query, Llama 2 70B's attention, small odd heads.
COUNT_CASES = [(512, 8, 8, True), (512, 8, 2, True), (512, 8, 1, False), (8192, 64, 8, False), (96, 6, 3, True)]


def check_gqa_parameter_count(count_fn: Callable) -> bool:
    """Check ``fn(embed_dim, num_heads, num_kv_heads, bias) -> int``: the parameters of a grouped-query attention
    layer, compared with ``MultiHeadAttention(embed_dim, num_heads, num_kv_heads=..., bias=...)`` built on the
    meta device (no memory), for multi-head, grouped and multi-query layers, Llama 2 70B's shape among them.

    Raises:
        CheckFailed: naming W_K and W_V counted at width E or H_kv·E, W_O left out, only one of W_K and W_V
            shrunk, biases left out or counted without them, else the case that differs.

    Example (a wrong answer, which counts a multi-head layer):
        >>> check_gqa_parameter_count(lambda embed_dim, num_heads, num_kv_heads, bias: 4 * embed_dim**2 + 4 * embed_dim)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You counted W_K and W_V at the full width E, as in multi-head ...
    """
    count_fn = watched("check_gqa_parameter_count", count_fn, COUNT_RULES)
    for e, h, kv, bias in COUNT_CASES:
        with torch.device("meta"):
            layer = MultiHeadAttention(e, h, num_kv_heads=kv, bias=bias)
        expected = sum(p.numel() for p in layer.parameters())
        got = number(call_answer("check_gqa_parameter_count", count_fn, e, h, kv, bias),
                     "Your function should return a number (an int), but it returned {type}.")
        if got == expected:
            continue
        kv_width, b = kv * (e // h), int(bias)
        q_and_o = 2 * (e * e + b * e)
        mistakes = [
            (KV_FULL_WIDTH, 4 * (e * e + b * e)),
            (KV_HEADS_TIMES_E, q_and_o + 2 * (e * kv * e + b * kv * e)),
            (NO_OUTPUT, e * e + b * e + 2 * (e * kv_width + b * kv_width)),
            (ONLY_ONE_SHRUNK, q_and_o + e * e + b * e + e * kv_width + b * kv_width),
            (NO_BIASES if bias else BIASES_ANYWAY,
             2 * e * e + 2 * e * kv_width + (0 if bias else 2 * e + 2 * kv_width)),
        ]
        name_mistake(got, [(message, wrong) for message, wrong in mistakes if wrong != expected])
        raise CheckFailed(COUNT_WRONG.format(E=e, H=h, kv=kv, bias=bias, expected=expected, got=got))
    return True


GQA_TILED = (
    "Query head h used key/value head h % H_kv: copying the key/value heads with .repeat tiles them "
    "(0, 1, 0, 1, ...). Consecutive query heads form a group: head h uses key/value head h // G, "
    "the order repeat_interleave(G, dim=1) gives."
)
GQA_FIRST_ONLY = "Every query head used key/value head 0; query head h must use key/value head h // G."

GQA_FAILS_GROUPED = (
    "Your function works when H_kv = H, but with H = {heads} query heads and H_kv = {kv_heads} "
    "key/value heads it {problem}. Each key/value head serves G = H / H_kv = {groups} consecutive query "
    "heads: repeat it G times along the head axis (repeat_interleave), or view the queries as "
    "[B, H_kv, G, N, d]."
)
GQA_SCALES = {
    "none": "You forgot the scaling: divide the scores by √d (here √{d}) before the softmax.",
    "by_d": "You divide the scores by d = {d}; divide by its square root, √d.",
}
GQA_SOFTMAX_OVER_QUERIES = "Your softmax runs over the queries (dim=-2); use dim=-1, over the keys."


def _gqa_reference(q, k, v, kv_index, scale, softmax_dim=-1):
    """Attention where query head h uses key/value head ``kv_index[h]``, float64."""
    k, v = k[:, kv_index].double(), v[:, kv_index].double()                 # [B, H, N, d]
    weights = torch.softmax(q.double() @ k.transpose(-2, -1) * scale, dim=softmax_dim)
    return (weights @ v).to(q.dtype)


#: What chapter 03's grouped-query exercise may not call: attention that shares the heads for it.
GROUPED_RULES = (
    Forbidden("torch.nn.functional.scaled_dot_product_attention",
              "the exercise is to share the key/value heads yourself (SDPA's enable_gqa would do it for you)"),
    Forbidden("attn_course.core.attention.eager_attention", "the exercise is to share the key/value heads yourself"),
    Forbidden("attn_course.core.backends.sdpa_attention", "the exercise is to share the key/value heads yourself"),
    Forbidden("attn_course.flash.accuracy.plain_attention", "the exercise is to share the key/value heads yourself"),
)


def check_grouped_query_attention(attention_fn: Callable) -> bool:
    """Check ``fn(q [B, H, N, d], k [B, H_kv, N, d], v [B, H_kv, N, d]) -> [B, H, N, d]``.

    Query head ``h`` must attend with key/value head ``h // G``, ``G = H / H_kv``, as
    ``F.scaled_dot_product_attention(..., enable_gqa=True)`` does. Tried with ``H_kv = H``, then
    ``H = 6, H_kv = 2`` and ``H = 4, H_kv = 1`` (multi-query).

    Raises:
        CheckFailed: naming tiled key/value heads (``h % H_kv``), one key/value head for all,
            a function that only works for ``H_kv = H``, a wrong scaling or softmax axis, or the
            first entry that differs.

    Example (a shortcut, and what it is told):
        >>> import torch.nn.functional as F
        >>> check_grouped_query_attention(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_grouped_query_attention: your answer calls F.scaled_...
    """
    where = "check_grouped_query_attention"
    attention_fn = watched(where, attention_fn, GROUPED_RULES)
    batch, tokens, d = 2, 5, 8
    for heads, kv_heads in [(3, 3), (6, 2), (4, 1)]:
        q = torch.randn(batch, heads, tokens, d)                          # [B, H, N, d]
        k = torch.randn(batch, kv_heads, tokens, d)                       # [B, H_kv, N, d]
        v = torch.randn(batch, kv_heads, tokens, d)                       # [B, H_kv, N, d]
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        groups = heads // kv_heads
        facts = {"heads": heads, "kv_heads": kv_heads, "groups": groups, "d": d}
        try:
            got = call_student(where, attention_fn, q, k, v)
        except CheckFailed as failed:
            if groups > 1 and crash_message(failed):
                problem = crash_message(failed)
                raise CheckFailed(GQA_FAILS_GROUPED.format(problem=problem, **facts)) from failed.__cause__
            raise
        if groups > 1 and got.shape != expected.shape:
            raise CheckFailed(GQA_FAILS_GROUPED.format(
                problem=f"returns shape {list(got.shape)} instead of [B, H, N, d] = {list(expected.shape)}", **facts))
        check_shape(got, expected, "Your output")
        if same(got, expected):
            continue
        heads_index = torch.arange(heads)
        orders = [(None, heads_index // groups)]
        if groups > 1:
            orders += [(GQA_TILED, heads_index % kv_heads)]
        if kv_heads > 1:
            orders += [(GQA_FIRST_ONLY, torch.zeros(heads, dtype=torch.long))]
        scales = [(None, 1 / math.sqrt(d)), (GQA_SCALES["none"], 1.0), (GQA_SCALES["by_d"], 1 / d)]
        mistakes = []
        for order_message, kv_index in orders:
            for scale_message, scale in scales:
                for softmax_dim in (-1, -2):
                    messages = [m.format(**facts) for m in (order_message, scale_message) if m]
                    messages += [GQA_SOFTMAX_OVER_QUERIES] if softmax_dim == -2 else []
                    if messages:
                        mistakes.append((messages, _gqa_reference(q, k, v, kv_index, scale, softmax_dim)))
        mistakes.sort(key=lambda item: len(item[0]))
        diagnose(got, expected, [(sentence_list(m), wrong) for m, wrong in mistakes],
                 ("batch", "head", "query", "feature"), f"Your output (H = {heads}, H_kv = {kv_heads})")
    return True


# --- converting a multi-head checkpoint: mean-pooling key/value heads ----------------------------

POOL_STRIDED = (
    "You pooled heads h, h + H_kv, h + 2·H_kv, ... together (a view as [G, H_kv, d, ...]). A group is G "
    "consecutive heads, g·G ... g·G + G - 1, the query heads that share key/value head g: view the rows "
    "as [H_kv, G, d, ...] and average over G."
)
POOL_FIRST_HEADS = ("You kept the first H_kv = {kv_heads} heads of the layer (rows 0 to {rows}) and dropped the "
                    "other {dropped}: the groups after the first lose everything they had learned. Each key/value "
                    "head stands for its whole group: average the G = {groups} heads of group g, heads g·G to "
                    "g·G + G - 1.")
POOL_FIRST_HEAD = (
    "You kept the first head of each group instead of averaging the group. Ainslie et al. (2023) tried "
    "that too and found mean-pooling works better: it keeps something of every head."
)
POOL_SUM = "You summed the G heads of each group; average them (divide by G = {groups})."

POOL_FAILS_ON_BIAS = (
    "Your function works on a weight [H·d, E] but on a bias [H·d] it {problem}. Pool along the first "
    "dimension only, whatever follows it: e.g. unflatten dim 0 into (H_kv, G, d)."
)


def check_mean_pooled_kv_heads(pool_fn: Callable) -> bool:
    """Check ``fn(w [H·d, ...], num_heads, num_kv_heads) -> [H_kv·d, ...]``: each key/value head of a
    grouped-query layer as the mean of its group's heads in a multi-head layer.

    Group ``g`` is heads ``g·G … g·G + G - 1`` (``G = H / H_kv``), head ``h`` rows ``h·d … h·d + d - 1`` of
    ``w`` (``[out, in]``). Tried on weights ``[H·d, E]`` for ``(H, H_kv) = (6, 2), (4, 4), (4, 1)``, and
    on a bias ``[H·d]``.

    Raises:
        CheckFailed: naming strided groups, the first head of each group kept, the first H_kv heads of
            the layer kept, a sum instead of a mean, a function that fails on a 1-D bias, or the first
            entry that differs.

    Example (a wrong answer, which keeps the first heads instead of averaging each group):
        >>> def first_heads(w, num_heads, num_kv_heads):
        ...     return w[: num_kv_heads * w.shape[0] // num_heads]
        >>> check_mean_pooled_kv_heads(first_heads)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You kept the first H_kv = 2 heads of the layer (rows 0 to 7) and ...
    """
    where = "check_mean_pooled_kv_heads"
    d, width = 4, 10
    cases = [(6, 2, (width,)), (4, 4, (width,)), (4, 1, (width,)), (6, 3, ())]
    for heads, kv_heads, rest in cases:
        groups = heads // kv_heads
        w = torch.randn(heads * d, *rest)                                   # [H·d, E] or [H·d]
        by_head = w.unflatten(0, (kv_heads, groups, d))                     # [H_kv, G, d, ...]
        expected = by_head.mean(dim=1).flatten(0, 1)                        # [H_kv·d, ...]
        try:
            got = call_student(where, pool_fn, w, heads, kv_heads)
        except CheckFailed as failed:
            if not rest and crash_message(failed):
                raise CheckFailed(POOL_FAILS_ON_BIAS.format(problem=crash_message(failed))) from failed.__cause__
            raise
        what = f"Your pooled {'bias' if not rest else 'weight'} (H = {heads}, H_kv = {kv_heads})"
        if got.shape != expected.shape and not rest:
            raise CheckFailed(POOL_FAILS_ON_BIAS.format(
                problem=f"returns shape {list(got.shape)} instead of [H_kv·d] = {list(expected.shape)}"))
        diagnose(got, expected, [
            (POOL_STRIDED, w.unflatten(0, (groups, kv_heads, d)).mean(dim=0).flatten(0, 1)),
            (POOL_FIRST_HEAD, by_head[:, 0].flatten(0, 1)),
            (POOL_FIRST_HEADS.format(kv_heads=kv_heads, rows=kv_heads * d - 1, dropped=heads - kv_heads, groups=groups),
             w[: kv_heads * d]),
            (POOL_SUM.format(groups=groups), by_head.sum(dim=1).flatten(0, 1)),
        ], ("row", "column")[: expected.dim()], what)
    return True
