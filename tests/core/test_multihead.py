"""Tests for attn_course.core.multihead, against torch.nn.MultiheadAttention, SDPA and explicit loops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import causal_mask, padding_mask
from attn_course.core.multihead import MultiHeadAttention, merge_heads, split_heads
from attn_course.positions.rope import RotaryEmbedding

from helpers import FAST, close, randn, random_mask

E, H = 16, 4                      # model width and query heads used throughout
D = E // H                        # head size


def torch_attention(*, bias: bool = True, seed: int = 0, dtype=torch.float32) -> nn.MultiheadAttention:
    """A torch module in eval mode with random weights *and* biases (torch zeroes biases at init)."""
    torch.manual_seed(seed)
    module = nn.MultiheadAttention(E, H, bias=bias, batch_first=True).to(dtype)
    with torch.no_grad():
        for index, parameter in enumerate(module.parameters()):
            parameter.copy_(0.4 * randn(*parameter.shape, seed=100 + seed + index, dtype=dtype))
    return module.eval()


def pair(*, bias: bool = True, seed: int = 0, dtype=torch.float32):
    reference = torch_attention(bias=bias, seed=seed, dtype=dtype)
    return reference, MultiHeadAttention.from_torch(reference).eval()


def blocked(allowed: torch.Tensor) -> torch.Tensor:
    """Our mask (True = may attend) in torch's boolean convention (True = blocked)."""
    return ~allowed


# --- parity with torch.nn.MultiheadAttention -----------------------------------------------


def _self_attention():
    x = randn(2, 6, E, seed=1)
    return (x,), {}, (x, x, x), {}


def _cross_attention():
    query, key, value = randn(2, 5, E, seed=1), randn(2, 7, E, seed=2), randn(2, 7, E, seed=3)
    return (query, key, value), {}, (query, key, value), {}


def _boolean_mask():
    x = randn(2, 6, E, seed=1)
    allowed = random_mask(6, 6, seed=4)
    allowed[:, 2] = True                                             # no fully masked row
    return (x,), {"mask": allowed}, (x, x, x), {"attn_mask": blocked(allowed)}


def _boolean_mask_cross():
    query, key = randn(2, 5, E, seed=1), randn(2, 7, E, seed=2)
    allowed = random_mask(5, 7, seed=4)
    allowed[:, 0] = True
    return (query, key, key), {"mask": allowed}, (query, key, key), {"attn_mask": blocked(allowed)}


def _float_mask():
    x = randn(2, 6, E, seed=1)
    additive = randn(6, 6, seed=4)                                   # finite biases
    additive[random_mask(6, 6, p=0.3, seed=5)] = float("-inf")       # and some blocked pairs
    additive[:, 0] = 0.5
    return (x,), {"mask": additive}, (x, x, x), {"attn_mask": additive}


def _per_head_mask():
    x = randn(2, 6, E, seed=1)
    allowed = random_mask(2, H, 6, 6, seed=4)                        # [B, H, N_q, N_k]
    allowed[..., 1] = True
    # torch wants a 3-D attn_mask as [B·H, N_q, N_k], batch-major.
    return (x,), {"mask": allowed}, (x, x, x), {"attn_mask": blocked(allowed).reshape(2 * H, 6, 6)}


def _key_padding():
    x = randn(3, 6, E, seed=1)
    allowed = padding_mask([6, 2, 4], 6)                             # [B, 1, N]
    return (x,), {"mask": allowed}, (x, x, x), {"key_padding_mask": blocked(allowed[:, 0])}


def _key_padding_cross():
    query, key, value = randn(2, 5, E, seed=1), randn(2, 7, E, seed=2), randn(2, 7, E, seed=3)
    allowed = padding_mask([3, 7], 7)
    torch_kwargs = {"key_padding_mask": blocked(allowed[:, 0])}
    return (query, key, value), {"mask": allowed}, (query, key, value), torch_kwargs


def _causal():
    x = randn(2, 6, E, seed=1)
    upper = torch.ones(6, 6, dtype=torch.bool).triu(diagonal=1)      # torch: True = blocked
    return (x,), {"is_causal": True}, (x, x, x), {"attn_mask": upper}


