"""Transformer blocks, checked against torch.nn.TransformerEncoderLayer (bidirectional and causal)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import padding_mask
from attn_course.core.multihead import MultiHeadAttention
from attn_course.core.transformer import DecoderBlock, EncoderBlock, FeedForward


def torch_layer_and_ours(norm_first: bool, seed: int = 0, block=DecoderBlock, eps: float = 1e-5):
    """A torch encoder layer and one of our blocks holding the same weights.

    The LayerNorms get random weights and biases, so that swapping the two would show.
    """
    torch.manual_seed(seed)
    reference = nn.TransformerEncoderLayer(
        d_model=16,
        nhead=4,
        dim_feedforward=32,
        dropout=0.0,
        activation="gelu",
        layer_norm_eps=eps,
        batch_first=True,
        norm_first=norm_first,
    ).eval()
    with torch.no_grad():
        for norm in (reference.norm1, reference.norm2):
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
    if block is EncoderBlock:
        ours = EncoderBlock(16, 4, ffn_dim=32, norm_first=norm_first, norm_eps=eps).eval()
    else:
        ours = DecoderBlock(16, 4, ffn_dim=32, norm_first=norm_first).eval()
    with torch.no_grad():
        ours.self_attention.load_state_dict(MultiHeadAttention.from_torch(reference.self_attn).state_dict())
        ours.feed_forward.up.load_state_dict(reference.linear1.state_dict())
        ours.feed_forward.down.load_state_dict(reference.linear2.state_dict())
        ours.norm_self.load_state_dict(reference.norm1.state_dict())
        ours.norm_ffn.load_state_dict(reference.norm2.state_dict())
    return reference, ours


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-LN", "post-LN"])
def test_decoder_block_equals_torch_encoder_layer_with_causal_mask(norm_first):
    reference, ours = torch_layer_and_ours(norm_first)
    x = torch.randn(2, 7, 16)
    future = torch.ones(7, 7, dtype=torch.bool).triu(1)  # torch: True = blocked
    with torch.no_grad():
        expected = reference(x, src_mask=future)
        got, _ = ours(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)



@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_encoder_block_equals_torch_encoder_layer(norm_first):
    reference, ours = torch_layer_and_ours(norm_first, block=EncoderBlock)
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        expected = reference(x)
        got, _ = ours(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_encoder_block_with_padding_equals_torch_at_real_tokens(norm_first):
    reference, ours = torch_layer_and_ours(norm_first, seed=1, block=EncoderBlock, eps=1e-12)
    x = torch.randn(3, 6, 16)
    lengths = [6, 4, 1]
    real = padding_mask(lengths, 6)[:, 0]                         # [B, N], True = token
    with torch.no_grad():
        expected = reference(x, src_key_padding_mask=~real)         # torch: True = padding
        from_key_padding, _ = ours(x, key_padding_mask=real.long())  # Hugging Face style 1/0
        from_mask, _ = ours(x, mask=padding_mask(lengths, 6))       # [B, 1, N]
    torch.testing.assert_close(from_key_padding[real], expected[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(from_mask, from_key_padding)


def test_encoder_block_post_ln_is_the_default_and_eps_reaches_both_norms():
    block = EncoderBlock(16, 4, norm_eps=1e-12)
    assert block.norm_first is False
    assert block.norm_self.eps == block.norm_ffn.eps == 1e-12


def test_encoder_block_weights_ignore_padded_keys_and_rows_sum_to_one():
    torch.manual_seed(0)
    block = EncoderBlock(16, 4).eval()
    real = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    with torch.no_grad():
        _, weights = block(torch.randn(2, 5, 16), key_padding_mask=real, need_weights=True)
    assert weights.shape == (2, 4, 5, 5)
    assert torch.all(weights[1, :, :, 2:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))


def test_encoder_block_is_bidirectional():
    torch.manual_seed(0)
    block = EncoderBlock(16, 4).eval()
    x = torch.randn(1, 6, 16)
    changed = x.clone()
    changed[:, -1] += 1.0
    with torch.no_grad():
        assert not torch.allclose(block(x)[0][:, 0], block(changed)[0][:, 0])


def test_encoder_block_sequence_of_only_padding_gives_zeros_not_nan():
    torch.manual_seed(0)
    block = EncoderBlock(16, 4).eval()
    real = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]])
    with torch.no_grad():
        y, weights = block(torch.randn(2, 4, 16), key_padding_mask=real, need_weights=True)
    assert torch.isfinite(y).all()
    assert torch.all(weights[1] == 0)


def test_encoder_block_combines_an_additive_mask_with_key_padding():
    torch.manual_seed(0)
    block = EncoderBlock(16, 4).eval()
    x = torch.randn(2, 5, 16)
    real = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    no_first_key = torch.zeros(5, 5)
    no_first_key[:, 0] = float("-inf")
    allowed = real[:, None, :] & (torch.arange(5) != 0)                # [B, 1, N]
    with torch.no_grad():
        _, combined = block(x, mask=no_first_key, key_padding_mask=real, need_weights=True)
        _, expected = block(x, mask=allowed, need_weights=True)
    torch.testing.assert_close(combined, expected)


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"x": torch.randn(2, 5, 8)}, ValueError, "x must be"),
        ({"x": torch.randn(2, 5, 16).long()}, TypeError, "x must be a floating"),
        ({"key_padding_mask": torch.ones(2, 4)}, ValueError, r"key_padding_mask must be \[B, N\] = \[2, 5\]"),
        ({"key_padding_mask": torch.full((2, 5), 2)}, ValueError, "only 0 .padding. and 1"),
        ({"mask": torch.ones(3, 3, dtype=torch.bool)}, ValueError, "mask of shape"),
    ],
)
def test_encoder_block_bad_inputs_name_the_argument(kwargs, error, fragment):
    block = EncoderBlock(16, 4)
    x = kwargs.pop("x", torch.randn(2, 5, 16))
    with pytest.raises(error, match=fragment):
        block(x, **kwargs)

def test_feed_forward_is_two_linear_layers_around_exact_gelu():
    torch.manual_seed(0)
    ffn = FeedForward(8, 24)
    x = torch.randn(3, 5, 8)
    expected = F.linear(F.gelu(F.linear(x, ffn.up.weight, ffn.up.bias)), ffn.down.weight, ffn.down.bias)
    torch.testing.assert_close(ffn(x), expected)
    relu = FeedForward(8, 24, activation="relu")
    assert torch.all(relu.up(x).clamp_min(0) @ relu.down.weight.T + relu.down.bias == relu(x))


def test_decoder_block_output_at_i_ignores_later_tokens():
    torch.manual_seed(0)
    block = DecoderBlock(16, 4).eval()
    x = torch.randn(1, 9, 16)
    changed = x.clone()
    changed[:, 5:] = torch.randn(1, 4, 16)
    with torch.no_grad():
        torch.testing.assert_close(block(x)[0][:, :5], block(changed)[0][:, :5])
        assert not torch.allclose(block(x)[0][:, 5:], block(changed)[0][:, 5:])


def test_decoding_with_a_cache_equals_one_causal_pass():
    torch.manual_seed(0)
    block = DecoderBlock(16, 4, num_kv_heads=2).eval()
    x = torch.randn(2, 6, 16)
    cache = KVCache()
    with torch.no_grad():
        full, _ = block(x)
        pieces = [block(x[:, :2], kv_cache=cache)[0]] + [block(x[:, i : i + 1], kv_cache=cache)[0] for i in range(2, 6)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


def test_cross_attention_reads_the_memory():
    torch.manual_seed(0)
    block = DecoderBlock(16, 4, cross_attention=True).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 3, 16)
    with torch.no_grad():
        first, _ = block(x, memory=memory)
        second, _ = block(x, memory=memory + 1)
    assert first.shape == (2, 5, 16) and not torch.allclose(first, second)


def test_memory_required_exactly_for_cross_attention_blocks():
    with pytest.raises(ValueError, match="memory is required"):
        DecoderBlock(16, 4, cross_attention=True)(torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match="memory is required"):
        DecoderBlock(16, 4)(torch.randn(1, 3, 16), memory=torch.randn(1, 2, 16))


def test_need_weights_returns_causal_per_head_weights():
    block = DecoderBlock(16, 4).eval()
    _, weights = block(torch.randn(2, 5, 16), need_weights=True)
    assert weights.shape == (2, 4, 5, 5)
    assert torch.all(weights.triu(1) == 0)


@pytest.mark.parametrize(
    "build, error, fragment",
    [
        (lambda: FeedForward(0, 4), ValueError, "embed_dim"),
        (lambda: FeedForward(4, 4, activation="tanh"), ValueError, "activation"),
        (lambda: FeedForward(4, 4, dropout=1.0), ValueError, "dropout"),
        (lambda: DecoderBlock(16, 4, dropout="0.1"), TypeError, "dropout"),
        (lambda: DecoderBlock(15, 4), ValueError, "divisible"),
        (lambda: EncoderBlock(15, 4), ValueError, "divisible"),
        (lambda: EncoderBlock(16, 4, norm_eps=0), ValueError, "norm_eps"),
        (lambda: EncoderBlock(16, 4, ffn_dim=0), ValueError, "ffn_dim"),
        (lambda: EncoderBlock(16, 4, attention_dropout=1.5), ValueError, "dropout"),
        (lambda: EncoderBlock(16, 4, activation="swish"), ValueError, "activation"),
        (lambda: DecoderBlock(16, 4, ffn_dim=0), ValueError, "DecoderBlock: ffn_dim must be >= 1, got 0"),
        (lambda: DecoderBlock(16, 4, ffn_dim=32.0), TypeError, "DecoderBlock: ffn_dim must be an int"),
        (lambda: DecoderBlock(16, 4, cross_attention="yes"), TypeError, "DecoderBlock: cross_attention must be a bool"),
        (lambda: DecoderBlock(16, 4, norm_first=1), TypeError, "DecoderBlock: norm_first must be a bool"),
        (lambda: EncoderBlock(16, 4, norm_first=None), TypeError, "EncoderBlock: norm_first must be a bool"),
    ],
)
def test_bad_configuration_raises_with_the_argument_named(build, error, fragment):
    with pytest.raises(error, match=fragment):
        build()


def test_decoder_block_default_ffn_is_four_times_the_width():
    assert DecoderBlock(16, 4).feed_forward.up.out_features == 64


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda b: b(torch.randn(2, 5, 12)), ValueError, r"DecoderBlock.forward: x must be \[B, N, E\] with E = "),
        (lambda b: b(torch.randn(2, 5, 16).double()), TypeError, "DecoderBlock.forward: x has dtype torch.float64"),
        (lambda b: b(torch.zeros(2, 5, 16, dtype=torch.long)), TypeError, "DecoderBlock.forward: x must be a floating"),
        (lambda b: b(torch.randn(2, 5, 16), memory=torch.randn(2, 3, 8)), ValueError, "DecoderBlock.forward: memory"),
    ],
)
def test_decoder_block_names_itself_for_bad_inputs(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call(DecoderBlock(16, 4, cross_attention=True))


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"mask": torch.ones(3, 5, 5, dtype=torch.bool)}, ValueError, r"mask of shape \[3, 1, 5, 5\]"),
        ({"mask": torch.ones(5, 5, dtype=torch.long)}, TypeError, "mask must be boolean or floating"),
        ({"key_padding_mask": torch.ones(2, 4)}, ValueError, r"key_padding_mask must be \[B, N\]"),
        ({"key_padding_mask": torch.full((2, 5), 2)}, ValueError, "key_padding_mask must hold only 0"),
    ],
)
def test_encoder_block_masks_are_checked_under_its_own_name(kwargs, error, fragment):
    with pytest.raises(error, match="EncoderBlock.forward: " + fragment):
        EncoderBlock(16, 4)(torch.randn(2, 5, 16), **kwargs)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_decoder_block_with_cross_attention_equals_torch_decoder_layer(norm_first):
    # The decoder of "Attention Is All You Need": causal self-attention, cross-attention to
    # the encoder's output (with its padding), feed-forward; compared with PyTorch's own layer.
    torch.manual_seed(3)
    reference = nn.TransformerDecoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=norm_first).eval()
    with torch.no_grad():
        for norm in (reference.norm1, reference.norm2, reference.norm3):
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
    ours = DecoderBlock(16, 4, ffn_dim=32, cross_attention=True, norm_first=norm_first).eval()
    with torch.no_grad():
        ours.self_attention.load_state_dict(MultiHeadAttention.from_torch(reference.self_attn).state_dict())
        ours.cross_attention.load_state_dict(MultiHeadAttention.from_torch(reference.multihead_attn).state_dict())
        ours.feed_forward.up.load_state_dict(reference.linear1.state_dict())
        ours.feed_forward.down.load_state_dict(reference.linear2.state_dict())
        ours.norm_self.load_state_dict(reference.norm1.state_dict())
        ours.norm_cross.load_state_dict(reference.norm2.state_dict())
        ours.norm_ffn.load_state_dict(reference.norm3.state_dict())
    x, memory = torch.randn(2, 6, 16), torch.randn(2, 9, 16)
    memory_padding = torch.tensor([[False] * 9, [False] * 6 + [True] * 3])     # torch: True = padding
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    with torch.no_grad():
        expected = reference(x, memory, tgt_mask=future, memory_key_padding_mask=memory_padding)
        got, _ = ours(x, memory=memory, memory_mask=padding_mask(torch.tensor([9, 6]), 9))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
