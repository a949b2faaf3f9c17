"""ALiBi's slopes and biases against BLOOM's (``transformers``' ``build_alibi_tensor``) and the paper."""

import pytest
import torch
from transformers.models.bloom.modeling_bloom import build_alibi_tensor

from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.positions.alibi import alibi_bias, alibi_slopes


@pytest.mark.parametrize("num_heads", [1, 2, 3, 5, 6, 8, 12, 16, 20, 32, 40, 64, 112])
def test_slopes_equal_blooms(num_heads):
    # BLOOM's tensor is m_h · j (key position j, 0-based), so position 1 holds the slope itself.
    # BLOOM raises a float32 base to the integer powers, so its slopes carry float32 rounding
    # (relative 5e-7 at 112 heads); ours are computed in float64 and rounded once.
    bloom = build_alibi_tensor(torch.ones(1, 3, dtype=torch.long), num_heads, torch.float64)   # [H, 1, 3]
    torch.testing.assert_close(alibi_slopes(num_heads, dtype=torch.float64), bloom[:, 0, 1], rtol=1e-6, atol=0)


def test_slopes_are_the_papers_geometric_sequences():
    # Press et al. (2021), section 3: 8 heads 1/2 ... 1/2^8; 16 heads start at 1/2^0.5, ratio 1/2^0.5.
    assert alibi_slopes(8, dtype=torch.float64).tolist() == [2.0 ** -h for h in range(1, 9)]
    assert torch.allclose(alibi_slopes(16, dtype=torch.float64), torch.tensor([2 ** (-h / 2) for h in range(1, 17)],
                                                                              dtype=torch.float64), rtol=1e-15)


@pytest.mark.parametrize("num_heads", [4, 6])
def test_bias_differs_from_blooms_by_a_constant_per_row(num_heads):
    # BLOOM adds m·j; ALiBi's -m·(i - j) is that minus m·i, the same for a whole row, which the
    # softmax cannot see. So the attention weights under a causal mask are the same.
    n = 7
    ours = alibi_bias(num_heads, n, dtype=torch.float64)                                   # [H, N, N]
    bloom = build_alibi_tensor(torch.ones(1, n, dtype=torch.long), num_heads, torch.float64)  # [H, 1, N]
    difference = ours - bloom
    torch.testing.assert_close(difference, difference[..., :1].expand_as(difference), rtol=0, atol=1e-12)
    slopes = alibi_slopes(num_heads, dtype=torch.float64)
    torch.testing.assert_close(difference[..., 0], -slopes[:, None] * torch.arange(n, dtype=torch.float64))
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(num_heads, n, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    blocked = torch.zeros(n, n, dtype=torch.float64).masked_fill(~causal_mask(n), float("-inf"))
    ours_weights = self_attention(q, k, v, ours + blocked)[1]
    bloom_weights = self_attention(q, k, v, bloom + blocked)[1]
    torch.testing.assert_close(ours_weights, bloom_weights, rtol=0, atol=1e-12)


def test_bias_after_a_cache_is_the_last_rows():
    # Two new queries after five cached tokens see the last two rows of the 7 × 7 bias.
    full = alibi_bias(3, 7)
    torch.testing.assert_close(alibi_bias(3, 2, 7), full[:, 5:], rtol=0, atol=0)
    torch.testing.assert_close(alibi_bias(3, 2, 7, offset=1), full[:, 1:3], rtol=0, atol=0)


@pytest.mark.parametrize("call, error, message", [
    (lambda: alibi_slopes(0), ValueError, "alibi_slopes: num_heads must be >= 1, got 0"),
    (lambda: alibi_slopes(2.0), TypeError, "alibi_slopes: num_heads must be an int, got float"),
    (lambda: alibi_bias(2, 0), ValueError, "alibi_bias: n_q must be >= 1, got 0"),
    (lambda: alibi_bias(2, 3, offset=-1), ValueError, "alibi_bias: offset must be >= 0, got -1"),
    (lambda: alibi_bias(2, 3, slopes=torch.ones(3)), ValueError,
     r"slopes must be a floating \[H\] = \[2\] tensor, got \[3\]"),
    (lambda: alibi_bias(2, 3, slopes=[0.5, 0.25]), TypeError, "alibi_bias: slopes must be a"),
])
def test_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()
