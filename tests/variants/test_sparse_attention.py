"""DeepSeek-V3.2's sparse attention: the top-k selection against a loop, the layer against Hugging Face's."""

from __future__ import annotations

import pytest
import torch

from attn_course.variants.latent_attention import MLAConfig
from attn_course.variants.sparse_attention import IndexerConfig, SparseLatentAttention, top_k_keys


def test_top_k_keys_picks_the_best_earlier_keys_and_never_a_future_one():
    scores = torch.randn(2, 9, 9, generator=torch.Generator().manual_seed(0))
    chosen = top_k_keys(scores, 3)
    for b in range(2):
        for s in range(9):
            ranked = sorted(range(s + 1), key=lambda t: -scores[b, s, t].item())[:3]
            assert chosen[b, s].nonzero().flatten().tolist() == sorted(ranked)


def test_with_k_at_least_the_length_it_is_dense_latent_attention():
    torch.manual_seed(1)
    mla = MLAConfig(32, 2, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4, q_lora_rank=16)
    layer = SparseLatentAttention(mla, IndexerConfig(32, 16, num_heads=2, head_dim=8, rope_dim=4, top_k=7))
    x = torch.randn(2, 7, 32)
    sparse, _ = layer(x)
    dense, _ = layer.attention(x)
    assert torch.allclose(sparse, dense, atol=1e-6)
    layer.indexer.config = IndexerConfig(32, 16, num_heads=2, head_dim=8, rope_dim=4, top_k=2)
    assert not torch.allclose(layer(x)[0], dense, atol=1e-3)                 # fewer keys: another output


transformers = pytest.importorskip("transformers")


def deepseek_v32(top_k):
    config = transformers.DeepseekV32Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32,
        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, intermediate_size=64, moe_intermediate_size=16,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, vocab_size=64,
        num_hidden_layers=2, first_k_dense_replace=1, max_position_embeddings=64, initializer_range=0.2,
        index_n_heads=2, index_head_dim=16, index_topk=top_k)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.indexer.k_norm.bias.copy_(0.3 * torch.randn(16))
    return config, model


@pytest.mark.parametrize("top_k", [3, 64])
def test_each_layer_equals_hugging_faces_inside_its_model(top_k):
    from attn_course.models.hugging_face import convert_layer

    config, model = deepseek_v32(top_k)
    seen = []
    hooks = [layer.self_attn.register_forward_hook(
        lambda module, args, kwargs, output: seen.append((module, kwargs["hidden_states"], output[0])),
        with_kwargs=True) for layer in model.model.layers]
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    for module, x, expected in seen:
        ours = convert_layer(module, config)
        assert isinstance(ours, SparseLatentAttention) and ours.indexer.config.top_k == top_k
        with torch.no_grad():
            got, weights = ours(x)
        assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-5
        assert int((weights > 0).sum(-1).max()) == min(top_k, 12)


def test_bad_configs_are_named():
    mla = MLAConfig(32, 2, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4, q_lora_rank=16)
    with pytest.raises(ValueError, match="q_lora_rank=16 must equal the indexer's query_input=8"):
        SparseLatentAttention(mla, IndexerConfig(32, 8, num_heads=2, head_dim=8, rope_dim=4, top_k=2))
    with pytest.raises(ValueError, match="rope_dim must be even"):
        IndexerConfig(32, 16, num_heads=2, head_dim=8, rope_dim=3, top_k=2)
    with pytest.raises(ValueError, match="key_mask"):
        SparseLatentAttention(mla, IndexerConfig(32, 16, 2, 8, 4, 2)).attention(torch.randn(1, 3, 32),
                                                                               key_mask=torch.ones(1, 3, 3))
