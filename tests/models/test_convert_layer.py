"""convert_layer: each Hugging Face attention layer, read into the course's module, computes what it computes.

Reference: ``transformers`` 5.25's own models, random-initialised from small configs (hidden 64, 4 heads of 16,
2 key/value heads, ``_attn_implementation="eager"``), no download. A forward hook on every layer's ``self_attn``
records its input ``hidden_states`` and its output inside the whole model; the converted layer must give the
same output and weights from that input, for every layer, sliding and full. The attention's projections are
drawn at ``initializer_range = 0.2`` and its norms, biases and sinks away from their initial values, so that
scores are far from uniform and none of these weights can be dropped unnoticed.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attn_course.models.decoder_attention import DecoderAttention
from attn_course.models.hugging_face import convert_layer, decoder_config_from_hugging_face
from attn_course.variants.latent_attention import MultiHeadLatentAttention

transformers = pytest.importorskip("transformers")

#: max |ours - Hugging Face| / max |Hugging Face| over a layer's output, and max |difference| of the weights:
#: float32 round-off (the two compute RoPE angles in float64 and float32, and sum in other orders).
TOLERANCE = 1e-5
TOKENS = 12         # N: longer than every sliding window below (4) and than the dynamic-NTK context (8)
WINDOW = 4

SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
             vocab_size=64, num_hidden_layers=2, max_position_embeddings=64, initializer_range=0.2)
DEEPSEEK = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32,
                qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, intermediate_size=64, moe_intermediate_size=16,
                n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, vocab_size=64, num_hidden_layers=2,
                first_k_dense_replace=1, max_position_embeddings=64, initializer_range=0.2)

CONFIGS = {
    "llama": ("LlamaConfig", dict(SMALL, attention_bias=True)),
    "llama-linear": ("LlamaConfig", dict(SMALL, rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                                  "rope_theta": 10000.0})),
    "llama-dynamic": ("LlamaConfig", dict(SMALL, max_position_embeddings=8, rope_parameters={
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})),
    "llama-yarn": ("LlamaConfig", dict(SMALL, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0})),
    "llama-llama3": ("LlamaConfig", dict(SMALL, max_position_embeddings=128, rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64, "rope_theta": 10000.0})),
    "mistral": ("MistralConfig", dict(SMALL, sliding_window=WINDOW)),
    # use_sliding_window with max_window_layers=1: layer 0 full, layer 1 sliding.
    "qwen3": ("Qwen3Config", dict(SMALL, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    # Sliding layers rotate with their own (local) base, full ones with the global base and Gemma 3's linear
    # scaling; query_pre_attn_scalar (32) differs from head_dim (16), so the scale is tested.
    "gemma3": ("Gemma3TextConfig", dict(SMALL, sliding_window=WINDOW, query_pre_attn_scalar=32,
                                        layer_types=["sliding_attention", "full_attention"], rope_parameters={
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                            "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                               "rope_theta": 1_000_000.0}})),
    "gemma3-local-base": ("Gemma3TextConfig", dict(SMALL, sliding_window=WINDOW, rope_local_base_freq=50.0,
                                                   layer_types=["sliding_attention", "full_attention"])),
    "gpt-oss": ("GptOssConfig", dict(SMALL, sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
                                     rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                                                      "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                                      "original_max_position_embeddings": 16})),
    "qwen3-next": ("Qwen3NextConfig", dict(SMALL, layer_types=["linear_attention", "full_attention"],
                                           num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=32, linear_num_key_heads=2,
                                           linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                                           attention_bias=True)),
    "deepseek-v2": ("DeepseekV2Config", DEEPSEEK),
    "deepseek-v3": ("DeepseekV3Config", dict(DEEPSEEK, n_group=1, topk_group=1)),
}


def hugging_face_model(name: str, **overrides):
    """``(config, model)``: the named small config, its model random-initialised in eval mode, and its attention's
    norms, biases and sinks moved away from their initial values (ones, zeros, a narrow normal)."""
    class_name, fields = CONFIGS[name]
    config = getattr(transformers, class_name)(**{**fields, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for parameter_name, parameter in getattr(layer, "self_attn", torch.nn.Module()).named_parameters():
                if "norm" in parameter_name:
                    parameter.add_(0.3 * torch.randn_like(parameter))
                elif parameter_name.endswith("bias"):
                    parameter.copy_(0.2 * torch.randn_like(parameter))
                elif parameter_name == "sinks":
                    parameter.copy_(torch.randn_like(parameter))
    return config, model


def run_with_hooks(model, attribute: str = "self_attn") -> list[tuple]:
    """``[(module, hidden_states, (output, weights))]`` of every layer's ``attribute`` in one forward pass."""
    seen = []

    def record(module, args, kwargs, output):
        seen.append((module, kwargs["hidden_states"] if "hidden_states" in kwargs else args[0], output))

    hooks = [getattr(layer, attribute).register_forward_hook(record, with_kwargs=True)
             for layer in model.model.layers if hasattr(layer, attribute)]
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (2, TOKENS))
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_layer_matches_hugging_face_inside_its_model(name):
    config, model = hugging_face_model(name)
    seen = run_with_hooks(model)
    assert seen, "no attention layer ran"
    windows = []
    for module, hidden_states, (expected, expected_weights) in seen:
        ours = convert_layer(module, config)
        with torch.no_grad():
            output, weights = ours(hidden_states)
        assert relative_error(output, expected) < TOLERANCE, (name, module.layer_idx)
        assert (weights - expected_weights).abs().max() < TOLERANCE, (name, module.layer_idx)
        if isinstance(ours, DecoderAttention):
            windows.append(ours.config.window)
    expected_kind = MultiHeadLatentAttention if name.startswith("deepseek") else DecoderAttention
    assert isinstance(ours, expected_kind)
    if name in ("mistral", "qwen3", "gemma3", "gpt-oss"):
        assert WINDOW in windows and WINDOW < TOKENS           # a sliding layer really slides here
    if name in ("qwen3", "gemma3", "gpt-oss"):
        assert None in windows                                 # and a full layer does not


