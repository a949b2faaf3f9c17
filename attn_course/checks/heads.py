"""Check chapter 03's multi-head exercises: splitting one fused projection into heads, and multi-head
attention from raw weights (grouped-query heads: :mod:`attn_course.checks.grouped_heads`)."""

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
    returned_tensors,
    same,
    sentence_list,
    watched,
)
from attn_course.checks.forbidden import Forbidden

__all__ = ["check_split_fused_qkv", "check_multi_head_attention"]

EQUAL_PARTS = (
    "Your split works when H_kv = H, but with H = {heads} query heads and H_kv = {kv_heads} key/value "
    "heads ({problem}). With grouped-query attention the three parts are not equal: qkv is "
    "(H + 2·H_kv)·d = {width} wide, so d = {d}; the queries take the first H·d = {q_width} numbers, "
    "the keys the next H_kv·d = {kv_width} and the values the last {kv_width}."
)
SPLIT_SCRAMBLED = (
    "Your {name} reshapes its part straight to [B, {h}, N, d] with view/reshape. That scrambles tokens "
    "and heads: each 'head' holds pieces of several tokens. Reshape to [B, N, {h}, d] first, then "
    "transpose(1, 2)."
)
SPLIT_NOT_MOVED = (
    "Your {name} has shape {shape} = [B, N, heads, d]: the heads are split but the head axis is not in "
    "front of the tokens. Add .transpose(1, 2) to get [B, heads, N, d]."
)
KEYS_VALUES_SWAPPED = (
    "Your keys and values are swapped: the fused projection is laid out [queries | keys | values]."
)

#: What chapter 03's fused-projection exercise may not call: it asks for the split itself.
SPLIT_RULES = (Forbidden("attn_course.core.multihead.split_heads", "the exercise is to split the heads yourself"),)
#: What chapter 03's find-the-bug exercise may not call: a multi-head layer that is already right.
MULTI_HEAD_RULES = (
    Forbidden("attn_course.core.multihead.MultiHeadAttention.forward",
              "the exercise is to fix the classmate's code, not to run the course's layer"),
    Forbidden("torch.nn.modules.activation.MultiheadAttention.forward",
              "the exercise is to fix the classmate's code, not to run PyTorch's layer"),
    Forbidden("torch.nn.functional.multi_head_attention_forward",
              "the exercise is to fix the classmate's code, not to run PyTorch's layer"),
)


def check_split_fused_qkv(split_fn: Callable) -> bool:
    """Check ``fn(qkv [B, N, (H + 2·H_kv)·d], num_heads, num_kv_heads) -> (q, k, v)``.

    ``q`` must be ``[B, H, N, d]``, ``k`` and ``v`` ``[B, H_kv, N, d]``, from the layout ``[queries | keys |
    values]``, each part split into heads as :func:`~attn_course.core.multihead.split_heads` does. Tried
    with ``H_kv = H``, then grouped-query (``H = 6, H_kv = 2``) and multi-query (``H = 4, H_kv = 1``).

    Raises:
        CheckFailed: naming equal thirds where the parts differ, a head split without a
            transpose or without moving the head axis, swapped keys and values, or the first
            entry that differs.

    Example (a wrong answer, and what it is told):
        >>> check_split_fused_qkv(lambda qkv, num_heads, num_kv_heads: qkv.chunk(3, dim=-1))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Your q has shape [2, 5, 12] but should have shape [2, 4, 5, 3].
    """
    where = "check_split_fused_qkv"
    split_fn = watched(where, split_fn, SPLIT_RULES)
    batch, tokens, d = 2, 5, 3
    for heads, kv_heads in [(4, 4), (6, 2), (4, 1)]:
        width = (heads + 2 * kv_heads) * d
        qkv = torch.randn(batch, tokens, width)                              # [B, N, (H + 2 H_kv) d]
        parts = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        counts = (heads, kv_heads, kv_heads)
        expected = [part.unflatten(-1, (h, d)).transpose(1, 2) for part, h in zip(parts, counts)]
        facts = {"heads": heads, "kv_heads": kv_heads, "width": width, "d": d, "q_width": heads * d,
                 "kv_width": kv_heads * d}
        grouped = kv_heads != heads
        try:
            got = returned_tensors(call_answer(where, split_fn, qkv, heads, kv_heads), 3, "q, k, v")
        except CheckFailed as failed:
            if grouped and crash_message(failed):
                raise CheckFailed(EQUAL_PARTS.format(problem=f"width {width}, it {crash_message(failed)}", **facts)) \
                    from failed.__cause__
            raise
        if grouped and any(g.shape != e.shape for g, e in zip(got, expected)):
            shapes = ", ".join(f"{name} {list(g.shape)}" for name, g in zip("qkv", got))
            raise CheckFailed(EQUAL_PARTS.format(problem=f"width {width}, you return {shapes}", **facts))
        for name, g, e, h in zip(("q", "k", "v"), got, expected, counts):
            if g.shape == (batch, tokens, h, d) and h != tokens:
                raise CheckFailed(SPLIT_NOT_MOVED.format(name=name, shape=list(g.shape)))
            check_shape(g, e, f"Your {name}")
        if same(got[1], expected[2]) and same(got[2], expected[1]):
            raise CheckFailed(KEYS_VALUES_SWAPPED)
        for name, g, e, part, h in zip(("q", "k", "v"), got, expected, parts, counts):
            diagnose(g, e, [(SPLIT_SCRAMBLED.format(name=name, h=h), part.reshape(batch, h, tokens, d))],
                     ("batch", "head", "token", "feature"), f"Your {name}")
    return True


