"""QK-norm and a head size of its own in the core's MultiHeadAttention (Qwen3's attention), against float64 formulas."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.core.kv_cache import KVCache
from attn_course.core.multihead import MultiHeadAttention
from attn_course.core.qk_norm import HeadNormLinear
from attn_course.positions.rope import RotaryEmbedding


def rms_normalised(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def qwen3_attention(heads: int = 4, kv_heads: int = 2, head_dim: int = 12, seed: int = 0) -> MultiHeadAttention:
    """E = 16 but H · d = 48; norms' weights away from 1, biases on."""
    torch.manual_seed(seed)
    attention = MultiHeadAttention(16, heads, num_kv_heads=kv_heads, head_dim=head_dim, bias=True, qk_norm=True,
                                   qk_norm_eps=1e-6, rope=RotaryEmbedding(head_dim)).eval()
    with torch.no_grad():
        for projection in (attention.q_proj, attention.k_proj):
            projection.norm.weight.normal_(1.0, 0.3)
    return attention


def test_each_heads_query_and_key_are_normalised_before_rope_as_the_formula_says():
    attention = qwen3_attention()
    heads, kv_heads, d = 4, 2, 12
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    wide = {name: getattr(attention, name) for name in ("q_proj", "k_proj", "v_proj", "out_proj")}
    p = {name: (m.weight.double(), m.bias.double()) for name, m in wide.items()}
    q = (x @ p["q_proj"][0].T + p["q_proj"][1]).unflatten(-1, (heads, d)).transpose(1, 2)      # [B, H, N, d]
    k = (x @ p["k_proj"][0].T + p["k_proj"][1]).unflatten(-1, (kv_heads, d)).transpose(1, 2)   # [B, H_kv, N, d]
    v = (x @ p["v_proj"][0].T + p["v_proj"][1]).unflatten(-1, (kv_heads, d)).transpose(1, 2)
    q = rms_normalised(q, attention.q_proj.norm.weight.double(), 1e-6)
    k = rms_normalised(k, attention.k_proj.norm.weight.double(), 1e-6)
    rope = RotaryEmbedding(d)
    positions = torch.arange(5)
    q, k = rope(q, positions), rope(k, positions)
    k, v = k.repeat_interleave(heads // kv_heads, dim=1), v.repeat_interleave(heads // kv_heads, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -math.inf)
    expected = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2) @ p["out_proj"][0].T + p["out_proj"][1]
    output, _ = attention(x.float(), is_causal=True)
    assert output.shape == (2, 5, 16)
    assert (output.double() - expected).abs().max().item() < 1e-5


def test_decoding_with_a_cache_gives_the_full_pass_the_keys_are_stored_normalised():
    attention = qwen3_attention(seed=1)
    x = torch.randn(1, 7, 16)
    full, _ = attention(x, is_causal=True)
    cache, steps = KVCache(), []
    for t in range(7):
        steps.append(attention(x[:, t:t + 1], is_causal=True, kv_cache=cache)[0])
    assert (torch.cat(steps, dim=1) - full).abs().max().item() < 1e-5


def test_without_qk_norm_the_projections_are_plain_and_drawn_as_before():
    torch.manual_seed(2)
    before = MultiHeadAttention(16, 4, num_kv_heads=2)
    torch.manual_seed(2)
    now = MultiHeadAttention(16, 4, num_kv_heads=2, head_dim=4, qk_norm=False)
    assert type(now.q_proj) is torch.nn.Linear
    assert all(torch.equal(a, b) for a, b in zip(before.state_dict().values(), now.state_dict().values()))
    wide = MultiHeadAttention(16, 4, head_dim=8)
    assert (wide.q_proj.weight.shape, wide.out_proj.weight.shape) == ((32, 16), (16, 32))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(head_dim=0), ValueError, "MultiHeadAttention: head_dim must be >= 1, got 0"),
    (dict(qk_norm=1), TypeError, "MultiHeadAttention: qk_norm must be a bool, got int"),
    (dict(qk_norm=True, qk_norm_eps=0.0), ValueError, "MultiHeadAttention: qk_norm_eps must be a positive"),
    (dict(head_dim=6, rope=RotaryEmbedding(4)), ValueError, "rope.head_dim=4 must equal head_dim = 6"),
])
def test_bad_head_sizes_and_norms_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        MultiHeadAttention(16, 4, **kwargs)


def test_head_norm_linear_names_its_bad_sizes():
    with pytest.raises(ValueError, match="HeadNormLinear: head_dim must be >= 1, got 0"):
        HeadNormLinear(16, num_heads=2, head_dim=0)
    with pytest.raises(TypeError, match="HeadNormLinear: bias must be a bool"):
        HeadNormLinear(16, num_heads=2, head_dim=4, bias=None)