def _causal_and_padding():
    x = randn(2, 6, E, seed=1)
    allowed = padding_mask([6, 3], 6)
    upper = torch.ones(6, 6, dtype=torch.bool).triu(diagonal=1)
    ours = {"is_causal": True, "mask": allowed}
    return (x,), ours, (x, x, x), {"attn_mask": upper, "key_padding_mask": blocked(allowed[:, 0])}


def _causal_and_float_padding():
    x = randn(2, 6, E, seed=1)
    additive = torch.zeros(2, 1, 6).masked_fill(~padding_mask([6, 3], 6), float("-inf"))
    upper = torch.ones(6, 6, dtype=torch.bool).triu(diagonal=1)
    ours = {"is_causal": True, "mask": additive}
    return (x,), ours, (x, x, x), {"attn_mask": upper, "key_padding_mask": additive[:, 0] == float("-inf")}


PARITY_CASES = [
    pytest.param(_self_attention, id="self-attention"),
    pytest.param(_cross_attention, id="cross-attention-longer-keys"),
    pytest.param(_boolean_mask, id="boolean-mask"),
    pytest.param(_boolean_mask_cross, id="boolean-mask-cross"),
    pytest.param(_float_mask, id="float-additive-mask"),
    pytest.param(_per_head_mask, id="per-head-mask"),
    pytest.param(_key_padding, id="key-padding"),
    pytest.param(_key_padding_cross, id="key-padding-cross"),
    pytest.param(_causal, id="is-causal"),
    pytest.param(_causal_and_padding, id="is-causal-and-padding"),
    pytest.param(_causal_and_float_padding, id="is-causal-and-additive-padding"),
]


@pytest.mark.parametrize("case", PARITY_CASES)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_matches_torch_multihead_attention(case, bias):
    our_args, our_kwargs, torch_args, torch_kwargs = case()
    reference, ours = pair(bias=bias)
    expected, expected_weights = reference(*torch_args, need_weights=True, **torch_kwargs)
    output, weights = ours(*our_args, **our_kwargs)
    assert output.shape == expected.shape
    assert weights.shape == (output.shape[0], H, output.shape[1], torch_args[1].shape[1])
    close(output, expected)
    close(weights.mean(dim=1), expected_weights)                      # torch averages heads


@pytest.mark.parametrize("case", PARITY_CASES)
def test_per_head_weights_match_torch_unaveraged_weights(case):
    our_args, our_kwargs, torch_args, torch_kwargs = case()
    reference, ours = pair()
    _, expected = reference(*torch_args, need_weights=True, average_attn_weights=False, **torch_kwargs)
    _, weights = ours(*our_args, **our_kwargs)
    close(weights, expected)


def test_float64_module_converts_to_float64_and_matches_torch_closely():
    reference, ours = pair(dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in ours.parameters())
    query, key = randn(2, 5, E, seed=1, dtype=torch.float64), randn(2, 7, E, seed=2, dtype=torch.float64)
    expected, expected_weights = reference(query, key, key, average_attn_weights=False)
    output, weights = ours(query, key, key)
    close(output, expected, 1e-12)
    close(weights, expected_weights, 1e-12)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_gradients_match_torch(bias):
    reference, ours = pair(bias=bias)
    query = randn(2, 5, E, seed=1).requires_grad_()
    key = randn(2, 7, E, seed=2).requires_grad_()
    allowed = padding_mask([7, 4], 7)
    upstream = randn(2, 5, E, seed=5)

    expected = reference(query, key, key, key_padding_mask=~allowed[:, 0], need_weights=False)[0]
    theirs = torch.autograd.grad(expected, (query, key, *reference.parameters()), upstream)
    output = ours(query, key, key, mask=allowed)[0]
    ours_params = [ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight, ours.out_proj.weight]
    if bias:
        ours_params += [ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias, ours.out_proj.bias]
    mine = torch.autograd.grad(output, (query, key, *ours_params), upstream)

    close(mine[0], theirs[0], 1e-5)                                  # d query
    close(mine[1], theirs[1], 1e-5)                                  # d key (= d value, one tensor)
    named = dict(zip((name for name, _ in reference.named_parameters()), theirs[2:]))
    close(torch.cat(mine[2:5]), named["in_proj_weight"])
    close(mine[5], named["out_proj.weight"])
    if bias:
        close(torch.cat(mine[6:9]), named["in_proj_bias"])
        close(mine[9], named["out_proj.bias"])


