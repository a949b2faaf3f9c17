"""norm_attribution and value_norms against an independent float64 computation, one head at a time."""

from __future__ import annotations

import math
import os

import pytest
import torch

from attn_course import MultiHeadAttention
from attn_course.core.multihead import split_heads
from attn_course.models.bert import (
    BertConfig,
    BertModel,
    attention_share,
    load_pretrained,
    norm_attribution,
    value_norms,
)

pytestmark = pytest.mark.slow

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def small_model() -> BertModel:
    """A random 2-layer BERT in float64, biases and LayerNorms random too."""
    config = BertConfig(vocab_size=40, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                        intermediate_size=24, max_position_embeddings=16)
    torch.manual_seed(0)
    model = BertModel(config).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5)
    return model


@pytest.fixture(scope="module")
def inputs():
    ids = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(1))    # [B, N]
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0                                                                     # padding in row 1
    return ids, mask


@torch.no_grad()
def head_vector(attention, x, b, h, j):
    """``f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h``, from the parameters, for one token of one sequence."""
    d = attention.head_dim
    rows = slice(h * d, (h + 1) * d)
    value = attention.v_proj.weight[rows] @ x[b, j] + attention.v_proj.bias[rows]      # [d]
    return attention.out_proj.weight[:, rows] @ value                                   # [E]


@torch.no_grad()
def head_weights(attention, x, b, h, real):
    """``α_ij`` of one head by explicit softmax over the real keys, ``[N, N]``."""
    d = attention.head_dim
    rows = slice(h * d, (h + 1) * d)
    q = x[b] @ attention.q_proj.weight[rows].T + attention.q_proj.bias[rows]            # [N, d]
    k = x[b] @ attention.k_proj.weight[rows].T + attention.k_proj.bias[rows]            # [N, d]
    n = x.shape[1]
    alpha = torch.zeros(n, n, dtype=x.dtype)
    for i in range(n):
        scores = [float(q[i] @ k[j]) / math.sqrt(d) if real[j] else -math.inf for j in range(n)]
        top = max(scores)
        exps = [math.exp(s - top) for s in scores]
        for j in range(n):
            alpha[i, j] = exps[j] / sum(exps)
    return alpha


def layer_inputs(model, ids, mask):
    """Each layer's input, by running the embeddings and the blocks one at a time."""
    with torch.no_grad():
        x = model.embeddings(ids, torch.zeros_like(ids))                               # [B, N, E]
        inputs = []
        for layer in model.layers:
            inputs.append(x)
            x, _ = layer(x, key_padding_mask=mask)
    return inputs


def test_contributions_equal_weight_times_norm_computed_head_by_head(small_model, inputs):
    ids, mask = inputs
    found = norm_attribution(small_model, ids, mask)
    assert len(found.weights) == len(found.value_norms) == len(found.contributions) == 2
    for layer, (block, x) in enumerate(zip(small_model.layers, layer_inputs(small_model, ids, mask))):
        attention = block.self_attention
        for b in range(2):
            for h in range(3):
                alpha = head_weights(attention, x, b, h, mask[b].bool())
                for j in range(7):
                    norm = head_vector(attention, x, b, h, j).norm()
                    assert found.value_norms[layer][b, h, j].item() == pytest.approx(norm.item(), rel=1e-12)
                    for i in range(7):
                        assert found.weights[layer][b, h, i, j].item() == pytest.approx(alpha[i, j].item(), abs=1e-12)
                        expected = alpha[i, j] * norm
                        assert found.contributions[layer][b, h, i, j].item() == pytest.approx(expected.item(),
                                                                                          rel=1e-10, abs=1e-14)


def test_head_vectors_weighted_and_summed_give_the_attention_output(small_model, inputs):
    ids, mask = inputs
    found = norm_attribution(small_model, ids, mask)
    for layer, (block, x) in enumerate(zip(small_model.layers, layer_inputs(small_model, ids, mask))):
        attention = block.self_attention
        with torch.no_grad():
            output, _ = attention(x, mask=mask.bool()[:, None, :])                      # [B, N, E], before the residual
        for b in range(2):
            vectors = torch.stack([torch.stack([head_vector(attention, x, b, h, j) for j in range(7)])
                                   for h in range(3)])                                    # [H, N, E]
            assert torch.allclose(vectors.norm(dim=-1), found.value_norms[layer][b], rtol=1e-12)
            summed = torch.einsum("hij,hje->ie", found.weights[layer][b], vectors) + attention.out_proj.bias
            assert torch.allclose(summed, output[b], atol=1e-10)


