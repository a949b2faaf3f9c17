"""Qwen3-Next's linear-attention layer through convert_layer, against Hugging Face's inside its model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attn_course.models.hugging_face import convert_layer
from attn_course.variants.gated_deltanet import GatedDeltaNet, GatedDeltaNetConfig

transformers = pytest.importorskip("transformers")


def qwen3_next(**overrides):
    config = transformers.Qwen3NextConfig(**{**dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
        vocab_size=64, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, initializer_range=0.2), **overrides})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():                                   # move what starts at ones away from them
        linear = model.model.layers[0].linear_attn
        linear.norm.weight.add_(0.3 * torch.randn_like(linear.norm.weight))
        linear.dt_bias.add_(0.5 * torch.randn_like(linear.dt_bias))
    return config, model


def layer_input_and_output(model, tokens):
    seen = {}

    def record(module, args, kwargs, output):
        seen["x"], seen["out"] = kwargs.get("hidden_states", args[0] if args else None), output

    hook = model.model.layers[0].linear_attn.register_forward_hook(record, with_kwargs=True)
    ids = torch.randint(0, 64, (2, tokens), generator=torch.Generator().manual_seed(1))
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        hook.remove()
    return seen["x"], seen["out"]


@pytest.mark.parametrize("tokens, chunk_size", [(12, 64), (70, 64), (70, 16), (12, None)])
def test_the_linear_layer_equals_hugging_faces_inside_its_model(tokens, chunk_size):
    config, model = qwen3_next()
    x, expected = layer_input_and_output(model, tokens)
    ours = convert_layer(model.model.layers[0].linear_attn, config)
    assert isinstance(ours, GatedDeltaNet) and ours.config.num_value_heads == 4
    ours.config = dataclasses.replace(ours.config, chunk_size=chunk_size)
    with torch.no_grad():
        got, state = ours(x)
    assert state.shape == (2, 4, 16, 8)
    assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-5


def test_bad_configs_and_inputs_are_named():
    with pytest.raises(ValueError, match="num_value_heads=3 must be divisible by num_key_heads=2"):
        GatedDeltaNetConfig(32, 2, 3, 8, 8)
    config, model = qwen3_next(hidden_act="gelu")
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        convert_layer(model.model.layers[0].linear_attn, config)
    with pytest.raises(ValueError, match=r"x must be \[B, N, E\]"):
        GatedDeltaNet(GatedDeltaNetConfig(32, 2, 4, 8, 8))(torch.randn(1, 5, 16))