# --- multi-head attention from raw weights ------------------------------------------------------------

MERGE_WITHOUT_TRANSPOSE = (
    "You merge the heads without a transpose: reshaping [B, H, N, d] straight to [B, N, E] reads the "
    "numbers in memory order, so a token's row is filled with pieces of other tokens. Move the head "
    "axis back first: transpose(1, 2) gives [B, N, H, d], then reshape to [B, N, E]."
)
SPLIT_WITHOUT_TRANSPOSE = (
    "You split the heads with a view straight to [B, H, N, d], without a transpose: each 'head' then "
    "holds pieces of several tokens. View as [B, N, H, d], then transpose(1, 2)."
)
SCALE_BY_MODEL_WIDTH = (
    "You divide the scores by √E = √{E} (the model width, all {H} heads together) instead of √d = √{d}, "
    "the size of one head: a head's scores are dot products of d numbers."
)
SCALE_NONE = "You forgot the scaling: divide each head's scores by √d = √{d} before the softmax."
SCALE_BY_D = "You divide the scores by d = {d}; divide by its square root, √d."
WEIGHTS_NOT_TRANSPOSED = (
    "You multiply by the weights as stored: they are [out, in] like nn.Linear's, so a projection is "
    "x @ w.T, not x @ w."
)
SOFTMAX_OVER_QUERIES_MHA = (
    "Your softmax runs over the queries (dim=-2): each query's weights over the keys must sum to 1, "
    "so use dim=-1."
)
NO_OUTPUT_PROJECTION = "You left out the output projection: the merged heads still go through w_o (@ w_o.T)."


def _mha_variant(x, w_q, w_k, w_v, w_o, heads, *, scale, split_transpose=True, merge_transpose=True,
                 weights_transposed=True, softmax_dim=-1, output_projection=True):
    """Multi-head attention from raw ``[out, in]`` weights, with the named mistakes switchable."""
    batch, tokens, width = x.shape
    d = width // heads

    def project(w):
        return x @ (w.T if weights_transposed else w)                   # [B, N, E]

    def split(t):
        if split_transpose:
            return t.view(batch, tokens, heads, d).transpose(1, 2)       # [B, H, N, d]
        return t.reshape(batch, heads, tokens, d)

    q, k, v = split(project(w_q)), split(project(w_k)), split(project(w_v))
    weights = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=softmax_dim)   # [B, H, N, N]
    out = weights @ v                                                    # [B, H, N, d]
    merged = out.transpose(1, 2).reshape(batch, tokens, width) if merge_transpose else out.reshape(
        batch, tokens, width)
    if not output_projection:
        return merged
    return merged @ (w_o.T if weights_transposed else w_o)               # [B, N, E]


