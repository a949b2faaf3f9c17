"""attn_course.variants.layout_cache_size: layer kinds against Hugging Face's own config classes, whole-model
counts against the caches Hugging Face's models fill, and the four published configs against plain formulas."""

from __future__ import annotations

import inspect
import json
import pathlib

import pytest
import torch

from attn_course.variants.layout_cache_size import (
    PUBLISHED_CONFIGS,
    LayoutCache,
    cache_elements_by_layout,
    layer_kinds,
    linear_state_elements,
    published_config,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDER = ROOT / "attn_course" / "data" / "published_configs"


def read(name: str) -> dict:
    """A published config as the file holds it (read here, not through the module under test)."""
    return json.loads((FOLDER / f"{name}.json").read_text(encoding="utf-8"))


# --- which layer is which kind, against Hugging Face's config classes ------------------------------------------


@pytest.mark.parametrize(("kwargs", "ours"), [
    ({"num_hidden_layers": 62, "sliding_window_pattern": 6}, {"num_hidden_layers": 62, "sliding_window_pattern": 6}),
    ({"num_hidden_layers": 26, "sliding_window_pattern": 4}, {"num_hidden_layers": 26, "sliding_window_pattern": 4}),
    # no pattern given: Hugging Face takes 6, which the published file writes out (its README says why)
    ({"num_hidden_layers": 7}, {"num_hidden_layers": 7, "sliding_window_pattern": 6}),
])
def test_gemma_3_layout_is_read_as_gemma3_text_config_builds_it(kwargs, ours):
    from transformers import Gemma3TextConfig

    assert layer_kinds(ours) == Gemma3TextConfig(**kwargs).layer_types


@pytest.mark.parametrize(("layers", "interval"), [(48, 4), (10, 3), (5, 1)])
def test_qwen3_next_layout_is_read_as_qwen3_next_config_builds_it(layers, interval):
    from transformers import Qwen3NextConfig

    expected = Qwen3NextConfig(num_hidden_layers=layers, full_attention_interval=interval).layer_types
    assert layer_kinds({"num_hidden_layers": layers, "full_attention_interval": interval}) == expected


def test_qwen3_without_a_window_is_full_attention_everywhere_as_qwen3_config_says():
    from transformers import Qwen3Config

    expected = Qwen3Config(num_hidden_layers=36, use_sliding_window=False, sliding_window=4096).layer_types
    assert layer_kinds({"num_hidden_layers": 36, "sliding_window": 4096, "use_sliding_window": False}) == expected


@pytest.mark.parametrize(("name", "class_name"), [
    ("qwen3-8b", "Qwen3Config"), ("gemma-3-27b-it", "Gemma3TextConfig"), ("gpt-oss-120b", "GptOssConfig"),
    ("qwen3-next-80b-a3b-instruct", "Qwen3NextConfig"),
])
def test_each_published_file_is_read_as_its_own_config_class_reads_it(name, class_name):
    import transformers

    config = read(name)
    theirs = getattr(transformers, class_name)(**config)
    assert layer_kinds(config) == list(theirs.layer_types)
    assert layer_kinds(theirs) == list(theirs.layer_types)          # the config object, through to_dict()


def test_gpt_oss_published_layout_is_hugging_faces_default_alternation():
    from transformers import GptOssConfig

    assert read("gpt-oss-120b")["layer_types"] == GptOssConfig(num_hidden_layers=36).layer_types


# --- whole-model counts against the cache a small random model fills ----------------------------------------------


def tiny_models():
    """(name, config, model class) of four small random models, one per family, windows of 8 tokens."""
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        GptOssConfig,
        GptOssForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3NextConfig,
        Qwen3NextForCausalLM,
    )

    shared = dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    return [
        ("qwen3", Qwen3Config(intermediate_size=64, num_hidden_layers=3, **shared), Qwen3ForCausalLM),
        ("gemma3", Gemma3TextConfig(intermediate_size=64, num_hidden_layers=6, sliding_window=8,
                                    sliding_window_pattern=3, **shared), Gemma3ForCausalLM),
        ("gpt_oss", GptOssConfig(intermediate_size=32, num_hidden_layers=4, sliding_window=8, num_local_experts=4,
                                 num_experts_per_tok=2, **shared), GptOssForCausalLM),
        ("qwen3_next", Qwen3NextConfig(intermediate_size=64, num_hidden_layers=4, linear_num_key_heads=2,
                                       linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
                                       linear_conv_kernel_dim=3, num_experts=4, num_experts_per_tok=2,
                                       moe_intermediate_size=16, shared_expert_intermediate_size=16, **shared),
         Qwen3NextForCausalLM),
    ]


