"""attn_course.models.hugging_face: the one loading module (names, checks, safetensors, config files).

Each model's parity with Hugging Face is tested beside the model (test_bert.py, test_llama.py,
tests/variants/test_latent_attention.py); here, what all of them share, on small hand-made inputs.
"""

from __future__ import annotations

import json

import pytest
import torch

from attn_course.models.bert import BertConfig
from attn_course.models.hugging_face import (
    NameMap,
    check_required,
    check_supported,
    check_weights,
    match_hugging_face,
    read_checkpoint,
)
from attn_course.models.hugging_face.llama import match_llama
from attn_course.models.llama import LlamaConfig

NAMES = NameMap("Tiny", top={"embedding": "embed_tokens"}, layer={"attention.q_proj": "self_attn.q_proj"},
                ours_layers="blocks", theirs_layers="layers")


def test_a_name_map_renames_layers_and_top_level_modules():
    assert NAMES.hugging_face_name("blocks.11.attention.q_proj.bias") == "layers.11.self_attn.q_proj.bias"
    assert NAMES.hugging_face_name("embedding.weight") == "embed_tokens.weight"


@pytest.mark.parametrize("name", ["blocks.x.attention.q_proj.weight", "blocks.0.attention.k_proj.weight",
                                  "embedding.scale", "embedding", "", "attention.q_proj.weight"])
def test_a_name_the_map_does_not_know_is_refused_with_the_model_named(name):
    with pytest.raises(ValueError, match=r"^hugging_face_name: .* is not a parameter of Tiny$"):
        NAMES.hugging_face_name(name)


def test_every_problem_is_named_at_once():
    stored = {"a": torch.zeros(2), "b": torch.zeros(3, dtype=torch.int64), "extra": torch.zeros(1),
              "pooler.w": torch.zeros(1)}
    shapes = {"a": (3,), "b": (3,), "c": (1,)}
    with pytest.raises(ValueError) as error:
        check_weights(stored, shapes, source="f.safetensors", model="this Tiny", caller="load",
                      ignore=lambda name: name.startswith("pooler."), problems=["a problem found before"])
    assert str(error.value) == ("load: the weights in f.safetensors do not fit this Tiny: a problem found before; "
                                "missing weight(s): c; unexpected weight(s): extra; wrong shape(s): a [2] "
                                "(expected [3]); non-floating weight(s): b (torch.int64)")


def test_a_long_list_of_problems_is_cut_after_eight_names():
    shapes = {f"w{i:02d}": (1,) for i in range(11)}
    with pytest.raises(ValueError, match=r"missing weight\(s\): w00, w01, w02, w03, w04, w05, w06, w07 and 3 more$"):
        check_weights({}, shapes, source="f", model="m")


def test_entries_that_are_not_tensors_and_a_state_that_is_not_a_mapping_are_refused():
    with pytest.raises(TypeError, match=r"f\['a'\] must be a torch.Tensor, got list"):
        check_weights({"a": [1.0]}, {"a": (1,)}, source="f", model="m")
    with pytest.raises(TypeError, match="must be a mapping of names to tensors, got list"):
        check_weights([], {}, source="f", model="m")


def test_matching_returns_the_stored_tensors_under_our_names():
    stored = {"layers.0.self_attn.q_proj.weight": torch.randn(4, 4), "embed_tokens.weight": torch.randn(9, 4)}
    expected = {"blocks.0.attention.q_proj.weight": torch.empty(4, 4), "embedding.weight": torch.empty(9, 4)}
    matched = match_hugging_face(stored, expected, NAMES, source="f", model="m")
    assert matched["blocks.0.attention.q_proj.weight"] is stored["layers.0.self_attn.q_proj.weight"]
    assert matched["embedding.weight"] is stored["embed_tokens.weight"]
    with pytest.raises(TypeError, match="names must be a NameMap, got dict"):
        match_hugging_face(stored, expected, {}, source="f", model="m")


def test_a_tied_llama_head_equal_to_the_embedding_is_accepted_and_a_bare_model_gets_its_prefix():
    embedding = torch.randn(9, 4)
    expected = {"model.embedding.weight": torch.empty(9, 4), "lm_head.weight": torch.empty(9, 4)}
    full = {"model.embed_tokens.weight": embedding, "lm_head.weight": embedding.clone()}
    matched = match_llama(full, expected, tied=True, source="f")
    assert list(matched) == ["model.embedding.weight"] and matched["model.embedding.weight"] is embedding
    bare = {"embed_tokens.weight": embedding, "layers.0.self_attn.rotary_emb.inv_freq": torch.ones(2)}
    assert list(match_llama(bare, expected, tied=True, source="f")) == ["model.embedding.weight"]
    with pytest.raises(ValueError, match="missing weight\\(s\\): lm_head.weight"):
        match_llama(bare, expected, tied=False, source="f")


def test_a_checkpoint_is_read_from_shards_and_a_broken_index_or_a_pickle_is_named(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.ones(2)}, tmp_path / "one.safetensors")
    save_file({"b": torch.zeros(3)}, tmp_path / "two.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "one.safetensors", "b": "two.safetensors"}}))
    tensors, source = read_checkpoint(tmp_path)
    assert sorted(tensors) == ["a", "b"] and torch.equal(tensors["b"], torch.zeros(3))
    assert source.endswith("(shards of model.safetensors.index.json)")
    index.write_text(json.dumps({"weights": {}}))
    with pytest.raises(ValueError, match="is not a safetensors index with a weight_map"):
        read_checkpoint(tmp_path)
    index.unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="lacks model.safetensors .*a pickle, which this loader never opens"):
        read_checkpoint(tmp_path)


def test_every_config_reads_its_file_through_the_one_from_json_file(tmp_path):
    assert BertConfig.from_json_file.__func__ is LlamaConfig.from_json_file.__func__
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="^LlamaConfig.from_json_file: .* is not valid JSON"):
        LlamaConfig.from_json_file(path)
    path.write_text(json.dumps({"model_type": "bert", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
                                "num_attention_heads": 2, "intermediate_size": 16}))
    assert BertConfig.from_json_file(path) == BertConfig(10, 8, 1, 2, 16)
    with pytest.raises(FileNotFoundError, match="^BertConfig.from_json_file: no config file"):
        BertConfig.from_json_file(tmp_path / "missing.json")


def test_unsupported_settings_and_missing_fields_are_named():
    supported = {"hidden_act": ("gelu", ("gelu",)), "model_type": (None, ("llama", None))}
    check_supported({}, supported, model="Tiny", source="c", where="w")                  # defaults pass
    with pytest.raises(ValueError, match="^w: unsupported config in c: model_type='qwen2'; this Tiny supports only "
                                         "model_type='llama'$"):
        check_supported({"model_type": "qwen2"}, supported, model="Tiny", source="c", where="w")
    with pytest.raises(ValueError, match="^w: c lacks the required field\\(s\\) hidden_size, intermediate_size"):
        check_required(LlamaConfig, {"vocab_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1},
                       source="c", where="w")