def test_each_architecture_reads_its_own_options():
    """The options behind the matches above: a test that passed with every option off would prove nothing."""
    read = {name: [decoder_config_from_hugging_face(hugging_face_model(name)[0], class_name, index)
                   for index in (0, 1)]
            for name, class_name in [("qwen3", "Qwen3Attention"), ("gemma3", "Gemma3Attention"),
                                     ("gpt-oss", "GptOssAttention")]}
    assert [c.window for c in read["qwen3"]] == [None, WINDOW] and read["qwen3"][0].qk_norm == "rms"
    gemma_sliding, gemma_full = read["gemma3"]
    assert (gemma_sliding.rope_base, gemma_full.rope_base, gemma_full.rope_scaling.factor) == (100.0, 1e6, 8.0)
    assert gemma_sliding.softmax_scale == 32 ** -0.5 and gemma_sliding.qk_norm == "gemma"
    assert [c.window for c in read["gpt-oss"]] == [WINDOW, None]
    assert read["gpt-oss"][0].sinks and read["gpt-oss"][0].bias and read["gpt-oss"][0].rope_scaling.truncate is False
    local = decoder_config_from_hugging_face(hugging_face_model("gemma3-local-base")[0], "Gemma3Attention", 0)
    assert local.rope_base == 50.0
    qwen3_next = decoder_config_from_hugging_face(hugging_face_model("qwen3-next")[0], "Qwen3NextAttention", 1)
    assert qwen3_next.output_gate and qwen3_next.rotary_fraction == 0.25 and qwen3_next.bias


def test_sinks_matter_and_sinks_at_minus_infinity_are_plain_attention():
    config, model = hugging_face_model("gpt-oss")
    module, hidden_states, (expected, _) = run_with_hooks(model)[0]
    ours = convert_layer(module, config)
    with torch.no_grad():
        ours.sinks.fill_(float("-inf"))
        without_sinks, weights = ours(hidden_states)
        with_sinks = convert_layer(module, config)(hidden_states)[0]
    assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-6)     # no share left to a sink
    assert relative_error(without_sinks, expected) > 1e-2                  # the sinks changed Hugging Face's output
    assert relative_error(with_sinks, expected) < TOLERANCE
    # Hugging Face's own layer with its sinks at -inf agrees with the course's at -inf.
    with torch.no_grad():
        module.sinks.fill_(float("-inf"))
    _, hidden_states_again, (expected_plain, _) = run_with_hooks(model)[0]
    assert torch.equal(hidden_states_again, hidden_states)
    assert relative_error(without_sinks, expected_plain) < TOLERANCE


def test_the_output_gate_matters():
    config, model = hugging_face_model("qwen3-next")
    module, hidden_states, (expected, _) = run_with_hooks(model)[0]
    ours = convert_layer(module, config)
    ungated = DecoderAttention(dataclasses.replace(ours.config, output_gate=False))
    ungated.load_state_dict({k: v for k, v in ours.state_dict().items() if not k.startswith("gate_proj")})
    with torch.no_grad():
        ours.gate_proj.weight.zero_()
        ours.gate_proj.bias.zero_()                          # sigmoid(0) = 1/2 on every head and feature
        halved, plain = ours(hidden_states)[0], ungated(hidden_states)[0]
    assert relative_error(halved, expected) > 1e-2
    bias = ours.o_proj.bias                                  # o_proj is linear: half its input, half its output
    assert torch.allclose(2 * (halved - bias), plain - bias, atol=1e-5)


def test_a_window_smaller_than_the_sequence_matters():
    config, model = hugging_face_model("mistral")
    module, hidden_states, (expected, _) = run_with_hooks(model)[0]
    ours = convert_layer(module, config)
    full = DecoderAttention(dataclasses.replace(ours.config, window=None))
    full.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert relative_error(full(hidden_states)[0], expected) > 1e-2


