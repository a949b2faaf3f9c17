"""Tests for attn_course.positions.rope: the relative-position law, both pairings, parity with Hugging Face's
LLaMA rotary embedding and with a float64 complex-number reference, and RoPE inside MultiHeadAttention.

Precision. ``RotaryEmbedding`` computes the angles ``m · θ_i`` in float64 and rotates in the input's
precision (float32 for half inputs). So float64 inputs obey the laws to ~1e-14, float32 inputs to a few
float32 round-offs whatever the position, and the bounds below do not grow with the position.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attn_course.core.kv_cache import KVCache
from attn_course.core.multihead import MultiHeadAttention
from attn_course.positions.rope import RotaryEmbedding

from helpers import FAST, close, randn

HEAD_DIMS = st.sampled_from([2, 4, 8, 64, 128])
BASES = st.sampled_from([100.0, 10_000.0, 500_000.0])
POSITIONS = st.integers(min_value=0, max_value=1023)       # m, n and the shift s: m + s < 2048
U32, U64 = 2.0 ** -24, 2.0 ** -53                          # float32 and float64 unit round-offs


def rotated_score(rope: RotaryEmbedding, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> float:
    """``<rope(q at m), rope(k at n)>`` for single vectors ``q, k [d]`` (the dot product in float64)."""
    q_m = rope(q[None], torch.tensor([m]))[0]                  # [d]
    k_n = rope(k[None], torch.tensor([n]))[0]                  # [d]
    return float(q_m.double() @ k_n.double())


def rotation_tolerance(dtype: torch.dtype, max_position: int) -> float:
    """Bound on one rotated entry's error, per unit length of its pair.

    In the input's precision u: cos and sin are rounded, then two products and a sum, at most 4u. The
    float64 angle m·θ_i carries two roundings, 2 · 2^-53 · (M + 1) radians for θ_i <= 1.
    """
    return 4 * (U32 if dtype == torch.float32 else U64) + 2 * U64 * (max_position + 1)


def pairs_interleaved_order(head_dim: int) -> torch.Tensor:
    """``[0, d/2, 1, d/2 + 1, ...]``: the half-split pairs (i, i + d/2) written next to each other."""
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).flatten()


def complex_rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Float64 reference for the interleaved convention: ``(x_2i + i x_2i+1) · e^{i m θ_i}``."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)           # [d/2]: θ_i = base^(-2i/d)
    angles = positions.to(torch.float64)[:, None] * theta[None, :]              # [N, d/2]
    pairs = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], d // 2, 2).contiguous())
    rotated = pairs * torch.polar(torch.ones_like(angles), angles)              # [..., N, d/2]
    return torch.view_as_real(rotated).flatten(-2)                               # [..., N, d]


def half_split_reference(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Float64 reference for the half-split convention: the complex reference on pairs (i, i + d/2)."""
    order = pairs_interleaved_order(x.shape[-1])
    return complex_rope(x[..., order], positions, base)[..., torch.argsort(order)]


# --- the relative-position law ---------------------------------------------------------------


@FAST
@given(head_dim=HEAD_DIMS, base=BASES, interleaved=st.booleans(), m=POSITIONS, n=POSITIONS, shift=POSITIONS,
       seed=st.integers(0, 2**16))
def test_score_depends_only_on_the_offset_m_minus_n(head_dim, base, interleaved, m, n, shift, seed):
    rope = RotaryEmbedding(head_dim, base=base, interleaved=interleaved)
    q, k = randn(2, head_dim, seed=seed, dtype=torch.float64)
    before = rotated_score(rope, q, k, m, n)
    after = rotated_score(rope, q, k, m + shift, n + shift)
    # Measured worst case over 1 600 random draws: 1.2e-14 · |q| |k|.
    assert abs(before - after) <= 1e-9 * float(q.norm() * k.norm())


@FAST
@given(head_dim=HEAD_DIMS, interleaved=st.booleans(), m=POSITIONS, n=POSITIONS, shift=POSITIONS,
       seed=st.integers(0, 2**16))
