"""attn_course.variants.kv_cache_size: cache elements per token against the DeepSeek papers' published numbers,
and the bytes of each variant against the course's real caches."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.variants.kv_cache_size import (
    DEEPSEEK_67B,
    DEEPSEEK_V2,
    CacheSize,
    cache_bytes_rows,
    cache_reduction,
    cache_size_from_config,
    gqa_cache_elements,
    mha_cache_elements,
    mqa_cache_elements,
)
from attn_course.variants.sliding_window import RollingKVCache


def test_cache_bytes_rows_agree_with_the_config_sizes_and_the_real_caches():
    n, heads, d, window = 300, 4, 8, 50
    found = {r.variant: r for r in cache_bytes_rows(n, heads=heads, head_dim=d, kv_heads=2, kv_lora_rank=32,
                                                    qk_rope_head_dim=8, window=window, bytes_per_element=2)}
    config = dict(num_hidden_layers=1, num_attention_heads=heads, head_dim=d)
    for kind, kv_heads in (("MHA", heads), ("GQA", 2), ("MQA", 1)):
        assert found[kind].bytes_at_n == cache_size_from_config({**config, "num_key_value_heads": kv_heads}).bytes(n)
    mla = cache_size_from_config({**config, "kv_lora_rank": 32, "qk_rope_head_dim": 8})
    assert found["MLA"].bytes_at_n == mla.bytes(n)
    cache = RollingKVCache(window)
    cache.append(torch.zeros(1, heads, n, d, dtype=torch.float16), torch.zeros(1, heads, n, d, dtype=torch.float16))
    assert found["sliding window (MHA)"].bytes_at_n == cache.memory_bytes and found["sliding window (MHA)"].fixed
    assert found["linear"].bytes_at_n == heads * (d * d + d) * 2 and found["linear"].fixed


def test_deepseek_v2_published_cache_per_token():
    # DeepSeek-V2 (arXiv 2405.04434) §3.1.2: n_h = 128, d_h = 128, d_c = 512, d_h^R = 64, 60 layers.
    # Table 1: MLA caches (d_c + d_h^R)·l ≈ (9/2)·d_h·l elements per token, MHA 2·n_h·d_h·l; its caption:
    # d_c = 4·d_h, d_h^R = d_h/2, "equal to GQA with only 2.25 groups".
    n_h = d_h = 128
    mla = cache_size_from_config(DEEPSEEK_V2)
    assert (mla.kind, mla.per_layer, mla.num_layers) == ("MLA", 576, 60)
    assert mla.per_layer == 4 * d_h + d_h // 2 == 9 * d_h / 2
    assert mha_cache_elements(n_h, d_h) == 32768
    assert mla.per_layer / (2 * d_h) == 2.25
    assert gqa_cache_elements(n_h, d_h) == mha_cache_elements(n_h, d_h)
    assert gqa_cache_elements(1, d_h) == mqa_cache_elements(d_h) == 256
    assert mla.elements_per_token == 34560


def test_deepseek_67b_comparison_and_the_papers_93_3_percent():
    # DeepSeek 67B (DeepSeek LLM, arXiv 2401.02954, Table 2): 95 layers, 64 heads of 128, 8 key/value heads.
    dense, v2 = cache_size_from_config(DEEPSEEK_67B), cache_size_from_config(DEEPSEEK_V2)
    assert (dense.kind, dense.per_layer, dense.elements_per_token) == ("GQA", 2048, 194560)
    # Counted in elements (or both at 16 bits) the saving is 82.2%, not the abstract's 93.3%.
    assert round(cache_reduction(v2, dense), 4) == 0.8224
    # §3.2.3: deployed DeepSeek-V2 quantises its KV cache to "6 bits on average". Against a 16-bit
    # DeepSeek 67B cache that gives 93.3% (our arithmetic; the paper does not show its calculation).
    assert round(cache_reduction(v2, dense, bits=6, baseline_bits=16), 3) == 0.933


def test_cache_size_functions_check_their_arguments():
    with pytest.raises(ValueError, match="num_heads must be >= 1"):
        mha_cache_elements(0, 128)
    with pytest.raises(TypeError, match="head_dim must be an int"):
        mqa_cache_elements(128.0)
    with pytest.raises(ValueError, match="lacks num_hidden_layers"):
        cache_size_from_config({"num_attention_heads": 4, "hidden_size": 64})
    with pytest.raises(ValueError, match="kind must be"):
        CacheSize("MoE", 1, 1)
    with pytest.raises(ValueError, match="bits_per_element must be a positive finite number"):
        CacheSize("MHA", 4, 1).bytes(3, bits_per_element=0)
    with pytest.raises(TypeError, match="baseline must be a CacheSize"):
        cache_reduction(CacheSize("MHA", 4, 1), 4)
    assert math.isclose(CacheSize("MHA", 4, 2).bytes(3, batch=2, bits_per_element=6), 4 * 2 * 3 * 2 * 6 / 8)
    with pytest.raises(ValueError, match=r"^cache_bytes_rows: kv_heads must be at most heads"):
        cache_bytes_rows(heads=2, kv_heads=4)
    with pytest.raises(ValueError, match=r"^cache_bytes_rows: kv_lora_rank must be >= 1"):
        cache_bytes_rows(kv_lora_rank=0)


# --- every way a published config names its key/value heads, against Hugging Face's own reading ----------

FALCON_7B = {"model_type": "falcon", "num_hidden_layers": 32, "hidden_size": 4544, "num_attention_heads": 71,
             "multi_query": True, "new_decoder_architecture": False}          # tiiuae/falcon-7b's config.json
FALCON_40B = {"model_type": "falcon", "num_hidden_layers": 60, "hidden_size": 8192, "num_attention_heads": 128,
              "num_kv_heads": 8, "new_decoder_architecture": True}            # tiiuae/falcon-40b's


@pytest.mark.parametrize("config", [
    FALCON_7B, FALCON_40B,
    {**FALCON_7B, "multi_query": False},                                     # Falcon-RW: every head its own
    {key: value for key, value in FALCON_7B.items() if key != "multi_query"},   # multi_query's default: True
    {**FALCON_40B, "new_decoder_architecture": False, "multi_query": True},  # num_kv_heads then ignored
])
def test_falcon_configs_are_read_as_hugging_faces_falcon_config_reads_them(config):
    from transformers import FalconConfig

    expected = FalconConfig(**config).num_key_value_heads
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    found = cache_size_from_config(config)
    assert found.per_layer == 2 * expected * head_dim and found.num_layers == config["num_hidden_layers"]


def test_falcon_7b_is_multi_query_not_multi_head():
    """The issue's numbers: 4,096 cached elements per token, not 290,816 (71 heads of 64, 32 layers)."""
    found = cache_size_from_config(FALCON_7B)
    assert (found.kind, found.elements_per_token) == ("MQA", 4096)


