"""AttentionOnlyTransformer against an independent float64 forward pass, its hooks, its weight accessors, its errors."""

from __future__ import annotations

import pytest
import torch
from circuits_reference import reference_forward

from attn_course.circuits import record_head_outputs, record_patterns
from attn_course.core.multihead import MultiHeadAttention, merge_heads
from attn_course.models.attention_only import AttentionOnlyTransformer

CONFIGS = [
    dict(positions="learned", layer_norm=False, bias=False),
    dict(positions="rotary", layer_norm=False, bias=False),
    dict(positions="learned", layer_norm=True, bias=True),
    dict(positions="rotary", layer_norm=True, bias=True),
]


def _model(**options) -> AttentionOnlyTransformer:
    torch.manual_seed(0)
    model = AttentionOnlyTransformer(11, n_layers=2, n_heads=2, d_model=8, max_len=7, **options)
    if options.get("layer_norm"):                       # LayerNorm starts as the identity affine: make it count
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "ln" in name:
                    parameter.add_(0.3 * torch.randn_like(parameter))
    return model.eval()


@pytest.mark.parametrize("options", CONFIGS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_logits_patterns_and_head_outputs_match_a_float64_recomputation(options):
    model = _model(**options)
    tokens = torch.randint(11, (3, 7), generator=torch.Generator().manual_seed(1))
    reference = reference_forward(model, tokens)
    with torch.no_grad():
        logits = model(tokens)
    patterns, results = record_patterns(model, tokens), record_head_outputs(model, tokens)
    torch.testing.assert_close(logits.double(), reference["logits"], atol=2e-5, rtol=1e-5)
    for layer in range(2):
        assert patterns[layer].shape == (3, 2, 7, 7) and results[layer].shape == (3, 2, 7, 8)
        torch.testing.assert_close(patterns[layer].double(), reference["patterns"][layer], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(results[layer].double(), reference["results"][layer], atol=1e-6, rtol=1e-5)


def test_the_model_runs_in_float64_and_then_agrees_to_round_off():
    model = _model(positions="rotary").double()
    tokens = torch.randint(11, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference_forward(model, tokens)["logits"], atol=1e-12, rtol=1e-12)


def test_patterns_are_causal_and_rows_sum_to_one():
    model = _model()
    pattern = record_patterns(model, torch.randint(11, (2, 7)))[1]
    assert torch.all(pattern.triu(1) == 0)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 2, 7))


