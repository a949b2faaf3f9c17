"""attn_course.models.llama against Hugging Face ``transformers``' LlamaForCausalLM (5.x, eager attention).

The reference is a small random ``transformers.LlamaForCausalLM`` saved with ``save_pretrained``
and read back by :func:`load_pretrained`; everything is compared in float32 within 1e-5. Its weights
are redrawn larger than Hugging Face's 0.02 initialisation (and the norms' weights away from 1),
so that every weight matters and greedy decoding does not hinge on near-ties.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil

import pytest
import torch

from attn_course.core.kv_cache import KVCache
from attn_course.core.norms import RMSNorm
from attn_course.models.hugging_face.config import rope_from_hugging_face
from attn_course.models.hugging_face.llama import hugging_face_name
from attn_course.models.llama import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaModel,
    SwiGLU,
    load_pretrained,
    positions_from_attention_mask,
)
from attn_course.positions.rope_scaling import LinearScaling, Llama3Scaling, NTKScaling, YaRNScaling

transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-5
SIZES = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def reference_model(seed: int = 0, **overrides) -> transformers.LlamaForCausalLM:
    """A random Hugging Face Llama in eval mode, weights drawn with std 0.1 and norms around 1."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**SIZES, **overrides}, bos_token_id=None, eos_token_id=None,
                                      pad_token_id=None, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1 + 0.2 * torch.randn_like(parameter))
            else:
                parameter.normal_(0.0, 0.1)
    return model


def save(model, folder) -> None:
    with contextlib.redirect_stderr(io.StringIO()):             # the "Writing model shards" bar
        model.save_pretrained(folder, safe_serialization=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """``(folder, Hugging Face model)`` for the default sizes, saved once for the whole file."""
    folder = tmp_path_factory.mktemp("llama")
    reference = reference_model()
    save(reference, folder)
    return folder, reference


@pytest.fixture(scope="module")
def ours(checkpoint):
    return load_pretrained(checkpoint[0])


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


# --- the pieces -------------------------------------------------------------------------------


def test_rms_norm_matches_the_float64_formula():
    torch.manual_seed(1)
    norm = RMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
    x = torch.randn(3, 7, 64) * 5
    x64, w64 = x.double(), norm.weight.double()
    expected = x64 / torch.sqrt((x64 ** 2).mean(-1, keepdim=True) + 1e-5) * w64
    assert max_difference(norm(x), expected) < 1e-5
    assert norm(x).dtype == torch.float32


def test_rms_norm_in_bfloat16_rounds_as_llama_does():
    # Hugging Face's LlamaRMSNorm: float32 statistics, cast back, then times the weight.
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(2)
    ours, theirs = RMSNorm(64, eps=1e-6).bfloat16(), LlamaRMSNorm(64, eps=1e-6).bfloat16()
    with torch.no_grad():
        ours.weight.normal_(1.0, 0.3)
        theirs.weight.copy_(ours.weight)
    x = (torch.randn(4, 64) * 3).bfloat16()
    assert ours(x).dtype == torch.bfloat16
    assert torch.equal(ours(x), theirs(x))


def test_swiglu_matches_the_hand_written_formula():
    torch.manual_seed(3)
    ffn = SwiGLU(16, 40)
    x = torch.randn(2, 5, 16)
    gate, up, down = (layer.weight.double() for layer in (ffn.gate, ffn.up, ffn.down))
    g = x.double() @ gate.T
    expected = ((g / (1 + torch.exp(-g))) * (x.double() @ up.T)) @ down.T
    assert max_difference(ffn(x), expected) < 1e-5
    assert all(layer.bias is None for layer in (ffn.gate, ffn.up, ffn.down))


def test_positions_of_a_left_padded_batch_count_real_tokens_only():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    expected = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 1, 2, 3]])
    assert torch.equal(positions_from_attention_mask(mask), expected)


# --- parity with transformers ----------------------------------------------------------------


def test_hidden_states_and_logits_match_transformers(checkpoint, ours):
    _, reference = checkpoint
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        theirs = reference(ids, output_hidden_states=True)
        mine = ours(ids, output_hidden_states=True)
    # Hugging Face's hidden_states: the embeddings, each block's output but the last, then the
    # final norm's output; ours: the embeddings and every block's output (all_hidden_states), and
    # the final norm's output (hidden_states).
    for index in range(SIZES["num_hidden_layers"]):
        assert max_difference(mine.all_hidden_states[index], theirs.hidden_states[index]) < TOLERANCE, index
    assert max_difference(mine.hidden_states, theirs.hidden_states[-1]) < TOLERANCE
    assert max_difference(mine.logits, theirs.logits) < TOLERANCE