def test_weights_are_the_models_attentions_and_padded_keys_contribute_nothing(small_model, inputs):
    ids, mask = inputs
    found = norm_attribution(small_model, ids, mask)
    with torch.no_grad():
        attentions = small_model(ids, mask).attentions
    assert all(torch.equal(a, w) for a, w in zip(attentions, found.weights))
    assert all(torch.all(c[1, :, :, 5:] == 0) for c in found.contributions)
    assert all(torch.equal(c, w * n[:, :, None, :]) for c, w, n in
               zip(found.contributions, found.weights, found.value_norms))


def test_no_hook_is_left_on_the_model_even_after_an_error(small_model, inputs):
    ids, mask = inputs
    norm_attribution(small_model, ids, mask)
    with pytest.raises(ValueError, match="^BertModel.forward: input_ids must lie in"):
        norm_attribution(small_model, torch.full((1, 3), 40))
    assert all(not layer.self_attention._forward_pre_hooks for layer in small_model.layers)
    found = norm_attribution(small_model, ids[:1, :4])                 # a second run records only its own inputs
    assert found.value_norms[0].shape == (1, 3, 4)


def test_value_norms_follow_grouped_query_heads():
    torch.manual_seed(2)
    attention = MultiHeadAttention(embed_dim=8, num_heads=4, num_kv_heads=2).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    output, weights = attention(x)                                                       # [B, N, E], [B, H, N, N]
    v = split_heads(attention.v_proj(x), 2)                                               # [B, H_kv, N, d]
    w_o = attention.out_proj.weight.T.reshape(4, 2, 8)                                    # [H, d, E]
    # head h reads key/value head h // 2
    vectors = torch.stack([v[:, h // 2] @ w_o[h] for h in range(4)], dim=1)              # [B, H, N, E]
    assert torch.allclose(value_norms(attention, x), vectors.norm(dim=-1), rtol=1e-12)
    summed = torch.einsum("bhij,bhje->bie", weights, vectors) + attention.out_proj.bias
    assert torch.allclose(summed, output, atol=1e-10)


def test_on_minilm_equals_the_notebooks_inline_loop():
    model, tokenizer = load_pretrained()
    batch = tokenizer("The bank of the river was muddy.")
    found = norm_attribution(model, batch.input_ids)
    with torch.no_grad():
        hidden_states = model.embeddings(batch.input_ids, batch.token_type_ids)          # [1, N, E]
        for layer, weights, norms, contributions in zip(model.layers, *found):
            attention = layer.self_attention
            v = split_heads(attention.v_proj(hidden_states), attention.num_heads)         # [1, H, N, d]
            w_o = attention.out_proj.weight.T.reshape(attention.num_heads, -1, 384)      # [H, d, E]
            f_norm = torch.einsum("bhnd,hde->bhne", v, w_o).norm(dim=-1)                # [1, H, N]
            hidden_states, expected = layer(hidden_states, need_weights=True)
            assert torch.equal(weights, expected) and torch.equal(norms, f_norm)
            assert torch.equal(contributions, expected * f_norm[:, :, None, :])
    by_weight = attention_share(found.weights, [0, -1]).mean().item()
    by_contribution = attention_share(found.contributions, [0, -1]).mean().item()
    assert (f"{by_weight:.2f}", f"{by_contribution:.2f}") == ("0.57", "0.20")          # chapter 08, section 12


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda m: norm_attribution(m.layers[0], torch.ones(1, 3, dtype=torch.long)), TypeError,
         "^norm_attribution: model must be a BertModel, got EncoderBlock"),
        (lambda m: norm_attribution(m, torch.ones(1, 3)), TypeError, "^BertModel.forward: input_ids must .*integer"),
        (lambda m: value_norms(m.layers[0], torch.ones(1, 3, 12)), TypeError,
         "^value_norms: attention must be a MultiHeadAttention"),
        (lambda m: value_norms(m.layers[0].self_attention, torch.ones(1, 3, 8, dtype=torch.float64)), ValueError,
         r"^value_norms: x must be \[B, N, E\] with E = embed_dim = 12"),
        (lambda m: value_norms(m.layers[0].self_attention, torch.ones(1, 3, 12)), TypeError,
         "^value_norms: x has dtype torch.float32"),
    ],
)
def test_wrong_arguments_are_named(small_model, call, error, fragment):
    with pytest.raises(error, match=fragment):
        call(small_model)