def test_from_torch_copies_every_parameter():
    reference, ours = pair()
    q_w, k_w, v_w = reference.in_proj_weight.detach().split(E)
    q_b, k_b, v_b = reference.in_proj_bias.detach().split(E)
    for mine, theirs in [(ours.q_proj.weight, q_w), (ours.k_proj.weight, k_w), (ours.v_proj.weight, v_w),
                         (ours.q_proj.bias, q_b), (ours.k_proj.bias, k_b), (ours.v_proj.bias, v_b),
                         (ours.out_proj.weight, reference.out_proj.weight),
                         (ours.out_proj.bias, reference.out_proj.bias)]:
        assert torch.equal(mine.detach(), theirs.detach())
    # A copy, not shared storage: changing ours leaves torch's module alone.
    with torch.no_grad():
        ours.q_proj.weight.zero_()
    assert torch.equal(reference.in_proj_weight[:E].detach(), q_w) and q_w.abs().sum() > 0


FROM_TORCH_BAD_MODULES = [
    pytest.param(lambda: nn.Linear(E, E), TypeError, "torch.nn.MultiheadAttention, got Linear",
                 id="not-multihead-attention"),
    pytest.param(lambda: nn.MultiheadAttention(E, H), ValueError, "batch_first=True", id="batch-first-false"),
    pytest.param(lambda: nn.MultiheadAttention(E, H, kdim=8, vdim=8, batch_first=True), ValueError,
                 "kdim and vdim", id="kdim-vdim-differ"),
    pytest.param(lambda: nn.MultiheadAttention(E, H, vdim=8, batch_first=True), ValueError, "kdim and vdim",
                 id="vdim-differs"),
    pytest.param(lambda: nn.MultiheadAttention(E, H, add_bias_kv=True, batch_first=True), ValueError,
                 "add_bias_kv", id="add-bias-kv"),
    pytest.param(lambda: nn.MultiheadAttention(E, H, add_zero_attn=True, batch_first=True), ValueError,
                 "add_zero_attn", id="add-zero-attn"),
]


@pytest.mark.parametrize(("build", "error", "fragment"), FROM_TORCH_BAD_MODULES)
def test_from_torch_rejects_modules_without_a_counterpart(build, error, fragment):
    with pytest.raises(error) as raised:
        MultiHeadAttention.from_torch(build())
    assert str(raised.value).startswith("MultiHeadAttention.from_torch:")
    assert fragment in str(raised.value)


# --- grouped-query and multi-query attention -----------------------------------------------


def full_heads_copy(gqa: MultiHeadAttention) -> MultiHeadAttention:
    """A plain H-head module whose key/value heads are the GQA ones, each repeated H / H_kv times."""
    kv_heads = gqa.num_kv_heads
    repeat = H // kv_heads
    bias = gqa.q_proj.bias is not None
    full = MultiHeadAttention(E, H, bias=bias).eval()
    with torch.no_grad():
        full.q_proj.load_state_dict(gqa.q_proj.state_dict())
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
        for mine, theirs in [(full.k_proj, gqa.k_proj), (full.v_proj, gqa.v_proj)]:
            weight = theirs.weight.view(kv_heads, D, E).repeat_interleave(repeat, dim=0)   # [H, d, E]
            mine.weight.copy_(weight.reshape(H * D, E))
            if bias:
                mine.bias.copy_(theirs.bias.view(kv_heads, D).repeat_interleave(repeat, dim=0).reshape(H * D))
    return full