def test_float32_scores_obey_the_law_to_float32_round_off(head_dim, interleaved, m, n, shift, seed):
    rope = RotaryEmbedding(head_dim, interleaved=interleaved)
    q, k = randn(2, head_dim, seed=seed)
    before, after = rotated_score(rope, q, k, m, n), rotated_score(rope, q, k, m + shift, n + shift)
    # Each rotated vector is off by at most ~4·√2 u its length, a score by twice that, the law compares two
    # scores: 32 u bounds it. Measured worst case over 1 600 draws: 2.3e-7 · |q| |k| (about 4 u).
    assert abs(before - after) <= 32 * U32 * float(q.double().norm() * k.double().norm())


def test_the_law_is_not_trivial_scores_change_with_the_offset():
    rope = RotaryEmbedding(8)
    q, k = randn(2, 8, seed=1)
    assert abs(rotated_score(rope, q, k, 5, 2) - rotated_score(rope, q, k, 5, 4)) > 0.01


@pytest.mark.parametrize("seed", range(3))
def test_the_law_holds_far_along_a_long_context(seed):
    rope = RotaryEmbedding(128, base=500_000.0)
    q, k = randn(2, 128, seed=seed, dtype=torch.float64)
    m, n, shift = 700, 1200 + seed, 100_000
    before, after = rotated_score(rope, q, k, m, n), rotated_score(rope, q, k, m + shift, n + shift)
    assert abs(before - after) <= 1e-9 * float(q.norm() * k.norm())      # float32 angles: off by up to 0.01 rad here


# --- two pairings, one rotation ------------------------------------------------------------


@FAST
@given(head_dim=HEAD_DIMS, base=BASES, offset=st.integers(0, 1000), seed=st.integers(0, 2**16))
def test_the_two_pairings_differ_only_by_a_fixed_permutation_of_features(head_dim, base, offset, seed):
    x = randn(2, 5, head_dim, seed=seed)                                         # [B, N, d]
    positions = torch.arange(offset, offset + 5)
    order = pairs_interleaved_order(head_dim)
    half_split = RotaryEmbedding(head_dim, base=base)(x, positions)
    interleaved = RotaryEmbedding(head_dim, base=base, interleaved=True)(x[..., order], positions)
    close(interleaved[..., torch.argsort(order)], half_split, tol=1e-6)


def test_the_two_pairings_really_differ_on_the_same_input():
    x = randn(1, 6, 8, seed=2)
    positions = torch.arange(6)
    difference = RotaryEmbedding(8)(x, positions) - RotaryEmbedding(8, interleaved=True)(x, positions)
    assert difference.abs().max() > 0.1


# --- parity with references ---------------------------------------------------------------------

HF_CASES = [(base, head_dim) for base in (10_000.0, 500_000.0) for head_dim in (16, 64, 128)]


@pytest.mark.parametrize("base, head_dim", HF_CASES)
def test_half_split_matches_hugging_face_llama(base, head_dim):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    batch, heads, tokens = 2, 3, 12
    config = LlamaConfig(hidden_size=heads * head_dim, num_attention_heads=heads, head_dim=head_dim,
                         max_position_embeddings=256,
                         rope_parameters={"rope_type": "default", "rope_theta": base})
    rotary = llama.LlamaRotaryEmbedding(config=config)
    q = randn(batch, heads, tokens, head_dim, seed=3)                             # [B, H, N, d]
    k = randn(batch, heads, tokens, head_dim, seed=4)
    offsets = torch.tensor([0, 13])                                               # one per sequence
    position_ids = offsets[:, None] + torch.arange(tokens)                        # [B, N]
    cos, sin = rotary(q, position_ids)                                            # [B, N, d] each
    q_hf, k_hf = llama.apply_rotary_pos_emb(q, k, cos, sin)                       # [B, H, N, d]
    ours = RotaryEmbedding(head_dim, base=base)
    for b in range(batch):
        # Measured max |ours - HF| over these cases: 3.9e-6 (positions < 25). HF computes the angles in
        # float32, ours in float64, so the gap grows with the position (1.0e-5 by position 48, 2e-4 at
        # position 1000), and it is HF's: ours stays within 3e-7 of the float64 reference at any position.
        close(ours(q[b], position_ids[b]), q_hf[b], tol=1e-5)
        close(ours(k[b], position_ids[b]), k_hf[b], tol=1e-5)


@FAST
@given(head_dim=HEAD_DIMS, base=BASES, offset=st.integers(0, 10**6), dtype=st.sampled_from([torch.float32,
       torch.float64]), seed=st.integers(0, 2**16))
