"""attn_course.models.load_pretrained on Gemma 3 folders, against Hugging Face ``transformers`` (5.25, eager attention).

Each reference is a small random ``Gemma3ForCausalLM`` (``model_type`` ``"gemma3_text"``): five layers, sliding and
global mixed, a window of 4 shorter than the inputs, ``H · d = 128 != E = 64``, two key/value heads for four
query heads, ``query_pre_attn_scalar`` not ``d``, a local rotary base other than the global one, and in one case
linear rotary scaling on the global layers. Its weights are redrawn larger than Hugging Face's initialisation and
every norm's weight (``1 + w``, so ``w``) moved off 0; it is saved with ``save_pretrained`` and read back by the
one entry point, which picks Gemma 3 by ``model_type``. Logits must agree to float32 round-off and greedy decoding
must choose Hugging Face's tokens. A multimodal ``"gemma3"`` folder loads its language model alone.
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
import torch

from attn_course.models import load_pretrained
from attn_course.models.gemma3 import Gemma3Config, Gemma3ForCausalLM

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

#: Largest ``max|ours - theirs| / max|theirs|`` of the logits: float32 round-off, not a looser agreement.
RELATIVE_TOLERANCE = 1e-5
VOCAB = 97
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]
SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=5, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24, sliding_window=4, layer_types=LAYER_TYPES,
             rope_theta=50_000.0, rope_local_base_freq=7_000.0, max_position_embeddings=64)
#: ``name: overrides``; "softcap" caps the logits at 2 (Gemma 2's form; None in Gemma 3's checkpoints).
CASES = {
    "plain": {},
    "rope-linear": dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "softcap": dict(final_logit_softcapping=2.0),
}


def text_config(name: str):
    config = transformers.Gemma3TextConfig(**{**SIZES, **CASES[name]}, bos_token_id=None, eos_token_id=None,
                                           pad_token_id=None)
    config._attn_implementation = "eager"
    return config


def randomise(model, seed: int) -> None:
    """Weights of std 0.1 (the embedding's 0.5), every norm's offset ``w`` of std 0.2."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("norm.weight"):
                parameter.normal_(0.0, 0.2)
            else:
                parameter.normal_(0.0, 0.5 if "embed_tokens" in parameter_name else 0.1)


def reference_model(name: str, seed: int = 0):
    """A seeded random Hugging Face ``Gemma3ForCausalLM`` in eval mode."""
    model = transformers.AutoModelForCausalLM.from_config(text_config(name)).eval()
    randomise(model, seed)
    return model


def save(model, folder) -> None:
    with contextlib.redirect_stderr(io.StringIO()):             # the "Writing model shards" bar
        model.save_pretrained(folder, safe_serialization=True)


@pytest.fixture(scope="module", params=list(CASES))
def loaded(request, tmp_path_factory):
    """``(case name, Hugging Face model, ours loaded from its folder)``."""
    reference = reference_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    save(reference, folder)
    return request.param, reference, load_pretrained(folder)


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours.double() - theirs.double()).abs().max() / theirs.double().abs().max()).item()


def test_gemma3_text_is_chosen_by_model_type_and_reads_every_layers_attention(loaded):
    name, reference, ours = loaded
    assert isinstance(ours, Gemma3ForCausalLM) and not ours.training
    assert ours.config.layer_types == tuple(LAYER_TYPES)
    assert ours.lm_head.weight is ours.embedding.weight
    for block, layer in zip(ours.blocks, reference.model.layers):
        config = block.attention.config
        assert config.window == layer.self_attn.sliding_window
        assert (config.num_heads, config.num_kv_heads, config.head_dim) == (4, 2, 32)
        assert config.softmax_scale == pytest.approx(24 ** -0.5)
        assert config.rope_base == (7_000.0 if config.window else 50_000.0)
        scaled = name == "rope-linear" and config.window is None
        assert (config.rope_scaling is not None) == scaled
        assert torch.equal(block.attention.q_proj.norm.weight, layer.self_attn.q_norm.weight)
        assert torch.equal(block.attention_output_norm.weight, layer.post_attention_layernorm.weight)
    assert ours.config.final_logit_softcapping == (2.0 if name == "softcap" else None)


def test_logits_match_hugging_face_to_float32_round_off(loaded):
    _, reference, ours = loaded
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))   # N = 11 > window 4
    with torch.no_grad():
        theirs = reference(ids).logits                                                   # [B, N, V]
        mine = ours(ids).logits
    assert mine.shape == (2, 11, VOCAB)
    error = relative_error(mine, theirs)
    print(f"relative logits error: {error:.2e}")
    assert error < RELATIVE_TOLERANCE


