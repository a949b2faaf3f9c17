"""Multi-head latent attention against transformers' DeepseekV2Attention, its absorbed form, and its cache.

References: Hugging Face ``transformers`` 5.24 (``DeepseekV2Attention``, random weights from a small
config, eager attention, its own ``DynamicCache``, whose bytes are measured against the cache sizes of
:mod:`attn_course.variants.kv_cache_size`) and float64 algebra for the absorbed form.
"""

from __future__ import annotations

import pytest
import torch

from attn_course.models.hugging_face.latent_attention import from_hugging_face_weights, mla_config_from_hugging_face
from attn_course.positions.rope import RotaryEmbedding
from attn_course.positions.rope_scaling import LinearScaling
from attn_course.variants.kv_cache_size import CacheSize, cache_size_from_config, mha_cache_elements, mla_cache_elements
from attn_course.variants.latent_attention import MLAConfig, MultiHeadLatentAttention
from attn_course.variants.latent_cache import LatentCache

transformers = pytest.importorskip("transformers")
from transformers import DeepseekV2Config  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.models.deepseek_v2.modeling_deepseek_v2 import (  # noqa: E402
    DeepseekV2Attention,
    DeepseekV2RotaryEmbedding,
)

TOLERANCE = 1e-5          # float32 against Hugging Face
ABSORBED_TOLERANCE = 1e-10  # float64, plain against absorbed

SMALL = dict(hidden_size=64, num_attention_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
             v_head_dim=8, num_hidden_layers=1, intermediate_size=32, moe_intermediate_size=16, n_routed_experts=4,
             num_experts_per_tok=2, n_shared_experts=1, vocab_size=50, max_position_embeddings=64)

VARIANTS = {
    "query-compression": dict(q_lora_rank=32),
    "no-query-compression-with-biases": dict(q_lora_rank=None, attention_bias=True),
    # mscale != mscale_all_dim: the rotated features *and* the softmax scale both change.
    "yarn": dict(q_lora_rank=32, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.5}),
}


def hugging_face_attention(**overrides):
    """A random-initialised DeepseekV2Attention (norm weights and biases random too) and its rotary module."""
    torch.manual_seed(0)
    config = DeepseekV2Config(**{**SMALL, **overrides}, attn_implementation="eager")
    attention = DeepseekV2Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, parameter in attention.named_parameters():
            if "layernorm" in name or name.endswith("bias"):
                parameter.copy_(1 + 0.3 * torch.randn_like(parameter) if "layernorm" in name
                                else 0.1 * torch.randn_like(parameter))
    return config, attention, DeepseekV2RotaryEmbedding(config)


def ours_from(config, attention) -> MultiHeadLatentAttention:
    ours = MultiHeadLatentAttention(mla_config_from_hugging_face(config))
    ours.load_state_dict(from_hugging_face_weights(attention.state_dict(), ours.config))
    return ours.eval()


def causal_additive_mask(n_new: int, past: int) -> torch.Tensor:
    """``[1, 1, N, past + N]``: 0 where query ``past + i`` may see key ``j`` (``j <= past + i``), else -inf."""
    allowed = torch.arange(past + n_new)[None, :] <= (past + torch.arange(n_new))[:, None]
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]


def run_hugging_face(attention, rotary, x, past=0, cache=None):
    positions = torch.arange(past, past + x.shape[1])[None]
    out, weights = attention(x, attention_mask=causal_additive_mask(x.shape[1], past),
                             position_embeddings=rotary(x, positions), cache=cache)
    return out, weights


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_matches_hugging_face_deepseek_v2_attention_without_cache(variant):
    config, attention, rotary = hugging_face_attention(**VARIANTS[variant])
    ours = ours_from(config, attention)
    x = torch.randn(2, 7, SMALL["hidden_size"])
    with torch.no_grad():
        expected, expected_weights = run_hugging_face(attention, rotary, x)
        out, weights = ours(x)
    assert (out - expected).abs().max() < TOLERANCE
    assert (weights - expected_weights).abs().max() < TOLERANCE


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_matches_hugging_face_with_a_cache_prefill_then_decode(variant):
    config, attention, rotary = hugging_face_attention(**VARIANTS[variant])
    ours = ours_from(config, attention)
    x = torch.randn(2, 7, SMALL["hidden_size"])
    theirs_cache, our_cache = DynamicCache(config=config), LatentCache()
    chunks = [(0, 4), (4, 5), (5, 6), (6, 7)]                      # a prefill of 4, then 3 single tokens
    with torch.no_grad():
        for start, stop in chunks:
            expected, _ = run_hugging_face(attention, rotary, x[:, start:stop], past=start, cache=theirs_cache)
            for absorbed in (False, True):
                step_cache = our_cache if not absorbed else None
                if absorbed:                                        # the absorbed form from the same cached prefix
                    step_cache = LatentCache()
                    if start:
                        step_cache.append(our_cache.latent[:, :start], our_cache.rope_key[:, :start])
                out, _ = ours(x[:, start:stop], step_cache, absorbed=absorbed)
                assert (out - expected).abs().max() < TOLERANCE, (start, absorbed)
    # The caches hold the same tensors: the normalised latent and the rotated shared key, nothing per head.
    layer = theirs_cache.layers[0]
    assert layer.keys.shape == (2, 1, 7, SMALL["kv_lora_rank"])
    assert (layer.keys[:, 0] - our_cache.latent).abs().max() < TOLERANCE
    assert (layer.values[:, 0] - our_cache.rope_key).abs().max() < TOLERANCE


