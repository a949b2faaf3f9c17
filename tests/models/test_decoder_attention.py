"""DecoderAttention against the formulas, in float64: learned sinks, the window, the gate; its config's checks.

(tests/models/test_convert_layer.py checks it against Hugging Face's own layers.)
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attn_course.core.norms import GemmaRMSNorm
from attn_course.models.decoder_attention import DecoderAttention, DecoderAttentionConfig

E, H, H_KV, D, N = 32, 4, 2, 8, 7


def random_attention(**options) -> DecoderAttention:
    torch.manual_seed(0)
    attention = DecoderAttention(DecoderAttentionConfig(E, H, H_KV, D, **options)).double()
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.copy_(torch.randn_like(parameter) * (1.0 if parameter.dim() == 1 else 0.3))
    return attention


def reference(attention: DecoderAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The formulas head by head and query by query, written from the definitions (float64)."""
    c = attention.config
    def project(module, heads):                                        # x W + b, then each head's norm, written out
        out = torch.nn.functional.linear(x, module.weight, module.bias).unflatten(-1, (heads, D))   # [B, N, h, d]
        norm = getattr(module, "norm", None)
        if norm is None:
            return out
        wide = out.float()                                             # the norms compute in float32, as HF's
        normalised = wide * (wide.pow(2).mean(-1, keepdim=True) + norm.eps).rsqrt()
        if c.qk_norm == "gemma":                                       # the weight as 1 + w, cast back afterwards
            return (normalised * (1.0 + norm.weight.float())).to(out.dtype)
        return norm.weight * normalised.to(out.dtype)                  # cast back, then the weight

    q, k, v = project(attention.q_proj, H), project(attention.k_proj, H_KV), project(attention.v_proj, H_KV)
    positions = torch.arange(x.shape[1])
    q = attention.rope(q.transpose(1, 2), positions)                   # [B, H, N, d]
    k = attention.rope(k.transpose(1, 2), positions)
    v = v.transpose(1, 2)
    weights = torch.zeros(x.shape[0], H, N, N, dtype=x.dtype)
    for head in range(H):
        kv = head // (H // H_KV)                                       # query heads share a key/value head in turn
        for i in range(N):
            seen = [j for j in range(i + 1) if c.window is None or i - j < c.window]
            scores = (q[:, head, i, None] * k[:, kv, seen]).sum(-1) * c.softmax_scale   # [B, keys seen]
            denominator = scores.exp().sum(-1)                         # [B]
            if attention.sinks is not None:
                denominator = denominator + attention.sinks[head].exp()
            weights[:, head, i, seen] = scores.exp() / denominator[:, None]
    heads = weights @ v.repeat_interleave(H // H_KV, dim=1)             # [B, H, N, d]
    merged = heads.transpose(1, 2).flatten(2)                           # [B, N, H·d]
    if attention.gate_proj is not None:
        merged = merged * torch.sigmoid(attention.gate_proj(x))
    return attention.o_proj(merged), weights


@pytest.mark.parametrize("options", [
    dict(), dict(sinks=True), dict(window=3), dict(output_gate=True, bias=True), dict(qk_norm="rms", scale=0.2),
    dict(qk_norm="gemma", rotary_fraction=0.5), dict(sinks=True, window=2, output_gate=True, bias=True),
], ids=str)
def test_matches_the_formulas_in_float64(options):
    attention = random_attention(**options)
    x = torch.randn(2, N, E, dtype=torch.float64)
    with torch.no_grad():
        (output, weights), (expected, expected_weights) = attention(x), reference(attention, x)
    assert torch.allclose(weights, expected_weights, atol=1e-12)
    assert torch.allclose(output, expected, atol=1e-12)


def test_a_learned_sink_takes_its_share_of_each_row_and_nothing_else():
    attention = random_attention(sinks=True)
    x = torch.randn(1, N, E, dtype=torch.float64)
    with torch.no_grad():
        _, weights = attention(x)
        first_row_sink_share = 1 - weights[0, :, 0, 0]                  # query 0 sees key 0 and the sink
        q = attention.q_proj(x)[0, 0].view(H, D)                         # position 0: RoPE is the identity
        k = attention.k_proj(x)[0, 0].view(H_KV, D).repeat_interleave(H // H_KV, dim=0)
        score = (q * k).sum(-1) / math.sqrt(D)                           # [H]
        expected = attention.sinks.exp() / (attention.sinks.exp() + score.exp())
    assert torch.allclose(first_row_sink_share, expected, atol=1e-12)
    assert bool((weights.sum(-1) < 1).all())


def test_gemma_rms_norm_scales_by_one_plus_its_weight():
    norm = GemmaRMSNorm(4, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([0.0, 1.0, -0.5, 2.0]))
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    rms = math.sqrt((1 + 4 + 9 + 0.25) / 4 + 1e-6)
    expected = torch.tensor([[1 / rms, -2 / rms * 2, 3 / rms * 0.5, 0.5 / rms * 3]])
    assert torch.allclose(norm(x), expected, atol=1e-6)
    assert norm(x.half()).dtype == torch.float16
    with pytest.raises(ValueError, match=r"x must be \[..., E\] with E = 4"):
        norm(torch.ones(3))
    with pytest.raises(TypeError, match="dim must be an int"):
        GemmaRMSNorm(4.0)


@pytest.mark.parametrize(("change", "error", "message"), [
    (dict(num_kv_heads=3), ValueError, "num_heads=4 must be divisible by num_kv_heads=3"),
    (dict(head_dim=0), ValueError, "head_dim must be >= 1"),
    (dict(hidden_size=32.0), TypeError, "hidden_size must be an int"),
    (dict(window=0), ValueError, "window must be >= 1"),
    (dict(qk_norm="layer"), ValueError, "qk_norm must be one of None, 'rms', 'gemma'"),
    (dict(sinks=1), TypeError, "sinks must be a bool"),
    (dict(scale=-1.0), ValueError, "scale must be a positive finite number"),
    (dict(rope_scaling=2.0), TypeError, "rope_scaling must be None or one of LinearScaling"),
    (dict(rotary_fraction=0.1), ValueError, "rotary_fraction must be in \\(0, 1\\] and rotate an even number"),
])
def test_config_errors_name_the_field(change, error, message):
    fields = dict(hidden_size=E, num_heads=H, num_kv_heads=H_KV, head_dim=D)
    with pytest.raises(error, match=f"DecoderAttentionConfig: {message}"):
        DecoderAttentionConfig(**{**fields, **change})


def test_module_and_input_errors_name_the_argument():
    with pytest.raises(TypeError, match="DecoderAttention: config must be a DecoderAttentionConfig, got dict"):
        DecoderAttention({"hidden_size": E})
    attention = DecoderAttention(DecoderAttentionConfig(E, H, H_KV, D))
    with pytest.raises(ValueError, match=r"DecoderAttention.forward: x must be \[B, N, E\] .* got shape \[1, 0, 32\]"):
        attention(torch.ones(1, 0, E))
    with pytest.raises(TypeError, match="DecoderAttention.forward: x must be a torch.Tensor, got list"):
        attention([[0.0] * E])
    config = DecoderAttentionConfig(E, H, H_KV, D)
    assert dataclasses.replace(config, window=5).window == 5 and config.groups == 2