def test_interleaved_matches_the_complex_number_reference(head_dim, base, offset, dtype, seed):
    x = randn(3, 6, head_dim, seed=seed, dtype=dtype)                             # [B, N, d]
    positions = torch.arange(offset, offset + 6)
    ours = RotaryEmbedding(head_dim, base=base, interleaved=True)(x, positions)
    assert ours.dtype == dtype
    expected = complex_rope(x, positions, base)
    # Measured (d = 128): 2.7e-7 (float32) and 2.2e-16 (float64), at position 0 as at 100 000.
    pair_length = float(x.double().reshape(3, 6, head_dim // 2, 2).norm(dim=-1).max())
    error = float((ours.double() - expected).abs().max())
    assert error <= rotation_tolerance(dtype, offset + 5) * pair_length


def test_interleaved_matches_the_complex_number_reference_closely_at_short_positions():
    x = randn(2, 4, 16, 64, seed=5)                                                # [B, H, N, d]
    positions = torch.arange(16)
    ours = RotaryEmbedding(64, interleaved=True)(x, positions)
    close(ours.double(), complex_rope(x, positions, 10_000.0), tol=1e-6)         # measured: 2.4e-7


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_half_split_matches_the_float64_reference_at_long_positions(dtype):
    x = randn(2, 5, 64, seed=6, dtype=dtype)
    positions = torch.tensor([0, 1, 1000, 100_000, 2**24 + 1])      # 2^24 + 1 is not a float32 number
    ours = RotaryEmbedding(64)(x, positions)
    pair_length = float(torch.stack([x[..., :32], x[..., 32:]], dim=-1).double().norm(dim=-1).max())
    error = float((ours.double() - half_split_reference(x, positions, 10_000.0)).abs().max())
    assert error <= rotation_tolerance(dtype, 2**24 + 1) * pair_length


# --- rotations: lengths, position 0, half precision ---------------------------------------------


@FAST
@given(head_dim=HEAD_DIMS, base=BASES, interleaved=st.booleans(), offset=st.integers(0, 2000),
       seed=st.integers(0, 2**16))
def test_rotation_preserves_the_length_of_every_vector(head_dim, base, interleaved, offset, seed):
    x = randn(2, 5, head_dim, seed=seed)
    rotated = RotaryEmbedding(head_dim, base=base, interleaved=interleaved)(x, torch.arange(offset, offset + 5))
    close(rotated.norm(dim=-1), x.norm(dim=-1), tol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("interleaved", [False, True])
def test_position_zero_is_the_identity(interleaved, dtype):
    x = randn(3, 4, 16, seed=7, dtype=dtype)
    rope = RotaryEmbedding(16, interleaved=interleaved)
    assert torch.equal(rope(x, torch.zeros(4, dtype=torch.long)), x)
    assert torch.equal(rope(x)[..., 0, :], x[..., 0, :])               # default positions start at 0


def test_default_positions_are_zero_to_n_minus_one():
    x = randn(2, 6, 8, seed=8)
    rope = RotaryEmbedding(8)
    assert torch.equal(rope(x), rope(x, torch.arange(6)))


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_half_precision_keeps_its_dtype_and_matches_float32(dtype, tol, interleaved):
    x = randn(2, 9, 32, seed=9, dtype=dtype)
    rope = RotaryEmbedding(32, interleaved=interleaved)
    positions = torch.arange(100, 109)
    rotated = rope(x, positions)
    assert rotated.dtype == dtype
    close(rotated.float(), rope(x.float(), positions), tol=tol)                  # one rounding to dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_casting_the_module_to_half_precision_keeps_the_frequencies(dtype):
    # Regression: an earlier version kept θ_i in a float buffer that .to(bfloat16) rounded, which turned
    # the rotations at position 1000 by up to 0.7 rad too much or too little.
    x = randn(1, 4, 64, seed=10, dtype=dtype)
    positions = torch.arange(1000, 1004)
    assert torch.equal(RotaryEmbedding(64).to(dtype)(x, positions), RotaryEmbedding(64)(x, positions))
    attention = MultiHeadAttention(64, 1, rope=RotaryEmbedding(64)).to(dtype)
    assert torch.equal(attention.rope(x, positions), RotaryEmbedding(64)(x, positions))


# --- RoPE inside MultiHeadAttention ---------------------------------------------------------------


def identity_attention(head_dim: int, rope) -> MultiHeadAttention:
    """One head whose four projections are identities: scores are plain dot products of rotated inputs."""
    attention = MultiHeadAttention(head_dim, 1, bias=False, rope=rope)
    with torch.no_grad():
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj):
            projection.weight.copy_(torch.eye(head_dim))
    return attention.eval()


@pytest.mark.parametrize("interleaved", [False, True])
def test_attention_scores_of_a_repeated_token_depend_only_on_the_offset(interleaved):
    d, tokens, base = 8, 10, 100.0
    attention = identity_attention(d, RotaryEmbedding(d, base=base, interleaved=interleaved))
    token = randn(d, seed=11)
    _, weights = attention(token.expand(1, tokens, d))                             # [1, 1, N, N]
    # Independent reference: q_m · k_n = sum over pairs of |pair|² cos((m - n) θ_i).
    order = pairs_interleaved_order(d) if not interleaved else torch.arange(d)
    pair_sq = token.double()[order].reshape(d // 2, 2).pow(2).sum(-1)             # [d/2]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)             # [d/2]
    offsets = torch.arange(tokens)[:, None] - torch.arange(tokens)[None, :]       # [N, N]: m - n
    scores = (pair_sq * torch.cos(offsets[..., None] * theta)).sum(-1) / math.sqrt(d)
    close(weights[0, 0].double(), torch.softmax(scores, dim=-1), tol=1e-5)
    assert weights[0, 0].std(dim=-1).min() > 1e-3                                 # not uniform: position matters


@pytest.mark.parametrize("prefix", [1, 6])
def test_translating_a_sequence_by_a_cache_offset_leaves_its_attention_unchanged(prefix):
    torch.manual_seed(12)
    attention = MultiHeadAttention(16, 2, rope=RotaryEmbedding(8)).eval()
    x = randn(2, 5, 16, seed=13)                                                   # [B, N, E]
    plain, plain_weights = attention(x)
    cache = KVCache()
    attention(randn(2, prefix, 16, seed=14), kv_cache=cache)                       # x now starts at `prefix`
    sees_only_x = torch.arange(prefix + 5)[None, :] >= prefix                      # [1, N_k]: hide the prefix
    shifted, shifted_weights = attention(x, kv_cache=cache, mask=sees_only_x.expand(5, -1))
    close(shifted_weights[..., prefix:], plain_weights)
    close(shifted, plain)


CACHED_ROPES = [RotaryEmbedding(4), RotaryEmbedding(4, base=100.0, interleaved=True)]


@pytest.mark.parametrize("rope", CACHED_ROPES, ids=["default", "interleaved-base-100"])
@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 3]], ids=["token-by-token", "chunks"])
def test_decoding_with_a_cache_equals_one_causal_pass(rope, chunks):
    torch.manual_seed(15)
    attention = MultiHeadAttention(16, 4, num_kv_heads=2, rope=rope).eval()
    x = randn(2, 7, 16, seed=16)
    full, _ = attention(x, is_causal=True)
    cache, pieces, start = KVCache(), [], 0
    for size in chunks:
        piece, _ = attention(x[:, start:start + size], is_causal=True, kv_cache=cache)
        pieces.append(piece)
        start += size
    close(torch.cat(pieces, dim=1), full)


