"""attn_course.models.load_pretrained against Hugging Face ``transformers`` (5.25, eager attention).

Each reference is a small random ``AutoModelForCausalLM.from_config`` model (Llama, Mistral with a window
shorter than the inputs, Qwen3 with ``H · d != E``: plain, with attention biases, with tied embeddings, with
sliding layers), its weights redrawn larger than Hugging Face's initialisation and every norm's weight
(Qwen3's ``q_norm`` and ``k_norm`` included) moved off 1, saved with ``save_pretrained`` and read back by
the one entry point, which picks the family by ``model_type``. Logits must agree to float32 round-off,
and greedy decoding with our KV caches must choose Hugging Face's tokens.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from attn_course.core.qk_norm import HeadNormLinear
from attn_course.models import load_pretrained
from attn_course.models.llama import LlamaConfig, LlamaForCausalLM

transformers = pytest.importorskip("transformers")

#: Largest ``max|ours - theirs| / max|theirs|`` of the logits: float32 round-off, not a looser agreement.
RELATIVE_TOLERANCE = 1e-5
VOCAB = 97
SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
#: ``name: (config class, overrides)``; Qwen3's heads are 32 wide, so ``H · d = 128`` while ``E = 64``.
CASES = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", dict(sliding_window=4)),
    "qwen3": ("Qwen3Config", dict(head_dim=32)),
    "qwen3-bias": ("Qwen3Config", dict(head_dim=32, attention_bias=True)),
    "qwen3-tied": ("Qwen3Config", dict(head_dim=32, tie_word_embeddings=True)),
    "qwen3-sliding": ("Qwen3Config", dict(head_dim=32, num_hidden_layers=3, use_sliding_window=True,
                                          sliding_window=4, max_window_layers=1)),
}


def reference_model(name: str, seed: int = 0):
    """A seeded random Hugging Face model in eval mode: weights of std 0.1, norms' weights around 1."""
    config_class, overrides = CASES[name]
    config = getattr(transformers, config_class)(**{**SIZES, **overrides}, bos_token_id=None, eos_token_id=None,
                                                 pad_token_id=None)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("norm.weight"):
                parameter.copy_(1 + 0.2 * torch.randn_like(parameter))
            else:
                parameter.normal_(0.0, 0.1)
    return model


@pytest.fixture(scope="module", params=list(CASES))
def loaded(request, tmp_path_factory):
    """``(case name, Hugging Face model, ours loaded from its folder)``."""
    reference = reference_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    with contextlib.redirect_stderr(io.StringIO()):             # the "Writing model shards" bar
        reference.save_pretrained(folder, safe_serialization=True)
    return request.param, reference, load_pretrained(folder)


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours.double() - theirs.double()).abs().max() / theirs.double().abs().max()).item()


def test_the_family_is_chosen_by_model_type_and_reads_the_config(loaded):
    name, reference, ours = loaded
    config = ours.config
    assert isinstance(ours, LlamaForCausalLM) and not ours.training
    assert config.qk_norm == name.startswith("qwen3")
    assert config.head_dim == reference.config.head_dim
    assert config.attention_bias == (name == "qwen3-bias")
    assert (ours.lm_head.weight is ours.model.embedding.weight) == (name == "qwen3-tied")
    windows = [block.sliding_window for block in ours.model.blocks]
    expected = {"mistral": [4, 4], "qwen3-sliding": [None, 4, 4]}.get(name, [None] * config.num_hidden_layers)
    assert windows == expected


def test_qk_norm_weights_are_read_from_q_norm_and_k_norm(loaded):
    name, reference, ours = loaded
    for block, layer in zip(ours.model.blocks, reference.model.layers):
        if not name.startswith("qwen3"):                        # Llama and Mistral: plain projections
            assert not isinstance(block.attention.q_proj, HeadNormLinear)
            continue
        assert torch.equal(block.attention.q_proj.norm.weight, layer.self_attn.q_norm.weight)
        assert torch.equal(block.attention.k_proj.norm.weight, layer.self_attn.k_norm.weight)
        assert not torch.equal(layer.self_attn.q_norm.weight, torch.ones_like(layer.self_attn.q_norm.weight))


def test_logits_match_hugging_face_to_float32_round_off(loaded):
    _, reference, ours = loaded
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))   # N = 9 > window 4
    with torch.no_grad():
        theirs = reference(ids).logits                                                  # [B, N, V]
        mine = ours(ids).logits
    assert mine.shape == (2, 9, VOCAB)
    assert relative_error(mine, theirs) < RELATIVE_TOLERANCE


def test_greedy_generation_matches_hugging_face_generate(loaded):
    _, reference, ours = loaded
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)                                  # no token is taken for padding
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                                    output_logits=True, return_dict_in_generate=True)
    mine = ours.generate(ids, 5, attention_mask=mask)
    assert mine.sequences.tolist() == theirs.sequences.tolist()
    assert relative_error(mine.logits, torch.stack(theirs.logits, dim=1)) < RELATIVE_TOLERANCE


def test_a_left_padded_qwen3_batch_generates_as_hugging_face(tmp_path):
    reference = reference_model("qwen3", seed=3)
    with contextlib.redirect_stderr(io.StringIO()):
        reference.save_pretrained(tmp_path, safe_serialization=True)
    ours = load_pretrained(tmp_path, dtype=torch.float64)
    assert ours.lm_head.weight.dtype == torch.float64
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert ours.generate(ids, 4, attention_mask=mask).sequences.tolist() == theirs.tolist()


