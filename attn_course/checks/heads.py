"""Check splitting ``[B, N, E]`` into heads ``[B, H, N, d]``: the reshape and the transpose."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_student, check_shape, diagnose, same

__all__ = ["check_split_heads"]


VIEW_WITHOUT_TRANSPOSE = (
    "You reshaped [B, N, E] straight to [B, H, N, d] with view/reshape. That scrambles tokens and heads: "
    "each 'head' now holds pieces of several tokens. Reshape to [B, N, H, d] first, then "
    "transpose(1, 2) to get [B, H, N, d]."
)
NO_TRANSPOSE_SHAPE = (
    "Your result has shape [B, N, H, d] = {shape}: you split the heads but did not move the head axis "
    "in front of the tokens. Add .transpose(1, 2) to get [B, H, N, d]."
)


def check_split_heads(split_fn: Callable[[torch.Tensor, int], torch.Tensor]) -> bool:
    """Check ``fn(x [B, N, E], num_heads) -> [B, H, N, E / H]``.

    Returns:
        ``True`` when correct.

    Raises:
        CheckFailed: naming a view without transpose, a missing transpose, or the first difference.
    """
    batch, tokens, heads, head_dim = 2, 5, 4, 3
    x = torch.randn(batch, tokens, heads * head_dim)                     # [B, N, E]
    expected = x.view(batch, tokens, heads, head_dim).transpose(1, 2)   # [B, H, N, d]
    got = call_student("check_split_heads", split_fn, x.clone(), heads)
    if got.shape == (batch, tokens, heads, head_dim):
        raise CheckFailed(NO_TRANSPOSE_SHAPE.format(shape=list(got.shape)))
    check_shape(got, expected, "Your split")
    if not same(got, expected):
        mistakes = [(VIEW_WITHOUT_TRANSPOSE, x.reshape(batch, heads, tokens, head_dim))]
        diagnose(got, expected, mistakes, ("batch", "head", "token", "feature"), "Your split")
    return True
