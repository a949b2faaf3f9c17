"""Context extension and partial rotary in RotaryEmbedding, against Hugging Face's rotary scaling.

The reference is ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (linear, dynamic, yarn,
llama3), called with a LlamaConfig that carries the same ``rope_parameters``: its inverse frequencies
(float32) and attention factor must equal ours (float64) to float32 round-off."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from attn_course.positions.rope import RotaryEmbedding
from attn_course.positions.rope_scaling import LinearScaling, Llama3Scaling, NTKScaling, YaRNScaling

from helpers import close, randn


def hugging_face(rope_type: str, head_dim: int, base: float, *, max_positions: int = 4096,
                 seq_len: int | None = None, **parameters) -> tuple[torch.Tensor, float]:
    """HF's ``(inv_freq [P/2], attention_scaling)`` for one rotary configuration."""
    config = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                         max_position_embeddings=max_positions,
                         rope_parameters={"rope_type": rope_type, "rope_theta": base, **parameters})
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
    return inv_freq.double(), float(scaling)


def same_frequencies(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.dtype == torch.float64 and ours.shape == theirs.shape
    close(ours, theirs, tol=2e-6)                        # theirs are float32: about 6e-8 relative


HEAD_DIMS = [16, 64, 128]
BASES = [10_000.0, 500_000.0]


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("factor", [2.0, 8.0])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_position_interpolation_matches_hugging_face_linear(head_dim, base, factor, fraction):
    rope = RotaryEmbedding(head_dim, base=base, scaling=LinearScaling(factor), rotary_fraction=fraction)
    theirs, scale = hugging_face("linear", head_dim, base, factor=factor, partial_rotary_factor=fraction)
    same_frequencies(rope.frequencies(), theirs)
    assert rope.attention_scaling == scale == 1.0


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("seq_len", [100, 4096, 5000, 16_384])
def test_dynamic_ntk_matches_hugging_face_dynamic_at_each_length(head_dim, base, seq_len):
    rope = RotaryEmbedding(head_dim, base=base, scaling=NTKScaling(4.0, original_context=4096, dynamic=True))
    theirs, _ = hugging_face("dynamic", head_dim, base, max_positions=4096, seq_len=seq_len, factor=4.0)
    same_frequencies(rope.frequencies(seq_len=seq_len), theirs)
    if seq_len <= 4096:                                     # up to the trained length: plain RoPE
        same_frequencies(rope.frequencies(seq_len=seq_len), RotaryEmbedding(head_dim, base=base).frequencies())


def test_dynamic_ntk_in_forward_takes_its_length_from_the_largest_position():
    rope = RotaryEmbedding(16, scaling=NTKScaling(4.0, original_context=64, dynamic=True))
    x = randn(1, 3, 16, seed=1)
    positions = torch.tensor([0, 50, 199])                                # length 200
    expected_angles = positions.double()[:, None] * rope.frequencies(seq_len=200)
    close(rope.angles(positions), expected_angles, tol=1e-12)
    plain = RotaryEmbedding(16)
    short = torch.tensor([0, 5, 63])                                      # within the trained 64
    close(rope(x, short), plain(x, short))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("factor", [2.0, 16.0])
def test_static_ntk_raises_the_base_so_the_slowest_pair_turns_factor_times_slower(head_dim, factor):
    """bloc97's formula, written independently: base' = base · factor^(d/(d-2))."""
    rope = RotaryEmbedding(head_dim, scaling=NTKScaling(factor))
    new_base = 10_000.0 * factor ** (head_dim / (head_dim - 2))
    expected = new_base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    close(rope.frequencies(), expected, tol=1e-12)
    plain = RotaryEmbedding(head_dim).frequencies()
    assert rope.frequencies()[0] == plain[0] == 1.0
    assert math.isclose(plain[-1] / rope.frequencies()[-1], factor, rel_tol=1e-12)


YARN_CASES = [
    # head_dim, base, factor, original context, extra HF parameters (ours take the same names)
    (64, 10_000.0, 4.0, 2048, {}),
    (128, 500_000.0, 8.0, 8192, {}),
    (128, 10_000.0, 16.0, 4096, {"beta_fast": 16.0, "beta_slow": 2.0}),
    (64, 10_000.0, 4.0, 2048, {"attention_factor": 1.3}),
    (64, 10_000.0, 4.0, 2048, {"truncate": False}),
    (32, 1_000_000.0, 2.0, 32768, {}),
]


@pytest.mark.parametrize("head_dim, base, factor, original, extra", YARN_CASES)
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_yarn_frequencies_and_attention_factor_match_hugging_face(head_dim, base, factor, original, extra, fraction):
    rope = RotaryEmbedding(head_dim, base=base, rotary_fraction=fraction,
                           scaling=YaRNScaling(factor, original_context=original, **extra))
    theirs, scale = hugging_face("yarn", head_dim, base, max_positions=int(factor * original), factor=factor,
                                 original_max_position_embeddings=original, partial_rotary_factor=fraction,
                                 **extra)
    same_frequencies(rope.frequencies(), theirs)
    assert math.isclose(rope.attention_scaling, scale, rel_tol=1e-12)


LLAMA3_CASES = [
    (128, 500_000.0, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 8192}),
    (128, 500_000.0, {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 8192}),
    (64, 10_000.0, {"factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0, "original_context": 2048}),
]


@pytest.mark.parametrize("head_dim, base, parameters", LLAMA3_CASES)
def test_llama3_frequencies_match_hugging_face(head_dim, base, parameters):
    rope = RotaryEmbedding(head_dim, base=base, scaling=Llama3Scaling(**parameters))
    hf = dict(parameters)
    hf["original_max_position_embeddings"] = hf.pop("original_context")
    theirs, scale = hugging_face("llama3", head_dim, base, max_positions=131_072, **hf)
    same_frequencies(rope.frequencies(), theirs)
    assert rope.attention_scaling == scale == 1.0
    # All three regions are present: kept, blended, divided by factor.
    ratio = RotaryEmbedding(head_dim, base=base).frequencies() / rope.frequencies()
    assert (ratio == 1).any() and (ratio == parameters["factor"]).any()
    assert ((ratio > 1.0001) & (ratio < parameters["factor"] - 1e-4)).any()


@pytest.mark.parametrize("scaling", [YaRNScaling(4.0, original_context=64), LinearScaling(2.0)])
def test_scaled_rotation_of_queries_and_keys_matches_hugging_face_end_to_end(scaling):
    """Frequencies and YaRN's factor on cos and sin, as HF's LlamaRotaryEmbedding applies them."""
    B, H, N, d = 2, 2, 12, 32
    parameters = ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
                  if isinstance(scaling, YaRNScaling) else {"rope_type": "linear", "factor": 2.0})
    config = LlamaConfig(hidden_size=H * d, num_attention_heads=H, head_dim=d, max_position_embeddings=256,
                         rope_parameters={"rope_theta": 10000.0, **parameters})
    q, k = randn(B, H, N, d, seed=2), randn(B, H, N, d, seed=3)
    positions = torch.tensor([[0] * 4 + list(range(8)), list(range(100, 112))])
    cos, sin = LlamaRotaryEmbedding(config=config)(q, positions)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    rope = RotaryEmbedding(d, scaling=scaling)
    close(rope(q, positions), q_hf, tol=5e-5)
    close(rope(k, positions), k_hf, tol=5e-5)


def test_yarn_multiplies_every_score_by_the_attention_factor_squared():
    rope = RotaryEmbedding(16, scaling=YaRNScaling(4.0, original_context=64))
    same_angles = RotaryEmbedding(16, scaling=YaRNScaling(4.0, original_context=64, attention_factor=1.0))
    q, k = randn(5, 16, seed=4), randn(5, 16, seed=5)
    close(rope(q) @ rope(k).T, rope.attention_scaling ** 2 * (same_angles(q) @ same_angles(k).T))


@pytest.mark.parametrize("interleaved", [False, True])
def test_partial_rotary_passes_the_last_features_through_and_keeps_the_law(interleaved):
    rope = RotaryEmbedding(16, rotary_fraction=0.25, interleaved=interleaved)
    assert rope.rotary_dim == 4 and rope.frequencies().shape == (2,)
    x = randn(6, 16, seed=6)
    positions = torch.arange(10, 16)
    rotated = rope(x, positions)
    close(rotated[:, 4:], x[:, 4:], tol=0)
    close(rotated[:, :4], RotaryEmbedding(4, interleaved=interleaved)(x[:, :4], positions))
    shifted = rope(x, positions + 37)
    close(rotated @ rotated.T, shifted @ shifted.T, tol=1e-4)                 # still depends on m - n only


@pytest.mark.parametrize(
    "make, error, fragment",
    [
        (lambda: LinearScaling(0.5), ValueError, r"LinearScaling: factor must be >= 1 .* got 0.5"),
        (lambda: LinearScaling("2"), TypeError, "LinearScaling: factor must be a positive finite number, got str"),
        (lambda: NTKScaling(2.0, dynamic=True), ValueError, "NTKScaling: dynamic=True needs original_context"),
        (lambda: NTKScaling(2.0, original_context=0), ValueError, "NTKScaling: original_context must be >= 1"),
        (lambda: NTKScaling(2.0, dynamic="yes"), TypeError, "NTKScaling: dynamic must be a bool"),
        (lambda: YaRNScaling(4.0, original_context=2048.0), TypeError, "YaRNScaling: original_context must be an int"),
        (lambda: YaRNScaling(4.0, 2048, beta_fast=1.0, beta_slow=2.0), ValueError,
         "YaRNScaling: beta_fast must exceed beta_slow"),
        (lambda: YaRNScaling(4.0, 2048, attention_factor=-1.0), ValueError, "YaRNScaling: attention_factor must be"),
        (lambda: Llama3Scaling(low_freq_factor=4.0, high_freq_factor=1.0), ValueError,
         "Llama3Scaling: high_freq_factor must exceed low_freq_factor"),
        (lambda: RotaryEmbedding(8, scaling="yarn"), TypeError, "RotaryEmbedding: scaling must be None or one of"),
        (lambda: RotaryEmbedding(8, rotary_fraction=1.5), ValueError,
         r"RotaryEmbedding: rotary_fraction must be in \(0, 1\]"),
        (lambda: RotaryEmbedding(8, rotary_fraction=0.1), ValueError,
         "rotate an even number of features, got 0.1 · 8 = 0"),
        (lambda: RotaryEmbedding(12, rotary_fraction=0.25), ValueError, "got 0.25 · 12 = 3"),
        (lambda: RotaryEmbedding(8, rotary_fraction=0.25, scaling=NTKScaling(2.0)), ValueError,
         "NTK scaling needs more than 2 rotated features"),
        (lambda: RotaryEmbedding(8).frequencies(seq_len=0), ValueError,
         "RotaryEmbedding.frequencies: seq_len must be >= 1"),
    ],
)
def test_bad_scaling_arguments_are_rejected_by_name(make, error, fragment):
    with pytest.raises(error, match=fragment):
        make()