def test_half_split_rope_pairing_would_not_match():
    # The checkpoint's rotary features pair up adjacent: the LLaMA pairing gives other scores.
    config, attention, rotary = hugging_face_attention(q_lora_rank=32)
    ours = ours_from(config, attention)
    ours.rope = RotaryEmbedding(SMALL["qk_rope_head_dim"], interleaved=False)
    x = torch.randn(1, 9, SMALL["hidden_size"])
    with torch.no_grad():
        assert (ours(x)[1] - run_hugging_face(attention, rotary, x)[1]).abs().max() > 1e-3


@pytest.mark.parametrize("q_lora_rank", [None, 12])
def test_absorbed_form_equals_the_plain_form_in_float64(q_lora_rank):
    torch.manual_seed(1)
    config = MLAConfig(48, 3, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                       q_lora_rank=q_lora_rank, attention_bias=True)
    mla = MultiHeadLatentAttention(config).double()
    x = torch.randn(2, 6, 48, dtype=torch.float64)
    plain, plain_weights = mla(x)
    absorbed, absorbed_weights = mla(x, absorbed=True)
    assert (plain - absorbed).abs().max() < ABSORBED_TOLERANCE
    assert (plain_weights - absorbed_weights).abs().max() < ABSORBED_TOLERANCE
    cache = LatentCache()
    steps = [mla(x[:, :3], cache, absorbed=True)[0]] + [mla(x[:, t:t + 1], cache, absorbed=True)[0] for t in (3, 4, 5)]
    assert (torch.cat(steps, dim=1) - plain).abs().max() < ABSORBED_TOLERANCE


def test_absorbed_query_projection_is_w_uk_transposed_times_w_uq_per_head():
    torch.manual_seed(2)
    config = MLAConfig(16, 2, kv_lora_rank=6, qk_nope_head_dim=3, qk_rope_head_dim=2, v_head_dim=4)
    mla = MultiHeadLatentAttention(config).double()
    query, output = mla.absorbed_projections()
    for head in range(2):
        w_uq = mla.query_up.weight[head * 3:(head + 1) * 3]               # [d_h, E]
        w_uk = mla.key_up.weight[head * 3:(head + 1) * 3]                 # [d_h, d_c]
        w_uv = mla.value_up.weight[head * 4:(head + 1) * 4]               # [d_v, d_c]
        w_o = mla.out_proj.weight[:, head * 4:(head + 1) * 4]             # [E, d_v]
        assert torch.allclose(query[head], w_uk.T @ w_uq)
        assert torch.allclose(output[:, head * 6:(head + 1) * 6], w_o @ w_uv)


def test_cache_keeps_only_the_latent_and_rope_key_and_its_bytes_match_the_formula():
    torch.manual_seed(3)
    config = MLAConfig(64, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, q_lora_rank=32)
    layers = [MultiHeadLatentAttention(config) for _ in range(2)]
    caches = [LatentCache(max_length=8) for _ in layers]
    x = torch.randn(3, 8, 64)
    with torch.no_grad():
        for start, stop in [(0, 5), (5, 6), (6, 7), (7, 8)]:
            h = x[:, start:stop]
            for layer, cache in zip(layers, caches):
                h = h + layer(h, cache)[0]
    formula = CacheSize("MLA", mla_cache_elements(16, 4), num_layers=2).bytes(8, batch=3, bits_per_element=32)
    assert sum(cache.stored_bytes for cache in caches) == formula == 3 * 8 * (16 + 4) * 2 * 4
    assert sum(cache.memory_bytes for cache in caches) == formula       # allocated once, exactly
    # Multi-head attention with these heads would hold 2 · H · d_h = 64 per layer and token, not 20.
    assert mha_cache_elements(4, 8) == 64