def filled_cache(model, tokens: int, batch: int):
    """The cache after a prefill of ``tokens - 1`` tokens and one decoding step."""
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens))
    with torch.no_grad():
        out = model(ids[:, :-1], use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        model(ids[:, -1:], use_cache=True, **{name: cache})
    return cache


def held(layer) -> list[torch.Tensor]:
    """Every tensor a cache layer holds: keys and values, or a linear layer's conv and recurrent states."""
    tensors = [getattr(layer, name, None) for name in ("keys", "values")]
    for name in ("conv_states", "recurrent_states"):
        tensors += list((getattr(layer, name, None) or {}).values())
    return [tensor for tensor in tensors if isinstance(tensor, torch.Tensor)]


@pytest.mark.parametrize("index", range(4), ids=["qwen3", "gemma3", "gpt_oss", "qwen3_next"])
def test_counts_match_the_cache_each_hugging_face_model_fills(index):
    torch.manual_seed(0)
    _, config, model_class = tiny_models()[index]
    model = model_class(config).eval()
    tokens, batch = 21, 2                                           # more tokens than the window of 8
    cache = filled_cache(model, tokens, batch)
    per_kind = {"full_attention": 0, "sliding_attention": 0, "linear_attention": 0}
    for kind, layer in zip(config.layer_types, cache.layers):
        per_kind[kind] += sum(tensor.numel() for tensor in held(layer)) // batch
    found = cache_elements_by_layout(config, tokens)
    assert (found.full_elements, found.sliding_elements, found.linear_elements) == tuple(per_kind.values())
    stored = sum(tensor.numel() * tensor.element_size() for layer in cache.layers for tensor in held(layer))
    assert found.bytes(batch=batch, bits_per_element=32) == stored  # a float32 model


def test_a_linear_layer_keeps_the_same_state_after_more_tokens():
    _, config, model_class = tiny_models()[3]
    torch.manual_seed(0)
    model = model_class(config).eval()
    linear = [index for index, kind in enumerate(config.layer_types) if kind == "linear_attention"]
    sizes = {tokens: sum(t.numel() for t in held(filled_cache(model, tokens, 1).layers[linear[0]]))
             for tokens in (5, 30)}
    assert sizes[5] == sizes[30] == linear_state_elements(config)


# --- the four published configs, against plain formulas -------------------------------------------------------


def plain_formula(name: str, tokens: int) -> int:
    """Elements per sequence, written out model by model from the file's numbers (2 = a key and a value)."""
    c = read(name)
    key_value = 2 * c["num_key_value_heads"] * c["head_dim"]
    if name == "qwen3-8b":                                          # every layer full
        return c["num_hidden_layers"] * key_value * tokens
    if name == "gemma-3-27b-it":                                    # one global layer in six
        full = c["num_hidden_layers"] // c["sliding_window_pattern"]
        sliding = c["num_hidden_layers"] - full
        return full * key_value * tokens + sliding * key_value * min(tokens, c["sliding_window"] - 1)
    if name == "gpt-oss-120b":                                      # alternating
        full = c["layer_types"].count("full_attention")
        sliding = c["layer_types"].count("sliding_attention")
        return full * key_value * tokens + sliding * key_value * min(tokens, c["sliding_window"] - 1)
    full = c["num_hidden_layers"] // c["full_attention_interval"]   # Qwen3-Next: one full layer in four
    linear = c["num_hidden_layers"] - full
    state = c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"]
    channels = 2 * c["linear_num_key_heads"] * c["linear_key_head_dim"] + (
        c["linear_num_value_heads"] * c["linear_value_head_dim"])
    return full * key_value * tokens + linear * (state + channels * c["linear_conv_kernel_dim"])


@pytest.mark.parametrize("tokens", [4096, 32768, 131072])
@pytest.mark.parametrize("name", PUBLISHED_CONFIGS)
def test_published_configs_agree_with_the_plain_formula(name, tokens):
    assert cache_elements_by_layout(published_config(name), tokens).elements == plain_formula(name, tokens)


def test_at_128k_tokens_qwen3_next_keeps_the_smallest_cache_and_qwen3_8b_the_largest():
    order = sorted(PUBLISHED_CONFIGS, key=lambda name: plain_formula(name, 131072))
    assert order == ["qwen3-next-80b-a3b-instruct", "gpt-oss-120b", "gemma-3-27b-it", "qwen3-8b"]
    sizes = {name: cache_elements_by_layout(published_config(name), 131072).elements for name in PUBLISHED_CONFIGS}
    assert sorted(sizes, key=sizes.get) == order


def test_at_4k_tokens_gemma_3_keeps_more_than_qwen3_8b():
    """Its 52 sliding layers are full at 1,023 tokens each: at 4k the window saves less than 16 key/value heads cost."""
    assert plain_formula("gemma-3-27b-it", 4096) > plain_formula("qwen3-8b", 4096)
    assert plain_formula("gemma-3-27b-it", 32768) < plain_formula("qwen3-8b", 32768)


def test_every_published_file_is_listed_sourced_and_packaged():
    assert sorted(path.stem for path in FOLDER.glob("*.json")) == sorted(PUBLISHED_CONFIGS)
    readme = (FOLDER / "README.md").read_text(encoding="utf-8")
    for name in PUBLISHED_CONFIGS:
        assert f"`{name}.json`" in readme
        assert published_config(name) == read(name)
        assert {"model_type", "architectures", "num_hidden_layers"} <= set(read(name))
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"data/published_configs/*.json"' in pyproject


def test_full_layers_use_cache_size_from_config_so_latent_attention_counts_too():
    from attn_course.variants.kv_cache_size import DEEPSEEK_V2, cache_size_from_config

    found = cache_elements_by_layout(DEEPSEEK_V2, 1000)
    assert (found.full_layers, found.elements) == (60, cache_size_from_config(DEEPSEEK_V2).elements_per_token * 1000)


def test_a_multimodal_config_is_read_through_its_text_config():
    gemma = read("gemma-3-27b-it")
    assert cache_elements_by_layout({"model_type": "gemma3", "text_config": gemma}, 4096) == (
        cache_elements_by_layout(gemma, 4096))


# --- what it refuses -----------------------------------------------------------------------------------------


def test_cache_elements_by_layout_checks_its_arguments():
    qwen = read("qwen3-8b")
    with pytest.raises(ValueError, match=r"^cache_elements_by_layout: tokens must be >= 1"):
        cache_elements_by_layout(qwen, 0)
    with pytest.raises(TypeError, match=r"^cache_elements_by_layout: tokens must be an int"):
        cache_elements_by_layout(qwen, 4096.0)
    with pytest.raises(TypeError, match=r"^cache_elements_by_layout: config must be a mapping"):
        cache_elements_by_layout("Qwen/Qwen3-8B", 4096)
    with pytest.raises(ValueError, match="lacks num_hidden_layers"):
        cache_elements_by_layout({"num_attention_heads": 4}, 4096)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        LayoutCache(1, 1, 0, 0, 1, 0, 0).bytes(batch=0)
    with pytest.raises(ValueError, match="bits_per_element must be a positive finite number"):
        LayoutCache(1, 1, 0, 0, 1, 0, 0).bytes(bits_per_element=0)


def test_layouts_it_cannot_read_are_refused_not_guessed():
    base = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
    with pytest.raises(ValueError, match="layer_types holds 'chunked_attention'"):
        layer_kinds({**base, "layer_types": ["chunked_attention", "full_attention"]})
    with pytest.raises(ValueError, match="layer_types must have 2 labels, got 3"):
        layer_kinds({**base, "layer_types": ["full_attention"] * 3})
    with pytest.raises(ValueError, match="attention_chunk_size"):                         # Llama 4
        layer_kinds({**base, "attention_chunk_size": 8192})
    with pytest.raises(ValueError, match="sliding_window=4096 but says neither"):           # Mistral or Gemma 2?
        layer_kinds({**base, "sliding_window": 4096})
    with pytest.raises(ValueError, match="use_sliding_window=True"):
        layer_kinds({**base, "sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 1})
    with pytest.raises(ValueError, match="lacks sliding_window"):
        cache_elements_by_layout({**base, "layer_types": ["sliding_attention", "full_attention"]}, 10)
    with pytest.raises(ValueError, match="lacks linear_conv_kernel_dim"):
        next_config = read("qwen3-next-80b-a3b-instruct")
        del next_config["linear_conv_kernel_dim"]
        cache_elements_by_layout(next_config, 10)


def test_published_config_checks_its_name():
    with pytest.raises(ValueError, match=r"^published_config: name must be one of qwen3-8b"):
        published_config("llama-3-8b")
    with pytest.raises(TypeError, match=r"^published_config: name must be a str, got int"):
        published_config(8)