def test_hugging_face_gemma3_ignores_attn_logit_softcapping_so_it_is_refused():
    config, model = hugging_face_model("gemma3")
    capped_config, capped = hugging_face_model("gemma3", attn_logit_softcapping=0.5)
    seen, seen_capped = run_with_hooks(model), run_with_hooks(capped)
    for (_, _, (expected, _)), (_, _, (expected_capped, _)) in zip(seen, seen_capped):
        assert torch.equal(expected, expected_capped)      # a cap of 0.5 would change every score
    with pytest.raises(ValueError, match="attn_logit_softcapping=0.5 is not supported"):
        convert_layer(seen_capped[0][0], capped_config)


@pytest.mark.parametrize(("name", "overrides", "message"), [
    ("llama", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                                    "long_factor": [2.0] * 8, "original_max_position_embeddings": 32}),
     "rope_type='longrope' is not supported"),
    ("llama", dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5 is not supported for Llama"),
    ("gemma3", dict(use_bidirectional_attention=True), "use_bidirectional_attention=True is not supported"),
])
def test_settings_it_cannot_reproduce_are_refused_by_name(name, overrides, message):
    class_name, fields = CONFIGS[name]
    config = getattr(transformers, class_name)(**{**fields, **overrides})
    module_type = "LlamaAttention" if name == "llama" else "Gemma3Attention"
    with pytest.raises(ValueError, match=message):
        decoder_config_from_hugging_face(config, module_type, 0)


def test_gemma3s_multimodal_config_and_dropout_in_training_are_refused_with_what_to_do():
    config, model = hugging_face_model("gemma3", attention_dropout=0.1)
    module = model.model.layers[0].self_attn
    multimodal = transformers.Gemma3Config(text_config=config.to_dict())
    with pytest.raises(ValueError, match=r"lacks hidden_size, num_attention_heads \(for Gemma 3, pass the text"):
        convert_layer(module, multimodal)
    with pytest.raises(ValueError, match="training mode with attention_dropout=0.1; .* call .eval"):
        convert_layer(module.train(), config)
    assert convert_layer(module.eval(), config).training is False


def test_a_module_it_does_not_know_is_refused_by_name():
    config, model = hugging_face_model("qwen3-next")
    with pytest.raises(ValueError, match="a Qwen3NextSparseMoeBlock is not an attention module this course reads"):
        convert_layer(model.model.layers[0].mlp, config)
    with pytest.raises(ValueError, match=r"layer_types\[0\]='linear_attention' is not supported"):
        decoder_config_from_hugging_face(config, "Qwen3NextAttention", 0)


def test_weights_that_do_not_fit_the_config_are_named():
    config, model = hugging_face_model("qwen3")
    other, _ = hugging_face_model("qwen3", num_key_value_heads=4)
    with pytest.raises(ValueError, match=r"wrong shape\(s\): k_proj.weight \[32, 64\] \(expected \[64, 64\]\)"):
        convert_layer(model.model.layers[0].self_attn, other)
    without_layer_types = {name: value for name, value in config.to_dict().items() if name != "layer_types"}
    with pytest.raises(ValueError, match="sliding_window=4 but no layer_types saying which layers slide"):
        convert_layer(model.model.layers[0].self_attn, without_layer_types)
    with pytest.raises(ValueError, match="sliding_window=None but the config gives 4"):
        convert_layer(model.model.layers[0].self_attn, {**config.to_dict(), "max_window_layers": 0,
                                                        "layer_types": ["sliding_attention"] * 2})


def test_bad_inputs_are_refused_with_errors_that_name_the_argument():
    config, model = hugging_face_model("llama")
    module = model.model.layers[0].self_attn
    with pytest.raises(TypeError, match="convert_layer: hf_module must be a Module, got str"):
        convert_layer("LlamaAttention", config)
    with pytest.raises(TypeError, match="convert_layer: config must be a mapping"):
        convert_layer(module, 5)
    with pytest.raises(TypeError, match="module_type must be a str"):
        decoder_config_from_hugging_face(config, 3, 0)
    with pytest.raises(ValueError, match="layer_idx must be >= 0"):
        decoder_config_from_hugging_face(config, "LlamaAttention", -1)
    with pytest.raises(ValueError, match="the config lacks hidden_size"):
        decoder_config_from_hugging_face({"num_attention_heads": 4}, "LlamaAttention", 0)
    ours = convert_layer(module, config)
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        ours(torch.ones(1, 3, 64, dtype=torch.long))
    with pytest.raises(ValueError, match=r"x must be \[B, N, E\] with E = hidden_size = 64"):
        ours(torch.ones(1, 3, 32))
    with pytest.raises(TypeError, match="x has dtype torch.float64"):
        ours(torch.ones(1, 3, 64, dtype=torch.float64))