@pytest.mark.parametrize("multi_query", [True, False])
def test_gpt_bigcode_configs_with_gpt2_names_are_read_as_hugging_face_reads_them(multi_query):
    from transformers import GPTBigCodeConfig

    config = {"model_type": "gpt_bigcode", "n_layer": 40, "n_embd": 6144, "n_head": 48, "multi_query": multi_query}
    expected = GPTBigCodeConfig(**config).num_key_value_heads                 # StarCoder: 1
    found = cache_size_from_config(config)
    assert (found.per_layer, found.num_layers) == (2 * expected * 128, 40)


def test_chatglm_query_groups_are_read():
    config = {"num_hidden_layers": 28, "hidden_size": 4096, "num_attention_heads": 32,
              "multi_query_attention": True, "multi_query_group_num": 2}     # ChatGLM2's two fields
    assert cache_size_from_config(config).per_layer == 2 * 2 * 128


def test_a_way_of_naming_key_value_heads_it_cannot_read_is_refused():
    config = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_query_groups": 2}
    with pytest.raises(ValueError, match="marks its key/value heads with num_query_groups"):
        cache_size_from_config(config)


def test_key_value_heads_left_null_mean_every_head_its_own():
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": None,
              "multi_query_attention": False}
    assert cache_size_from_config(config).kind == "MHA"