def test_heads_summed_equal_multihead_attentions_own_output():
    """The per-head split uses MultiHeadAttention's parameters: summed, it is that module's forward."""
    model = _model()
    attention: MultiHeadAttention = model.layers[0].attention
    x = torch.randn(2, 5, 8)
    z, _ = attention.attend_heads(x, is_causal=True)
    w_o = attention.out_proj.weight.view(8, 2, 4)
    summed = torch.einsum("bhnd,ehd->bne", z, w_o)
    torch.testing.assert_close(summed, attention(x, is_causal=True)[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(attention.out_proj(merge_heads(z)), attention(x, is_causal=True)[0])


def test_a_hook_that_replaces_every_heads_output_with_zeros_leaves_the_direct_path():
    model = _model()
    tokens = torch.randint(11, (2, 7))
    handles = [layer.hook_result.register_forward_hook(lambda m, i, out: torch.zeros_like(out))
               for layer in model.layers]
    with torch.no_grad():
        logits = model(tokens)
    for handle in handles:
        handle.remove()
    direct = (model.W_E[tokens] + model.W_pos[:7]) @ model.W_U                # embedding straight to the logits
    torch.testing.assert_close(logits, direct, atol=1e-6, rtol=1e-6)


def test_weight_accessors_reproduce_queries_keys_values_and_outputs():
    model = _model(bias=False)
    x = torch.randn(2, 5, 8)
    attention = model.layers[1].attention
    for accessor, projection in ((model.W_Q, attention.q_proj), (model.W_K, attention.k_proj),
                                 (model.W_V, attention.v_proj)):
        heads = accessor(1)                                                   # [H, E, d]
        expected = projection(x).view(2, 5, 2, 4)                             # [B, N, H, d]
        for h in range(2):
            torch.testing.assert_close(x @ heads[h], expected[:, :, h], atol=1e-6, rtol=1e-6)
    z = torch.randn(2, 2, 5, 4)                                               # [B, H, N, d]
    by_head = sum(z[:, h] @ model.W_O(1)[h] for h in range(2))
    torch.testing.assert_close(by_head, attention.out_proj(merge_heads(z)), atol=1e-6, rtol=1e-6)
    assert model.W_E.shape == (11, 8) and model.W_U.shape == (8, 11) and model.W_pos.shape == (7, 8)
    assert _model(positions="rotary").W_pos is None


@pytest.mark.parametrize("call, error, words", [
    (lambda: AttentionOnlyTransformer(10, n_heads=3, d_model=8, max_len=4), ValueError, "divisible"),
    (lambda: AttentionOnlyTransformer(10, n_heads=2, d_model=6, max_len=4, positions="rotary"), ValueError, "even"),
    (lambda: AttentionOnlyTransformer(10, n_heads=2, d_model=8, max_len=4, positions="sinusoidal"), ValueError,
     "positions"),
    (lambda: AttentionOnlyTransformer(10, n_heads=2, d_model=8, max_len=4, positions=1), TypeError, "positions"),
    (lambda: AttentionOnlyTransformer(1, n_heads=2, d_model=8, max_len=4), ValueError, "vocab_size"),
    (lambda: AttentionOnlyTransformer(10, n_heads=2.0, d_model=8, max_len=4), TypeError, "n_heads"),
    (lambda: AttentionOnlyTransformer(10, n_heads=2, d_model=8, max_len=4, layer_norm="yes"), TypeError, "layer_norm"),
])
def test_bad_configurations_are_refused_by_name(call, error, words):
    with pytest.raises(error, match=words):
        call()


@pytest.mark.parametrize("tokens, error, words", [
    (torch.zeros(2, 5, dtype=torch.long), ValueError, "max_len"),
    (torch.zeros(4, dtype=torch.long), ValueError, r"\[B, N\]"),
    (torch.full((1, 3), 11), ValueError, "0 .. 10"),
    (torch.full((1, 3), -1), ValueError, "0 .. 10"),
    (torch.zeros(1, 3), TypeError, "integer"),
])
def test_bad_tokens_are_refused_by_name(tokens, error, words):
    model = AttentionOnlyTransformer(11, n_heads=2, d_model=8, max_len=4)
    with pytest.raises(error, match=words):
        model(tokens)


def test_accessors_refuse_a_layer_that_does_not_exist():
    model = _model()
    with pytest.raises(ValueError, match="layer must be in 0 .. 1"):
        model.W_Q(2)
    with pytest.raises(TypeError, match="layer"):
        model.W_O("1")


def test_a_hook_that_replaces_the_pattern_makes_the_heads_mix_values_with_it():
    """Every query attending to itself: each head then writes x W_V[h] W_O[h] at every position."""
    model = _model()
    tokens = torch.randint(11, (2, 7), generator=torch.Generator().manual_seed(3))
    resid = {}
    hooks = [model.layers[1].hook_pattern.register_forward_hook(
                 lambda m, i, pattern: torch.eye(7).expand_as(pattern).clone()),
             model.layers[1].hook_resid_pre.register_forward_hook(lambda m, i, out: resid.update(x=out))]
    results = record_head_outputs(model, tokens)[1]
    for hook in hooks:
        hook.remove()
    for h in range(2):
        expected = resid["x"] @ model.W_V(1)[h] @ model.W_O(1)[h]
        torch.testing.assert_close(results[:, h], expected, atol=1e-6, rtol=1e-5)
    with torch.no_grad():                                                 # a hook returning a copy changes nothing
        before = model(tokens)
        hook = model.layers[0].hook_pattern.register_forward_hook(lambda m, i, pattern: pattern.clone())
        torch.testing.assert_close(model(tokens), before, atol=1e-6, rtol=1e-6)
        hook.remove()