# --- what is refused -------------------------------------------------------------------------------


def write_config(folder, values) -> None:
    (folder / "config.json").write_text(json.dumps(values), encoding="utf-8")


def test_an_unknown_model_type_is_refused_with_the_ones_it_reads(tmp_path):
    write_config(tmp_path, {"model_type": "gpt_oss", "hidden_size": 64})
    with pytest.raises(ValueError, match="load_pretrained: .*config.json has model_type='gpt_oss'; this course "
                                         "loads model_type 'llama', 'mistral', 'qwen3', 'gemma3_text', 'gemma3'$"):
        load_pretrained(tmp_path)
    write_config(tmp_path, {"hidden_size": 64})
    with pytest.raises(ValueError, match="has model_type=None"):
        load_pretrained(tmp_path)
    write_config(tmp_path, [1, 2])
    with pytest.raises(ValueError, match="must hold a JSON object, got list"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_pretrained(tmp_path)


def test_missing_files_and_a_bad_dtype_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="load_pretrained: the model folder .* does not exist"):
        load_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="load_pretrained: .* lacks config.json"):
        load_pretrained(tmp_path)
    (tmp_path / "file").write_text("", encoding="utf-8")
    with pytest.raises(NotADirectoryError, match="is not a folder"):
        load_pretrained(tmp_path / "file")
    with pytest.raises(TypeError, match="load_pretrained: folder must be a str or pathlib.Path, got int"):
        load_pretrained(3)
    for dtype in (torch.int64, "float32"):
        with pytest.raises(TypeError, match="load_pretrained: dtype must be a floating torch.dtype"):
            load_pretrained(tmp_path, dtype=dtype)
    write_config(tmp_path, {"model_type": "qwen3", **SIZES})
    with pytest.raises(FileNotFoundError, match="lacks model.safetensors"):
        load_pretrained(tmp_path)


QWEN3 = {"model_type": "qwen3", **SIZES, "head_dim": 32}


@pytest.mark.parametrize("overrides, error, message", [
    (dict(layer_types=["full_attention", "sliding_attention"]), ValueError,
     "layer_types marks sliding layers but use_sliding_window=False and sliding_window=4096 give no window"),
    (dict(layer_types=["full_attention"]), ValueError,
     "layer_types must have one entry per layer .num_hidden_layers=2., got 1"),
    (dict(layer_types=["full_attention", "linear_attention"]), ValueError, "layer_types holds 'linear_attention'"),
    (dict(hidden_act="gelu"), ValueError, "hidden_act='gelu'; this Llama supports only hidden_act='silu'"),
    (dict(mlp_bias=True), ValueError, "mlp_bias=True"),
    (dict(partial_rotary_factor=0.5), ValueError, "partial_rotary_factor=0.5"),
    (dict(max_window_layers="1", use_sliding_window=True, sliding_window=4), TypeError,
     "max_window_layers must be an int, got str"),
])
def test_a_qwen3_setting_that_is_not_reproduced_is_named(overrides, error, message):
    with pytest.raises(error, match=message):
        LlamaConfig.from_dict({**QWEN3, **overrides}, source="config.json")


def test_qwen3_reads_hugging_faces_defaults_and_derives_its_layer_types():
    values = {key: value for key, value in QWEN3.items() if key not in ("head_dim", "num_key_value_heads")}
    config = LlamaConfig.from_dict({**values, "num_attention_heads": 32})
    assert (config.head_dim, config.num_key_value_heads, config.sliding_window) == (128, 32, None)
    assert config.layer_types == ("full_attention", "full_attention")
    slides = LlamaConfig.from_dict({**QWEN3, "num_hidden_layers": 4, "use_sliding_window": True,
                                    "sliding_window": 8, "max_window_layers": 2})
    assert [slides.layer_window(i) for i in range(4)] == [None, None, 8, 8]
    # Hugging Face's Qwen3Config ignores sliding_window without use_sliding_window.
    assert LlamaConfig.from_dict({**QWEN3, "sliding_window": 8}).sliding_window is None


def test_a_llama_config_reads_and_prints_as_before():
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    assert repr(config) == (
        "LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, "
        "num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-06, rope_theta=10000.0, rope_scaling=None, "
        "max_position_embeddings=2048, tie_word_embeddings=False, attention_dropout=0.0, sliding_window=None)")
    qwen = LlamaConfig(vocab_size=10, hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=4, head_dim=32, qk_norm=True)
    assert repr(qwen).endswith("sliding_window=None, head_dim=32, qk_norm=True)")


@pytest.mark.parametrize("overrides, error, message", [
    (dict(head_dim=0), ValueError, "LlamaConfig: head_dim must be >= 1, got 0"),
    (dict(head_dim=9), ValueError, "the head size head_dim = 9 must be even"),
    (dict(qk_norm=1), TypeError, "LlamaConfig: qk_norm must be a bool, got int"),
    (dict(attention_bias="yes"), TypeError, "LlamaConfig: attention_bias must be a bool, got str"),
    (dict(layer_types="full_attention"), TypeError, "LlamaConfig: layer_types must be a sequence of strings"),
    (dict(layer_types=["sliding_attention"]), ValueError, "layer_types marks sliding layers but sliding_window"),
])
def test_bad_qwen3_fields_are_named(overrides, error, message):
    with pytest.raises(error, match=message):
        LlamaConfig(**{**dict(vocab_size=10, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=4), **overrides})