def test_attention_weights_match_transformers(checkpoint, ours):
    _, reference = checkpoint
    ids = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        theirs = reference(ids, output_attentions=True).attentions
        mine = ours(ids, output_attentions=True).attentions
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs):
        assert max_difference(a, b) < TOLERANCE


def test_left_padded_batch_matches_transformers_on_real_tokens(checkpoint, ours):
    _, reference = checkpoint
    ids = torch.randint(0, 100, (3, 8), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[0, :3] = 0
    mask[2, :1] = 0
    real = mask.bool()
    # transformers 5's forward numbers positions 0..N-1 whatever the mask (only generate() derives
    # them from it), so the reference is given the positions generate() would use.
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, position_ids=position_ids, output_hidden_states=True)
        mine = ours(ids, mask, output_hidden_states=True)
        alone = ours(ids[:1, 3:]).logits                          # sequence 0 without its padding
    assert max_difference(mine.logits[real], theirs.logits[real]) < TOLERANCE
    assert max_difference(mine.hidden_states[real], theirs.hidden_states[-1][real]) < TOLERANCE
    assert max_difference(mine.all_hidden_states[1][real], theirs.hidden_states[1][real]) < TOLERANCE
    assert max_difference(mine.logits[0, 3:], alone[0]) < TOLERANCE
    assert torch.isfinite(mine.logits).all()                      # padded rows: meaningless, not NaN


def test_greedy_generation_with_a_kv_cache_matches_transformers_generate(checkpoint, ours):
    _, reference = checkpoint
    ids = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(7))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                                    output_logits=True, return_dict_in_generate=True)
    mine = ours.generate(ids, 10, attention_mask=mask)
    assert mine.sequences.tolist() == theirs.sequences.tolist()
    assert mine.logits.shape == (2, 10, SIZES["vocab_size"])
    assert max_difference(mine.logits, torch.stack(theirs.logits, dim=1)) < TOLERANCE


def test_cached_decoding_gives_the_logits_of_one_full_pass(ours):
    prompt = torch.tensor([[5, 17, 42]])
    generated = ours.generate(prompt, 6)
    with torch.no_grad():
        full = ours(generated.sequences[:, :-1]).logits          # [1, 8, V]
    assert max_difference(generated.logits, full[:, prompt.shape[1] - 1:]) < TOLERANCE


def test_tied_embeddings_load_without_an_lm_head_and_match(tmp_path):
    reference = reference_model(seed=8, tie_word_embeddings=True, num_hidden_layers=1)
    save(reference, tmp_path)
    model = load_pretrained(tmp_path)
    assert model.lm_head.weight is model.model.embedding.weight
    ids = torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        assert max_difference(model(ids).logits, reference(ids).logits) < TOLERANCE


def test_a_bare_llama_model_checkpoint_with_tied_embeddings_loads(tmp_path):
    reference = reference_model(seed=12, tie_word_embeddings=True, num_hidden_layers=1)
    save(reference.model, tmp_path)                               # names without the "model." prefix
    model = load_pretrained(tmp_path)
    ids = torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        assert max_difference(model(ids).logits, reference(ids).logits) < TOLERANCE


@pytest.mark.parametrize("rope_parameters, trained, scaling_type", [
    ({"rope_type": "linear", "rope_theta": 5000.0, "factor": 4.0}, 32, LinearScaling),
    ({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 4.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8}, 32, Llama3Scaling),
    ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8},
     32, YaRNScaling),
    ({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, 4, NTKScaling),
])
def test_rope_scaling_from_the_config_matches_transformers(tmp_path, rope_parameters, trained, scaling_type):
    # 12 tokens: beyond the 8 "pre-extension" positions, and beyond the 4 trained ones that make
    # dynamic NTK scaling change the base.
    reference = reference_model(seed=10, num_hidden_layers=1, max_position_embeddings=trained,
                                rope_parameters=dict(rope_parameters))
    save(reference, tmp_path)
    model = load_pretrained(tmp_path)
    assert isinstance(model.config.rope_scaling, scaling_type)
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        assert max_difference(model(ids).logits, reference(ids).logits) < TOLERANCE


