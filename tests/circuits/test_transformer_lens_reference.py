"""Our attention-only model against TransformerLens's HookedTransformer with the same weights (issue 33, point 6).

TransformerLens 4.x removed HookedTransformer (``from transformer_lens import HookedTransformer`` raises an
ImportError pointing to TransformerBridge, which wraps Hugging Face models and has no attention-only
architecture); 3.9.0 is its last release with it, and installs beside torch 2.13 and transformers 5 without
changing either. The test extra pins ``transformer-lens>=3.9,<4``.

Compared: logits, every layer's attention pattern (TL's ``hook_pattern``), every head's output (TL's
``hook_result``), and zero-ablation of each head (TL: a hook zeroing that head's ``hook_z``; ours:
:func:`ablate_head`), on the cached trained model and on random ones with rotary positions and LayerNorm.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from attn_course.circuits import ablate_head, record_head_outputs, record_patterns
from attn_course.circuits.trained import load_trained
from attn_course.data.repeated_tokens import repeated_random_tokens
from attn_course.models.attention_only import AttentionOnlyTransformer

transformer_lens = pytest.importorskip("transformer_lens", reason="pip install -e '.[test]' installs it")
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from transformer_lens import HookedTransformer, HookedTransformerConfig

ATOL = 1e-5


def to_transformer_lens(model: AttentionOnlyTransformer) -> HookedTransformer:
    """A HookedTransformer (attn_only) holding ``model``'s weights, mapped name by name and shape by shape."""
    c = model.config
    heads, d = c.n_heads, c.d_model // c.n_heads
    config = HookedTransformerConfig(
        n_layers=c.n_layers, d_model=c.d_model, n_ctx=c.max_len, d_head=d, n_heads=heads, d_vocab=c.vocab_size,
        attn_only=True, act_fn=None, normalization_type="LN" if c.layer_norm else None,
        positional_embedding_type="standard" if c.positions == "learned" else "rotary",
        rotary_dim=d, rotary_base=10000, rotary_adjacent_pairs=False,      # Llama's half split, as ours
        use_attn_result=True, default_prepend_bos=False, device="cpu", dtype=torch.float32, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        reference = HookedTransformer(config)
    state = {"embed.W_E": model.W_E, "unembed.W_U": model.W_U,
             "unembed.b_U": model.unembed.bias.detach() if c.bias else torch.zeros(c.vocab_size)}
    if c.positions == "learned":
        state["pos_embed.W_pos"] = model.W_pos
    for layer in range(c.n_layers):
        attention, prefix = model.layers[layer].attention, f"blocks.{layer}."
        state |= {prefix + "attn.W_Q": model.W_Q(layer), prefix + "attn.W_K": model.W_K(layer),
                  prefix + "attn.W_V": model.W_V(layer), prefix + "attn.W_O": model.W_O(layer)}
        for name in "QKV":
            bias = getattr(attention, f"{name.lower()}_proj").bias
            state[prefix + f"attn.b_{name}"] = torch.zeros(heads, d) if bias is None else bias.detach().view(heads, d)
        state[prefix + "attn.b_O"] = (torch.zeros(c.d_model) if attention.out_proj.bias is None
                                      else attention.out_proj.bias.detach())
        if c.layer_norm:
            state[prefix + "ln1.w"] = model.layers[layer].ln.weight.detach()
            state[prefix + "ln1.b"] = model.layers[layer].ln.bias.detach()
    if c.layer_norm:
        state["ln_final.w"], state["ln_final.b"] = model.ln_final.weight.detach(), model.ln_final.bias.detach()
    expected = {name for name, _ in reference.named_parameters()}
    assert set(state) == expected, f"unmapped: {expected - set(state)}, unknown: {set(state) - expected}"
    for name, parameter in reference.named_parameters():
        assert parameter.shape == state[name].shape, (name, parameter.shape, state[name].shape)
    reference.load_state_dict(state, strict=False)
    return reference.eval()


def _random_model(**options) -> AttentionOnlyTransformer:
    torch.manual_seed(11)
    model = AttentionOnlyTransformer(17, n_layers=2, n_heads=4, d_model=32, max_len=12, **options)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "ln" in name or "bias" in name:
                parameter.add_(0.2 * torch.randn_like(parameter))
    return model.eval()


MODELS = {
    "trained seed 0": lambda: load_trained(0),
    "rotary": lambda: _random_model(positions="rotary"),
    "layer norm and biases": lambda: _random_model(layer_norm=True, bias=True),
    "rotary, layer norm and biases": lambda: _random_model(positions="rotary", layer_norm=True, bias=True),
}


def _tokens(model: AttentionOnlyTransformer) -> torch.Tensor:
    return repeated_random_tokens(8, model.config.max_len // 2, model.config.vocab_size,
                                  generator=torch.Generator().manual_seed(21))


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_logits_patterns_and_head_outputs_agree_with_transformer_lens(make):
    model = make()
    reference, tokens = to_transformer_lens(model), _tokens(model)
    with torch.no_grad():
        logits = model(tokens)
        reference_logits, cache = reference.run_with_cache(tokens)
    torch.testing.assert_close(logits, reference_logits, atol=ATOL, rtol=1e-5)
    patterns, results = record_patterns(model, tokens), record_head_outputs(model, tokens)
    for layer in range(model.config.n_layers):
        torch.testing.assert_close(patterns[layer], cache[f"blocks.{layer}.attn.hook_pattern"], atol=ATOL, rtol=1e-5)
        theirs = cache[f"blocks.{layer}.attn.hook_result"].permute(0, 2, 1, 3)      # [B, N, H, E] -> [B, H, N, E]
        torch.testing.assert_close(results[layer], theirs, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("make", [MODELS["trained seed 0"], MODELS["rotary, layer norm and biases"]],
                         ids=["trained seed 0", "rotary, layer norm and biases"])
def test_zero_ablating_each_head_agrees_with_transformer_lens(make):
    model = make()
    reference, tokens = to_transformer_lens(model), _tokens(model)
    for layer in range(model.config.n_layers):
        for head in range(model.config.n_heads):
            def zero_head(z, hook, head=head):                                      # z [B, N, H, d]
                z[:, :, head] = 0.0
                return z

            with torch.no_grad():
                theirs = reference.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head)])
                with ablate_head(model, layer, head):
                    ours = model(tokens)
            torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=1e-5)
            their_loss = reference.loss_fn(theirs, tokens).item()
            our_loss = reference.loss_fn(ours, tokens).item()
            assert our_loss == pytest.approx(their_loss, abs=1e-5)