def _mha_mistakes(x, w_q, w_k, w_v, w_o, heads) -> list[tuple[str, torch.Tensor]]:
    """Every combination of the known mistakes, fewest first, with the message naming them."""
    width = x.shape[-1]
    d = width // heads
    facts = {"E": width, "H": heads, "d": d}
    scales = [(None, 1 / math.sqrt(d)), (SCALE_BY_MODEL_WIDTH, 1 / math.sqrt(width)), (SCALE_NONE, 1.0),
              (SCALE_BY_D, 1 / d)]
    switches = [("merge_transpose", MERGE_WITHOUT_TRANSPOSE), ("split_transpose", SPLIT_WITHOUT_TRANSPOSE),
                ("weights_transposed", WEIGHTS_NOT_TRANSPOSED), ("output_projection", NO_OUTPUT_PROJECTION)]
    found = []
    for scale_message, scale in scales:
        for mask in range(2 ** len(switches)):
            flags = {name: not (mask >> i) & 1 for i, (name, _) in enumerate(switches)}
            messages = [message for i, (_, message) in enumerate(switches) if (mask >> i) & 1]
            if scale_message:
                messages.append(scale_message.format(**facts))
            for softmax_dim in (-1, -2):
                all_messages = messages + ([SOFTMAX_OVER_QUERIES_MHA] if softmax_dim == -2 else [])
                if all_messages:
                    wrong = _mha_variant(x, w_q, w_k, w_v, w_o, heads, scale=scale, softmax_dim=softmax_dim, **flags)
                    found.append((all_messages, wrong))
    found.sort(key=lambda item: len(item[0]))
    return [(sentence_list(messages), wrong) for messages, wrong in found]


def check_multi_head_attention(attention_fn: Callable) -> bool:
    """Check ``fn(x [B, N, E], w_q, w_k, w_v, w_o, num_heads) -> output [B, N, E]``.

    The weights are ``[E, E]``, stored like ``nn.Linear``'s (``[out, in]``), without biases; the
    reference is ``torch.nn.MultiheadAttention`` holding them.

    Raises:
        CheckFailed: naming every combination of the known mistakes the answer shows (merge or split
            without a transpose, scaling by √E, by d or not at all, weights not transposed, no output
            projection, softmax over the queries), or the first entry that differs.

    Example (a shortcut, and what it is told):
        >>> from attn_course.core.multihead import MultiHeadAttention
        >>> def ours(x, w_q, w_k, w_v, w_o, num_heads):
        ...     layer = MultiHeadAttention(x.shape[-1], num_heads, bias=False)
        ...     for linear, w in zip((layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj), (w_q, w_k, w_v, w_o)):
        ...         linear.weight.data.copy_(w)
        ...     return layer(x)[0]
        >>> check_multi_head_attention(ours)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_multi_head_attention: your answer calls MultiHeadAttention...
    """
    where = "check_multi_head_attention"
    attention_fn = watched(where, attention_fn, MULTI_HEAD_RULES)
    batch, tokens, width, heads = 2, 5, 16, 4
    x = torch.randn(batch, tokens, width)                                 # [B, N, E]
    w_q, w_k, w_v, w_o = (torch.randn(width, width) / math.sqrt(width) for _ in range(4))   # [out, in]
    reference = torch.nn.MultiheadAttention(width, heads, bias=False, batch_first=True)
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([w_q, w_k, w_v]))
        reference.out_proj.weight.copy_(w_o)
        expected, _ = reference(x, x, x, need_weights=False)               # [B, N, E]
    got = call_student(where, attention_fn, x, w_q, w_k, w_v, w_o, heads)
    diagnose(got, expected, _mha_mistakes(x, w_q, w_k, w_v, w_o, heads), ("batch", "token", "feature"),
             "Your output")
    return True