def test_rope_changes_self_attention_but_not_cross_attention():
    torch.manual_seed(17)
    with_rope = MultiHeadAttention(16, 4, rope=RotaryEmbedding(4)).eval()
    without = MultiHeadAttention(16, 4).eval()
    without.load_state_dict(with_rope.state_dict())
    x, memory = randn(1, 5, 16, seed=18), randn(1, 7, 16, seed=19)
    assert (with_rope(x)[0] - without(x)[0]).abs().max() > 1e-3
    close(with_rope(x, memory, memory)[0], without(x, memory, memory)[0])


def test_rope_rotates_queries_and_keys_but_not_values():
    d, tokens = 8, 6
    attention = identity_attention(d, RotaryEmbedding(d))
    x = randn(1, tokens, d, seed=20)
    output, weights = attention(x)
    close(output, weights[:, 0] @ x)                    # outputs mix the unrotated inputs (values)


def test_rope_with_the_wrong_head_dim_is_rejected():
    with pytest.raises(ValueError, match="rope.head_dim=8 must equal E / H = 4"):
        MultiHeadAttention(16, 4, rope=RotaryEmbedding(8))


@pytest.mark.parametrize("rope", ["yes", True, torch.nn.Identity()], ids=["str", "true", "no-head-dim"])
def test_rope_that_is_no_rotation_is_rejected_with_what_to_pass(rope):
    # The core builds no RoPE itself (it imports nothing of chapter 05): the error names the class to pass.
    with pytest.raises(TypeError, match=r"rope must be None or a rotation with rotate\(x, positions\) and a "
                                        r"head_dim, such as attn_course.positions.rope.RotaryEmbedding\(4\)"):
        MultiHeadAttention(16, 4, rope=rope)