def test_hugging_face_caches_measured_in_bytes_match_the_formulas():
    from transformers import DeepseekV2ForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(4)
    batch, tokens = 2, 9
    ids = torch.randint(0, SMALL["vocab_size"], (batch, tokens))
    deepseek = DeepseekV2Config(**{**SMALL, "num_hidden_layers": 2, "first_k_dense_replace": 1}, q_lora_rank=32)
    llama = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                        intermediate_size=32, vocab_size=SMALL["vocab_size"])
    for config, model_class, kind in [(deepseek, DeepseekV2ForCausalLM, "MLA"), (llama, LlamaForCausalLM, "GQA")]:
        model = model_class(config).eval()
        with torch.no_grad():
            cache = model(ids, use_cache=True).cache              # transformers 5: `cache`, was past_key_values
        measured = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
        size = cache_size_from_config(config)
        assert size.kind == kind
        assert measured == size.bytes(tokens, batch=batch, bits_per_element=32)
    assert cache_size_from_config(deepseek).per_layer == 16 + 4
    assert cache_size_from_config(llama).per_layer == 2 * 2 * 16


def test_config_and_inputs_are_checked_with_errors_that_name_the_argument():
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even"):
        MLAConfig(64, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=3, v_head_dim=8)
    with pytest.raises(ValueError, match="q_lora_rank"):
        MLAConfig(64, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, q_lora_rank=0)
    with pytest.raises(TypeError, match="rope_scaling must be None or a YaRNScaling"):
        MLAConfig(64, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                  rope_scaling=LinearScaling(2.0))
    values = {"hidden_size": 64, "num_attention_heads": 4, "kv_lora_rank": 16, "q_lora_rank": None,
              "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}
    with pytest.raises(ValueError, match="rope_type='linear' is not supported"):
        mla_config_from_hugging_face({**values, "rope_scaling": {"type": "linear", "factor": 2.0}})
    with pytest.raises(ValueError, match="lacks kv_lora_rank"):
        mla_config_from_hugging_face({k: v for k, v in values.items() if k != "kv_lora_rank"})
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        mla_config_from_hugging_face({**values, "num_key_value_heads": 2})
    with pytest.raises(ValueError, match="rope_interleave=False is not supported"):     # DeepSeek-V3's option
        mla_config_from_hugging_face({**values, "rope_interleave": False})
    assert mla_config_from_hugging_face({**values, "rope_interleave": True}) == mla_config_from_hugging_face(values)
    with pytest.raises(TypeError, match="values must be a mapping"):
        mla_config_from_hugging_face([1, 2])
    mla = MultiHeadLatentAttention(mla_config_from_hugging_face(values))
    with pytest.raises(ValueError, match=r"x must be \[B, N, E\] with E = 64"):
        mla(torch.randn(1, 3, 60))
    with pytest.raises(TypeError, match="cache must be a LatentCache"):
        mla(torch.randn(1, 3, 64), {})
    with pytest.raises(TypeError, match="absorbed must be a bool"):
        mla(torch.randn(1, 3, 64), absorbed=1)
    with pytest.raises(ValueError, match="latent must be"):
        LatentCache().append(torch.zeros(1, 3, 16), torch.zeros(1, 2, 4))
    with pytest.raises(TypeError, match="config must be an MLAConfig"):
        MultiHeadLatentAttention(values)


def test_weight_loading_names_every_missing_unexpected_and_misshaped_weight():
    config, attention, _ = hugging_face_attention(q_lora_rank=32)
    ours = mla_config_from_hugging_face(config)
    state = {f"model.layers.0.self_attn.{name}": t for name, t in attention.state_dict().items()}
    state["model.embed_tokens.weight"] = torch.zeros(3, 3)                  # outside the prefix: ignored
    assert set(from_hugging_face_weights(state, ours, prefix="model.layers.0.self_attn.")) == set(
        MultiHeadLatentAttention(ours).state_dict())
    broken = dict(attention.state_dict())
    del broken["q_a_layernorm.weight"]
    broken["kv_b_proj.weight"] = torch.zeros(3, 16)
    broken["rotary.inv_freq"] = torch.zeros(2)
    with pytest.raises(ValueError) as error:
        from_hugging_face_weights(broken, ours)
    message = str(error.value)
    assert "missing weight(s): q_a_layernorm.weight" in message
    assert "unexpected weight(s): rotary.inv_freq" in message
    assert "kv_b_proj.weight [3, 16] (expected [64, 16])" in message
    with pytest.raises(TypeError, match="state must be a mapping"):
        from_hugging_face_weights([], ours)