def test_the_older_rope_theta_and_rope_scaling_layout_is_read():
    theta, scaling = rope_from_hugging_face({"rope_theta": 1e6, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert (theta, scaling) == (1e6, LinearScaling(2.0))
    assert rope_from_hugging_face({}) == (10000.0, None)
    theta, scaling = rope_from_hugging_face({"max_position_embeddings": 128, "rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 0.707}})
    assert scaling.original_context == 128 and math.isclose(scaling.attention_scaling, 1.0)


# --- the loader's errors -----------------------------------------------------------------------


def edited_copy(checkpoint, tmp_path, *, weights=None, config=None):
    """A copy of the checkpoint folder with some tensors or config fields changed."""
    from safetensors.torch import load_file, save_file

    folder, _ = checkpoint
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    shutil.copy(folder / "model.safetensors", tmp_path / "model.safetensors")
    if weights is not None:
        stored = load_file(folder / "model.safetensors")
        save_file(weights(stored), tmp_path / "model.safetensors")
    if config is not None:
        values = json.loads((folder / "config.json").read_text())
        config(values)
        (tmp_path / "config.json").write_text(json.dumps(values))
    return tmp_path


def test_a_renamed_tensor_is_reported_as_missing_and_unexpected(checkpoint, tmp_path):
    def rename(stored):
        stored["model.layers.1.mlp.gate.weight"] = stored.pop("model.layers.1.mlp.gate_proj.weight")
        return stored

    with pytest.raises(ValueError, match=r"missing weight\(s\): model\.layers\.1\.mlp\.gate_proj\.weight; "
                                         r"unexpected weight\(s\): model\.layers\.1\.mlp\.gate\.weight"):
        load_pretrained(edited_copy(checkpoint, tmp_path, weights=rename))


def test_a_tensor_of_the_wrong_shape_is_named_with_both_shapes(checkpoint, tmp_path):
    def shrink(stored):
        stored["model.layers.0.self_attn.k_proj.weight"] = stored["model.layers.0.self_attn.k_proj.weight"][:16]
        return stored

    with pytest.raises(ValueError, match=r"wrong shape\(s\): model\.layers\.0\.self_attn\.k_proj\.weight "
                                         r"\[16, 64\] \(expected \[32, 64\]\)"):
        load_pretrained(edited_copy(checkpoint, tmp_path, weights=shrink))


def test_a_tied_config_with_a_different_lm_head_is_rejected(checkpoint, tmp_path):
    def tie(values):
        values["tie_word_embeddings"] = True

    with pytest.raises(ValueError, match="tie_word_embeddings is true but lm_head.weight differs"):
        load_pretrained(edited_copy(checkpoint, tmp_path, config=tie))


@pytest.mark.parametrize("field, value, message", [
    ("attention_bias", True, "attention_bias=True; this Llama supports only attention_bias=False"),
    ("mlp_bias", True, "mlp_bias=True; this Llama supports only mlp_bias=False"),
    ("hidden_act", "gelu", "hidden_act='gelu'; this Llama supports only hidden_act='silu'"),
    ("model_type", "qwen2", "model_type='qwen2'; this Llama supports only model_type='llama' or 'mistral'"),
    ("head_dim", 32, "head_dim=32; this Llama needs head_dim = hidden_size / num_attention_heads = 16"),
    ("rope_parameters", {"rope_type": "longrope", "rope_theta": 1e4}, "rope_parameters.rope_type='longrope'"),
    ("rope_parameters", {"rope_type": "linear", "rope_theta": 1e4}, r"rope_parameters\.factor is required"),
    ("rope_parameters", {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "short_factor": [1.0]},
     "short_factor"),
    ("partial_rotary_factor", 0.5, "partial_rotary_factor=0.5"),
    ("rms_norm_eps", -1.0, "rms_norm_eps must be a positive finite number"),
])
def test_an_unsupported_config_field_is_named(checkpoint, tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        load_pretrained(edited_copy(checkpoint, tmp_path, config=lambda values: values.update({field: value})))


def test_missing_files_are_named(tmp_path, checkpoint):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="lacks config.json"):
        load_pretrained(tmp_path)
    shutil.copy(checkpoint[0] / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="lacks model.safetensors.*pickle"):
        load_pretrained(tmp_path)
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        load_pretrained(checkpoint[0], dtype=torch.int64)


def test_a_sharded_checkpoint_loads(checkpoint, ours, tmp_path):
    from safetensors.torch import load_file, save_file

    folder, _ = checkpoint
    stored = load_file(folder / "model.safetensors")
    names = sorted(stored)
    weight_map = {}
    for shard, part in (("model-00001-of-00002.safetensors", names[::2]),
                        ("model-00002-of-00002.safetensors", names[1::2])):
        save_file({name: stored[name] for name in part}, tmp_path / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    model = load_pretrained(tmp_path)
    for name, tensor in ours.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_every_parameter_has_a_hugging_face_name(ours):
    names = {hugging_face_name(name) for name in ours.state_dict()}
    assert len(names) == len(ours.state_dict())
    with pytest.raises(ValueError, match="not a parameter of LlamaForCausalLM"):
        hugging_face_name("model.blocks.0.attention.rope.weight")


# --- input checks ------------------------------------------------------------------------------


def small_config(**overrides) -> LlamaConfig:
    return LlamaConfig(**{**dict(vocab_size=10, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2), **overrides})


@pytest.mark.parametrize("overrides, error, message", [
    (dict(num_key_value_heads=3), ValueError, "num_attention_heads=4 must be divisible by num_key_value_heads=3"),
    (dict(hidden_size=18), ValueError, "hidden_size=18 must be divisible by num_attention_heads=4"),
    (dict(hidden_size=12), ValueError, "head size .* = 3 must be even"),
    (dict(vocab_size=0), ValueError, "vocab_size must be >= 1, got 0"),
    (dict(rope_theta="big"), TypeError, "rope_theta must be a positive finite number, got str"),
    (dict(rope_scaling=2.0), TypeError, "rope_scaling must be None or one of"),
    (dict(tie_word_embeddings=1), TypeError, "tie_word_embeddings must be a bool, got int"),
])
def test_bad_configs_are_rejected(overrides, error, message):
    with pytest.raises(error, match=message):
        small_config(**overrides)


def test_bad_inputs_are_named():
    model = LlamaForCausalLM(small_config()).eval()
    ids = torch.tensor([[1, 2, 3]])
    cases = [
        (dict(input_ids=ids.float()), TypeError, "input_ids must be an integer tensor"),
        (dict(input_ids=ids[0]), ValueError, r"input_ids must be \[B, N\] with N >= 1, got shape \[3\]"),
        (dict(input_ids=ids + 10), ValueError, r"input_ids must lie in 0\.\.9, got values from 11 to 13"),
        (dict(input_ids=ids, attention_mask=torch.ones(1, 4)), ValueError,
         r"attention_mask must be \[B, N_k\] = \[1, 3\]"),
        (dict(input_ids=ids, attention_mask=torch.full((1, 3), 2)), ValueError, "only 0 .padding. and 1"),
        (dict(input_ids=ids, positions=torch.arange(4)), ValueError, r"positions must be \[N\] = \[3\]"),
        (dict(input_ids=ids, positions=torch.zeros(3)), TypeError, "positions must be an integer tensor"),
        (dict(input_ids=ids, kv_caches=[KVCache()]), ValueError, r"one KVCache per block \(2\), got 1"),
        (dict(input_ids=ids, kv_caches=KVCache()), TypeError, "kv_caches must be a list of KVCache"),
        (dict(input_ids=ids, output_hidden_states=1), TypeError, "output_hidden_states must be a bool"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            model(**kwargs)
    with pytest.raises(ValueError, match="LlamaForCausalLM.generate: max_new_tokens must be >= 0, got -1"):
        model.generate(ids, -1)
    assert model.generate(ids, 0).logits.shape == (1, 0, 10)
    with pytest.raises(ValueError, match=r"RMSNorm.forward: x must be \[..., E\] with E = 16"):
        RMSNorm(16)(torch.ones(2, 8))
    with pytest.raises(TypeError, match="SwiGLU.forward: x must be a floating-point tensor"):
        SwiGLU(4, 8)(torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="LlamaModel: config must be a LlamaConfig, got dict"):
        LlamaModel({})