def test_greedy_generation_matches_hugging_face_generate(loaded):
    _, reference, ours = loaded
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                    output_logits=True, return_dict_in_generate=True)
    mine = ours.generate(ids, 6)
    assert mine.sequences.tolist() == theirs.sequences.tolist()
    assert relative_error(mine.logits, torch.stack(theirs.logits, dim=1)) < RELATIVE_TOLERANCE


def test_a_multimodal_gemma3_folder_loads_its_language_model(tmp_path):
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=text_config("rope-linear").to_dict(), vision_config=vision.to_dict(),
                                       mm_tokens_per_image=4)
    config._attn_implementation = "eager"
    reference = transformers.Gemma3ForConditionalGeneration(config).eval()
    randomise(reference, seed=3)
    save(reference, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gemma3"
    ours = load_pretrained(tmp_path, dtype=torch.float64)
    assert isinstance(ours, Gemma3ForCausalLM) and ours.lm_head.weight.dtype == torch.float64
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        theirs = reference(input_ids=ids).logits
    assert relative_error(ours(ids).logits, theirs) < RELATIVE_TOLERANCE


# --- what is read from older files, and what is refused ------------------------------------------------


def write_config(folder, values) -> None:
    (folder / "config.json").write_text(json.dumps(values), encoding="utf-8")


TEXT = {"model_type": "gemma3_text", **{key: value for key, value in SIZES.items() if key != "layer_types"}}


def test_an_older_config_json_reads_as_transformers_fills_it_in():
    # No layer_types: every sliding_window_pattern-th layer is global (transformers' default pattern is 6).
    config = Gemma3Config.from_dict({**TEXT, "sliding_window_pattern": 2,
                                     "rope_scaling": {"type": "linear", "factor": 8.0}})
    reference = transformers.Gemma3TextConfig(**{**SIZES, "layer_types": None}, sliding_window_pattern=2)
    assert list(config.layer_types) == reference.layer_types
    assert [layer.rope_base for layer in config.attention] == [7_000.0, 50_000.0] * 2 + [7_000.0]
    assert {layer.rope_scaling.factor for layer in config.attention if layer.window is None} == {8.0}
    assert Gemma3Config.from_dict({**TEXT, "num_hidden_layers": 7}).layer_types[5:] == ("full_attention",
                                                                                        "sliding_attention")


@pytest.mark.parametrize("overrides, error, message", [
    (dict(attn_logit_softcapping=50.0), ValueError, "attn_logit_softcapping=50.0 is not supported"),
    (dict(use_bidirectional_attention=True), ValueError, "use_bidirectional_attention=True is not supported"),
    (dict(hidden_activation="gelu"), ValueError, "hidden_activation='gelu'; this Gemma 3 supports only"),
    (dict(layer_types=LAYER_TYPES[:3]), ValueError, "layer_types must have one entry per layer"),
    (dict(sliding_window=None), ValueError, "marks sliding layers but sliding_window is None"),
    (dict(rope_scaling={"rope_type": "longrope", "factor": 2.0}), ValueError, "rope_type='longrope' is not supported"),
    (dict(query_pre_attn_scalar=0), ValueError, "query_pre_attn_scalar must be a positive finite number"),
    (dict(final_logit_softcapping="2"), TypeError, "final_logit_softcapping must be a positive finite number"),
    (dict(model_type="gemma2"), ValueError, "model_type='gemma2'"),
])
def test_a_setting_that_is_not_reproduced_is_named(overrides, error, message):
    with pytest.raises(error, match=f"Gemma3Config.from_dict: .*{message}"):
        Gemma3Config.from_dict({**TEXT, "layer_types": LAYER_TYPES, **overrides}, source="config.json")


def test_a_bad_folder_or_config_gives_a_clear_error(tmp_path):
    write_config(tmp_path, {"model_type": "gemma3", "vision_config": {}})
    with pytest.raises(ValueError, match="has model_type='gemma3' but text_config=None; the course loads the "
                                         "language model"):
        load_pretrained(tmp_path)
    write_config(tmp_path, {"model_type": "gemma3", "text_config": {**TEXT, "final_logit_softcapping": 30.0}})
    with pytest.raises(ValueError, match=r"\(text_config\): final_logit_softcapping=30.0 .*Gemma3ForConditional"):
        load_pretrained(tmp_path)
    write_config(tmp_path, TEXT)
    with pytest.raises(FileNotFoundError, match="lacks model.safetensors"):
        load_pretrained(tmp_path)
    reference = reference_model("plain")
    reference.config.num_hidden_layers = 4                       # the file says 4 layers, the weights hold 5
    reference.config.layer_types = LAYER_TYPES[:4]
    save(reference, tmp_path)
    with pytest.raises(ValueError, match="do not fit this Gemma3ForCausalLM: unexpected weight.s.: "
                                         "model.layers.4.input_layernorm.weight"):
        load_pretrained(tmp_path)
