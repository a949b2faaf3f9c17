"""MoBA's and NSA's block selections: FlexAttention with the selection's mask_mod against the dense mask it stands for,
the choices against loops, and causality."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.variants.block_selection import (
    block_mask_mod,
    dense_block_mask,
    moba_blocks,
    nsa_attention,
)
from attn_course.variants.flex_attention import flex_attend
from attn_course.variants.masks import sliding_window_mask


def inputs(tokens=32, d=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, tokens, d, generator=generator, dtype=torch.float64) for _ in range(3)]


def test_moba_picks_the_best_earlier_complete_blocks_by_mean_key_and_its_own():
    q, k, _ = inputs()
    chosen = moba_blocks(q, k, block_size=4, top_k=2)
    for b, h, i in [(0, 0, 31), (1, 2, 17), (0, 1, 9), (1, 0, 2)]:
        own = i // 4
        scores = {j: (q[b, h, i] @ k[b, h, 4 * j:4 * j + 4].mean(0)).item() for j in range(own)}
        expected = set(sorted(scores, key=scores.get, reverse=True)[:2]) | {own}
        assert set(chosen[b, h, i].nonzero().flatten().tolist()) == expected


@pytest.mark.parametrize("top_k", [0, 1, 3, 8])
def test_flex_attention_with_the_moba_selection_equals_the_dense_masked_computation(top_k):
    q, k, v = inputs()
    chosen = moba_blocks(q, k, block_size=4, top_k=top_k)
    expected = self_attention(q, k, v, dense_block_mask(chosen, 4))[0]
    torch.testing.assert_close(flex_attend(q, k, v, mask_mod=block_mask_mod(chosen, 4)), expected, rtol=0, atol=1e-12)
    if top_k >= 8:                                                   # every earlier block: plain causal attention
        torch.testing.assert_close(expected, self_attention(q, k, v, causal_mask(32))[0], rtol=0, atol=1e-12)


def test_a_selection_never_reaches_a_future_key():
    q, k, _ = inputs()
    mask = dense_block_mask(moba_blocks(q, k, block_size=4, top_k=3), 4)
    assert not (mask & ~causal_mask(32)).any() and mask.diagonal(dim1=-2, dim2=-1).all()


def test_nsa_is_the_gated_sum_of_its_three_branches_each_computed_densely():
    q, k, v = inputs(seed=1)
    gates = torch.rand(2, 3, 32, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out, chosen = nsa_attention(q, k, v, gates, block_size=4, top_n=2, window=5)
    # compressed: a loop over queries and the blocks complete before them, the mean key and value of each
    compressed = torch.zeros_like(q)
    for i in range(32):
        done = (i + 1) // 4                                          # blocks whose last token is at or before i
        if done:
            keys, values = (x[:, :, :4 * done].unflatten(2, (done, 4)).mean(3) for x in (k, v))
            weights = torch.softmax(q[:, :, i:i + 1] @ keys.transpose(-1, -2) / math.sqrt(8), dim=-1)
            compressed[:, :, i] = (weights @ values)[:, :, 0]
    selected = self_attention(q, k, v, dense_block_mask(chosen, 4))[0]
    local = self_attention(q, k, v, sliding_window_mask(32, window=5))[0]
    expected = gates[..., :1] * compressed + gates[..., 1:2] * selected + gates[..., 2:] * local
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    assert chosen[..., 0].all() and int(chosen.sum(-1).max()) <= 2 + 2       # top 2, the first, its own


def test_bad_inputs_are_named():
    q, k, v = inputs(tokens=30)
    with pytest.raises(ValueError, match="multiple of block_size=4"):
        moba_blocks(q, k, block_size=4, top_k=1)
    q, k, v = inputs()
    with pytest.raises(ValueError, match=r"gates must be \[B, H, N, 3\]"):
        nsa_attention(q, k, v, torch.rand(2, 3, 32, 2, dtype=torch.float64), block_size=4, top_n=1, window=4)