def gqa_module(kv_heads: int, *, bias: bool = True, seed: int = 0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(E, H, num_kv_heads=kv_heads, bias=bias).eval()


@pytest.mark.parametrize("kv_heads", [1, 2], ids=["multi-query", "grouped-query"])
def test_grouped_projections_have_num_kv_heads_heads(kv_heads):
    attention = gqa_module(kv_heads)
    assert attention.q_proj.weight.shape == (E, E)
    assert attention.k_proj.weight.shape == (kv_heads * D, E)
    assert attention.v_proj.weight.shape == (kv_heads * D, E)
    assert attention.out_proj.weight.shape == (E, E)


def _gqa_masks(name: str):
    if name == "none":
        return {}
    if name == "causal":
        return {"is_causal": True}
    if name == "padding":
        return {"mask": padding_mask([6, 3], 6)}
    if name == "causal-and-padding":
        return {"mask": padding_mask([4, 6], 6), "is_causal": True}
    if name == "per-head":                                            # [B, H, N_q, N_k]
        allowed = random_mask(2, H, 6, 6, seed=7)
        allowed[..., 0] = True
        return {"mask": allowed}
    raise AssertionError(name)


@pytest.mark.parametrize("masks", ["none", "causal", "padding", "causal-and-padding", "per-head"])
@pytest.mark.parametrize("kv_heads", [1, 2], ids=["multi-query", "grouped-query"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_grouped_query_equals_full_attention_with_repeated_key_value_heads(kv_heads, masks, bias):
    attention = gqa_module(kv_heads, bias=bias)
    full = full_heads_copy(attention)
    x = randn(2, 6, E, seed=1)
    output, weights = attention(x, **_gqa_masks(masks))
    expected, expected_weights = full(x, **_gqa_masks(masks))
    assert weights.shape == (2, H, 6, 6)
    close(output, expected)
    close(weights, expected_weights)


@pytest.mark.parametrize("kv_heads", [1, 2], ids=["multi-query", "grouped-query"])
def test_grouped_query_cross_attention_equals_full_attention(kv_heads):
    attention = gqa_module(kv_heads)
    full = full_heads_copy(attention)
    query, key, value = randn(2, 5, E, seed=1), randn(2, 7, E, seed=2), randn(2, 7, E, seed=3)
    mask = padding_mask([7, 2], 7)
    output, weights = attention(query, key, value, mask=mask)
    expected, expected_weights = full(query, key, value, mask=mask)
    assert weights.shape == (2, H, 5, 7)
    close(output, expected)
    close(weights, expected_weights)


@pytest.mark.parametrize("kv_heads", [1, 2], ids=["multi-query", "grouped-query"])
def test_grouped_query_matches_sdpa_on_independently_projected_heads(kv_heads):
    attention = gqa_module(kv_heads)
    x = randn(2, 6, E, seed=1)
    with torch.no_grad():
        q = F.linear(x, attention.q_proj.weight, attention.q_proj.bias).view(2, 6, H, D)
        k = F.linear(x, attention.k_proj.weight, attention.k_proj.bias).view(2, 6, kv_heads, D)
        v = F.linear(x, attention.v_proj.weight, attention.v_proj.bias).view(2, 6, kv_heads, D)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)               # [B, heads, N, d]
        k, v = k.repeat_interleave(H // kv_heads, dim=1), v.repeat_interleave(H // kv_heads, dim=1)
        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)       # [B, H, N, d]
        expected = F.linear(heads.transpose(1, 2).reshape(2, 6, E), attention.out_proj.weight,
                            attention.out_proj.bias)
        output, _ = attention(x, is_causal=True)
    close(output, expected)


# --- split_heads / merge_heads --------------------------------------------------------------


@pytest.mark.parametrize(("batch", "tokens", "heads", "head_dim"), [(1, 1, 1, 1), (2, 3, 4, 2), (3, 5, 2, 3)])
def test_split_heads_puts_each_feature_slice_in_its_head(batch, tokens, heads, head_dim):
    x = randn(batch, tokens, heads * head_dim, seed=1)
    split = split_heads(x, heads)
    assert split.shape == (batch, heads, tokens, head_dim)
    for b in range(batch):
        for h in range(heads):
            for n in range(tokens):
                assert torch.equal(split[b, h, n], x[b, n, h * head_dim:(h + 1) * head_dim])


@pytest.mark.parametrize(("batch", "tokens", "heads", "head_dim"), [(2, 3, 4, 2), (1, 4, 3, 1)])
def test_merge_heads_concatenates_heads_along_features(batch, tokens, heads, head_dim):
    y = randn(batch, heads, tokens, head_dim, seed=1)
    merged = merge_heads(y)
    assert merged.shape == (batch, tokens, heads * head_dim)
    for b in range(batch):
        for n in range(tokens):
            assert torch.equal(merged[b, n], torch.cat([y[b, h, n] for h in range(heads)]))


@FAST
@given(
    batch=st.integers(1, 3),
    tokens=st.integers(1, 5),
    heads=st.integers(1, 4),
    head_dim=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_merge_heads_inverts_split_heads(batch, tokens, heads, head_dim, seed):
    x = randn(batch, tokens, heads * head_dim, seed=seed)
    assert torch.equal(merge_heads(split_heads(x, heads)), x)
    y = randn(batch, heads, tokens, head_dim, seed=seed + 1)
    assert torch.equal(split_heads(merge_heads(y), heads), y)


def test_split_heads_is_not_a_plain_view_to_the_target_shape():
    # The tempting x.view(B, H, N, d) has the right shape but mixes tokens into heads.
    x = randn(1, 3, 4, seed=1)
    assert not torch.equal(split_heads(x, 2), x.view(1, 2, 3, 2))


def test_split_heads_rejects_width_not_divisible_by_num_heads():
    with pytest.raises(ValueError, match=r"^split_heads: .*num_heads"):
        split_heads(randn(2, 3, 8), 3)


@pytest.mark.parametrize("call", [
    pytest.param(lambda: split_heads(randn(3, 8), 2), id="split-2d"),
    pytest.param(lambda: merge_heads(randn(2, 3, 8)), id="merge-3d"),
])
def test_split_and_merge_heads_reject_wrong_number_of_dimensions(call):
    with pytest.raises(ValueError, match=r"^(split|merge)_heads: x"):
        call()


# --- shapes, need_weights, dropout ----------------------------------------------------------


def test_need_weights_false_returns_none_and_the_same_output():
    torch.manual_seed(0)
    attention = MultiHeadAttention(E, H).eval()
    x = randn(2, 5, E, seed=1)
    output, weights = attention(x, is_causal=True, need_weights=False)
    assert weights is None
    assert torch.equal(output, attention(x, is_causal=True)[0])


def test_weight_rows_sum_to_one_and_respect_the_mask():
    torch.manual_seed(0)
    attention = MultiHeadAttention(E, H).eval()
    x = randn(2, 5, E, seed=1)
    _, weights = attention(x, mask=padding_mask([5, 2], 5), is_causal=True)
    close(weights.sum(dim=-1), torch.ones(2, H, 5))
    allowed = causal_mask(5) & padding_mask([5, 2], 5)              # [B, N, N]
    blocked_pairs = ~allowed.unsqueeze(1).expand_as(weights)         # [B, H, N, N]
    assert blocked_pairs.any()
    assert torch.equal(weights[blocked_pairs], torch.zeros(int(blocked_pairs.sum())))


def _same_weights(dropout: float) -> tuple[MultiHeadAttention, MultiHeadAttention]:
    torch.manual_seed(0)
    with_dropout = MultiHeadAttention(E, H, dropout=dropout)
    without = MultiHeadAttention(E, H, dropout=0.0)
    without.load_state_dict(with_dropout.state_dict())
    return with_dropout, without


def test_dropout_has_no_effect_in_eval_mode():
    with_dropout, without = _same_weights(0.5)
    with_dropout.eval(), without.eval()
    x = randn(2, 6, E, seed=1)
    torch.manual_seed(3)
    output, weights = with_dropout(x, is_causal=True)
    expected, expected_weights = without(x, is_causal=True)
    assert torch.equal(output, expected) and torch.equal(weights, expected_weights)


def test_dropout_in_train_mode_changes_the_output_deterministically_per_seed():
    with_dropout, without = _same_weights(0.5)
    x = randn(2, 6, E, seed=1)
    torch.manual_seed(3)
    first, _ = with_dropout(x, is_causal=True)
    torch.manual_seed(3)
    again, _ = with_dropout(x, is_causal=True)
    torch.manual_seed(4)
    other_seed, _ = with_dropout(x, is_causal=True)
    with_dropout.eval()
    evaluated, _ = with_dropout(x, is_causal=True)

    assert torch.equal(first, again)
    assert not torch.allclose(first, evaluated, atol=1e-3)
    assert not torch.allclose(first, other_seed, atol=1e-3)
    # Dropout off in a module with dropout=0 even while training.
    assert torch.equal(without(x, is_causal=True)[0], evaluated)


def test_dropout_drops_attention_weights_and_rescales_the_rest():
    # Reference: the same Bernoulli draw applied by hand to eval-mode weights.
    p = 0.5
    with_dropout, _ = _same_weights(p)
    x = randn(2, 6, E, seed=1)
    torch.manual_seed(3)
    output, _ = with_dropout(x, is_causal=True)
    torch.manual_seed(3)
    keep = F.dropout(torch.ones(2, H, 6, 6), p=p)                    # 0 or 1 / (1 - p)
    with torch.no_grad():
        with_dropout.eval()
        _, weights = with_dropout(x, is_causal=True)                  # [B, H, N, N]
        v = F.linear(x, with_dropout.v_proj.weight, with_dropout.v_proj.bias).view(2, 6, H, D).transpose(1, 2)
        heads = (weights * keep) @ v
        expected = with_dropout.out_proj(heads.transpose(1, 2).reshape(2, 6, E))
    close(output.detach(), expected)


def test_train_mode_dropout_matches_torch_under_the_same_seed():
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(E, H, dropout=0.5, batch_first=True)         # training mode
    ours = MultiHeadAttention.from_torch(reference)
    assert ours.training and ours.dropout == 0.5
    x = randn(2, 6, E, seed=1)
    torch.manual_seed(3)
    expected, _ = reference(x, x, x, need_weights=True)
    torch.manual_seed(3)
    output, _ = ours(x)
    close(output, expected)


# --- input checks ---------------------------------------------------------------------------


def sizes(embed_dim=16, num_heads=4, **rest) -> dict:
    return {"embed_dim": embed_dim, "num_heads": num_heads, **rest}


CONSTRUCTOR_BAD_ARGUMENTS = [
    pytest.param(sizes(10, 4), ValueError, "embed_dim=10 must be divisible by num_heads=4",
                 id="embed-dim-not-divisible"),
    pytest.param(sizes(num_kv_heads=3), ValueError, "num_heads=4 must be divisible by num_kv_heads=3",
                 id="heads-not-divisible-by-kv-heads"),
    pytest.param(sizes(num_kv_heads=8), ValueError, "num_heads=4 must be divisible by num_kv_heads=8",
                 id="more-kv-heads-than-heads"),
    pytest.param(sizes(16.0), TypeError, "embed_dim must be an int", id="float-embed-dim"),
    pytest.param(sizes(num_heads="4"), TypeError, "num_heads must be an int", id="str-num-heads"),
    pytest.param(sizes(num_heads=True), TypeError, "num_heads must be an int", id="bool-num-heads"),
    pytest.param(sizes(num_kv_heads=2.0), TypeError, "num_kv_heads must be an int", id="float-num-kv-heads"),
    pytest.param(sizes(0), ValueError, "embed_dim must be >= 1", id="zero-embed-dim"),
    pytest.param(sizes(num_heads=0), ValueError, "num_heads must be >= 1", id="zero-num-heads"),
    pytest.param(sizes(num_kv_heads=0), ValueError, "num_kv_heads must be >= 1", id="zero-num-kv-heads"),
    pytest.param(sizes(dropout=1.0), ValueError, "dropout", id="dropout-one"),
    pytest.param(sizes(dropout=-0.1), ValueError, "dropout", id="negative-dropout"),
    pytest.param(sizes(dropout=float("nan")), ValueError, "dropout", id="nan-dropout"),
    pytest.param(sizes(dropout="0.1"), TypeError, "dropout", id="str-dropout"),
    pytest.param(sizes(dropout=True), TypeError, "dropout", id="bool-dropout"),
    pytest.param(sizes(dropout=None), TypeError, "dropout", id="none-dropout"),
]


@pytest.mark.parametrize(("arguments", "error", "fragment"), CONSTRUCTOR_BAD_ARGUMENTS)
def test_constructor_rejects_bad_arguments_naming_them(arguments, error, fragment):
    with pytest.raises(error) as raised:
        MultiHeadAttention(**arguments)
    assert str(raised.value).startswith("MultiHeadAttention:")
    assert fragment in str(raised.value)


def _attention() -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(E, H).eval()


def allow(*shape: int) -> torch.Tensor:
    return torch.ones(*shape, dtype=torch.bool)


FORWARD_BAD_ARGUMENTS = [
    pytest.param(lambda m: m(randn(5, E)), ValueError, "query", id="query-2d"),
    pytest.param(lambda m: m(randn(1, 2, 5, E)), ValueError, "query", id="query-4d"),
    pytest.param(lambda m: m(randn(2, 5, E + 1)), ValueError, "query", id="query-wrong-width"),
    pytest.param(lambda m: m(torch.ones(2, 5, E, dtype=torch.long)), TypeError, "query", id="query-integer"),
    pytest.param(lambda m: m([[1.0] * E]), TypeError, "query", id="query-not-a-tensor"),
    pytest.param(lambda m: m(randn(2, 5, E), randn(2, 7, E)), ValueError, "key and value",
                 id="key-without-value"),
    pytest.param(lambda m: m(randn(2, 5, E), None, randn(2, 7, E)), ValueError, "key and value",
                 id="value-without-key"),
    pytest.param(lambda m: m(randn(2, 5, E), randn(3, 7, E), randn(3, 7, E)), ValueError, "key",
                 id="key-other-batch-size"),
    pytest.param(lambda m: m(randn(2, 5, E), randn(2, 7, E), randn(2, 6, E)), ValueError, "value",
                 id="value-other-length"),
    pytest.param(lambda m: m(randn(2, 5, E), randn(2, 7, E - 1), randn(2, 7, E - 1)), ValueError, "key",
                 id="key-wrong-width"),
    pytest.param(lambda m: m(randn(2, 5, E), mask=torch.ones(5, 6, dtype=torch.bool)), ValueError, "mask",
                 id="mask-one-key-too-many"),
    pytest.param(lambda m: m(randn(2, 5, E), mask=torch.ones(4, 5, dtype=torch.bool)), ValueError, "mask",
                 id="mask-wrong-query-count"),
    pytest.param(lambda m: m(randn(2, 5, E), mask=torch.ones(3, 5, 5, dtype=torch.bool)), ValueError, "mask",
                 id="mask-wrong-batch"),
    pytest.param(lambda m: m(randn(2, 5, E), mask=allow(2, 3, 5, 5)), ValueError, "mask",
                 id="mask-wrong-head-count"),
    pytest.param(lambda m: m(randn(2, 5, E), mask=torch.ones(5, dtype=torch.bool)), ValueError, "mask",
                 id="mask-1d"),
    pytest.param(lambda m: m(randn(2, 5, E), mask=allow(1, 2, H, 5, 5)), ValueError, "mask",
                 id="mask-5d"),
    pytest.param(lambda m: m(randn(2, 5, E), mask=torch.ones(5, 5, dtype=torch.long)), TypeError, "mask",
                 id="mask-integer"),
    pytest.param(lambda m: m(randn(2, 5, E), mask=[[True] * 5] * 5), TypeError, "mask",
                 id="mask-not-a-tensor"),
    pytest.param(lambda m: m(randn(2, 5, E), kv_cache={}), TypeError, "kv_cache", id="kv-cache-dict"),
]


@pytest.mark.parametrize(("call", "error", "fragment"), FORWARD_BAD_ARGUMENTS)
def test_forward_rejects_bad_inputs_naming_them(call, error, fragment):
    with pytest.raises(error) as raised:
        call(_attention())
    assert str(raised.value).startswith("MultiHeadAttention.forward:")
    assert fragment in str(raised.value)


def test_forward_rejected_for_its_mask_leaves_the_kv_cache_unchanged():
    attention, cache = _attention(), KVCache()
    attention(randn(2, 3, E), kv_cache=cache, is_causal=True)
    with pytest.raises(ValueError, match="mask"):
        attention(randn(2, 2, E), mask=torch.ones(2, 4, dtype=torch.bool), kv_cache=cache)   # N_k is 5
    assert len(cache) == 3


@pytest.mark.parametrize("call", [
    pytest.param(lambda m: m(randn(2, 5, E, dtype=torch.float64)), id="query-float64"),
    pytest.param(lambda m: m(randn(2, 5, E), randn(2, 5, E, dtype=torch.float64), randn(2, 5, E)),
                 id="key-float64"),
])
def test_forward_rejects_inputs_of_another_dtype_than_the_module(call):
    with pytest.raises(TypeError, match=r"^MultiHeadAttention.forward: (query|key)"):
        call(_attention())


@FAST
@given(
    tokens=st.integers(2, 7),
    cut=st.integers(1, 6),
    kv_heads=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**31 - 1),
)
def test_causal_module_output_before_a_change_ignores_the_changed_future(tokens, cut, kv_heads, seed):
    cut = min(cut, tokens - 1)
    torch.manual_seed(seed)
    module = MultiHeadAttention(8, 4, num_kv_heads=kv_heads).eval()
    x = torch.randn(2, tokens, 8)
    changed = x.clone()
    changed[:, cut:] = torch.randn(2, tokens - cut, 8)
    with torch.no_grad():
        before, _ = module(x, is_causal=True)
        after, _ = module(changed, is_causal=True)
    torch.testing.assert_close(before[:, :cut], after[:, :cut], atol=1e-6, rtol=1e-6)


@FAST
@given(lengths=st.lists(st.integers(1, 5), min_size=1, max_size=3), seed=st.integers(0, 2**31 - 1))
def test_padded_tokens_do_not_change_the_real_tokens_outputs(lengths, seed):
    torch.manual_seed(seed)
    module = MultiHeadAttention(8, 2).eval()
    n = max(lengths) + 2
    x = torch.randn(len(lengths), n, 8)
    other_padding = x.clone()
    for b, length in enumerate(lengths):
        other_padding[b, length:] = torch.randn(n - length, 8)
    mask = padding_mask(lengths, n)
    with torch.no_grad():
        first, weights = module(x, mask=mask)
        second, _ = module(other_padding, mask=mask)
    for b, length in enumerate(lengths):
        torch.testing.assert_close(first[b, :length], second[b, :length], atol=1e-6, rtol=1e-6)
        assert torch.all(weights[b, :, :, length:] == 0)


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("new_tokens", [20, 1], ids=["prompt", "decode"])
def test_flash_backend_matches_plain_attention_with_a_cache(kv_heads, new_tokens):
    # The Triton kernel (here in its interpreter) reads grouped K/V in place and decodes one
    # token by splitting the cache; the module's output must be the plain path's.
    pytest.importorskip("triton")
    import attn_course.flash.backend  # noqa: F401  (registers "flash")

    torch.manual_seed(0)
    plain = MultiHeadAttention(64, 4, num_kv_heads=kv_heads, rope=RotaryEmbedding(16), attention_backend="eager")
    fused = MultiHeadAttention(64, 4, num_kv_heads=kv_heads, rope=RotaryEmbedding(16), attention_backend="flash")
    fused.load_state_dict(plain.state_dict())
    prompt, step = torch.randn(2, 30, 64), torch.randn(2, new_tokens, 64)
    outputs = []
    for module in (plain, fused):
        cache = KVCache()
        module(prompt, is_causal=True, kv_cache=cache, need_weights=False)
        outputs.append(module(step, is_causal=True, kv_cache=cache, need_weights=False)[0])
    assert fused.extra_repr().endswith("attention_backend='flash'")
    torch.testing.assert_close(outputs[1], outputs[0], atol=2e-6, rtol=0)


def test_flash_backend_named_refuses_what_the_kernel_cannot_do():
    pytest.importorskip("triton")
    import attn_course.flash.backend  # noqa: F401  (registers "flash")

    module = MultiHeadAttention(48, 4, attention_backend="flash")       # head size 12
    x = torch.randn(1, 5, 48)
    with pytest.raises(ValueError, match=r"attention_backend='flash', but this call has need_weights=True .*; "
                                         r"head size E / H = 12, not one of \(16, 32, 64, 128\)"):
        module(x)
    with pytest.raises(TypeError, match="attention_backend must be a str"):
        MultiHeadAttention(48, 4, attention_backend=True)


def test_flash_backend_is_not_used_on_a_cpu_by_default(monkeypatch):
    pytest.importorskip("triton")
    from attn_course.flash import backend

    monkeypatch.setattr(backend, "flash_attention", lambda *a, **k: pytest.fail("kernel used"))
    module = MultiHeadAttention(64, 4, num_kv_heads=2)
    module(torch.randn(1, 5, 64), is_causal=True, need_weights=False)