# --- bad inputs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"head_dim": 7}, ValueError, "head_dim must be even"),
        ({"head_dim": 0}, ValueError, "head_dim must be >= 2"),
        ({"head_dim": -4}, ValueError, "head_dim must be >= 2"),
        ({"head_dim": 8.0}, TypeError, "head_dim must be an int, got float"),
        ({"head_dim": True}, TypeError, "head_dim must be an int, got bool"),
        ({"head_dim": 8, "base": 0}, ValueError, "base must be a positive finite number, got 0"),
        ({"head_dim": 8, "base": -10.0}, ValueError, "base must be a positive finite number, got -10"),
        ({"head_dim": 8, "base": math.inf}, ValueError, "base must be a positive finite number, got inf"),
        ({"head_dim": 8, "base": math.nan}, ValueError, "base must be a positive finite number, got nan"),
        ({"head_dim": 8, "base": "10000"}, TypeError, "base must be a positive finite number, got str"),
        ({"head_dim": 8, "interleaved": "no"}, TypeError, "interleaved must be a bool, got str"),
        ({"head_dim": 8, "interleaved": 1}, TypeError, "interleaved must be a bool, got int"),
    ],
)
def test_bad_constructor_arguments_are_rejected_by_name(kwargs, error, fragment):
    with pytest.raises(error, match=f"RotaryEmbedding: {fragment}"):
        RotaryEmbedding(**kwargs)


@pytest.mark.parametrize(
    "x, positions, error, fragment",
    [
        (torch.zeros(2, 5, 8), torch.arange(4), ValueError,
         r"positions must be \[N\] = \[5\] or \[B, N\] = \[2, 5\] for x of shape \[2, 5, 8\], got shape \[4\]"),
        (torch.zeros(5, 8), torch.zeros(1, 5, dtype=torch.long), ValueError,
         r"positions must be \[N\] = \[5\] for x of shape \[5, 8\], got shape \[1, 5\]"),
        (torch.zeros(2, 5, 8), torch.zeros(3, 5, dtype=torch.long), ValueError,
         r"positions must be .*\[B, N\] = \[2, 5\].* got shape \[3, 5\]"),
        (torch.zeros(2, 5, 8), torch.zeros(2, 5, 1, dtype=torch.long), ValueError,
         r"positions must be .*got shape \[2, 5, 1\]"),
        (torch.zeros(2, 5, 8), torch.arange(5.0), TypeError, "positions must be an integer tensor, got dtype "
                                                             "torch.float32"),
        (torch.zeros(2, 5, 8), torch.ones(5, dtype=torch.bool), TypeError, "positions must be an integer tensor"),
        (torch.zeros(2, 5, 8), [0, 1, 2, 3, 4], TypeError, "positions must be a torch.Tensor, got list"),
        (torch.zeros(2, 5, 6), None, ValueError, r"x must end in head_dim=8, got shape \[2, 5, 6\]"),
        (torch.zeros(8), None, ValueError, r"x must have at least 2 dimensions, got shape \[8\]"),
        (torch.zeros(2, 5, 8, dtype=torch.long), None, TypeError, "x must be a floating-point tensor, got dtype "
                                                                  "torch.int64"),
        (None, None, TypeError, "x must be a torch.Tensor, got NoneType"),
    ],
)
def test_bad_call_arguments_are_rejected_by_name(x, positions, error, fragment):
    with pytest.raises(error, match=f"RotaryEmbedding.forward: {fragment}"):
        RotaryEmbedding(8)(x, positions)
