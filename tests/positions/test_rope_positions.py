"""Per-sequence positions ``[B, N]`` in RotaryEmbedding and MultiHeadAttention: a left-padded batch
must give each sequence's real tokens what an unpadded run of that sequence alone gives.

References: Hugging Face's ``apply_rotary_pos_emb`` with ``position_ids [B, N]`` (the way batched
generation rotates left-padded prompts), and each sequence run on its own, without padding."""

from __future__ import annotations

import pytest
import torch
from transformers import GPTNeoXConfig, LlamaConfig
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_apply
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import causal_mask
from attn_course.core.multihead import MultiHeadAttention
from attn_course.positions.rope import RotaryEmbedding
from attn_course.positions.rope_scaling import NTKScaling

from helpers import close, randn

LENGTHS = [3, 7, 5]                      # real tokens per sequence; padded on the left to 7
N = max(LENGTHS)


def left_padded_positions(lengths: list[int], n: int) -> torch.Tensor:
    """``[B, n]``: padding at position 0, then each sequence's tokens at 0, 1, ... (as HF's generate)."""
    rows = [torch.cat((torch.zeros(n - length, dtype=torch.long), torch.arange(length))) for length in lengths]
    return torch.stack(rows)


def left_padding_keys(lengths: list[int], n: int) -> torch.Tensor:
    """``[B, 1, n]`` True where the key is a real token (the last ``length`` of each row)."""
    return torch.stack([torch.arange(n) >= n - length for length in lengths])[:, None, :]


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape", [(3, 6, 8), (3, 2, 6, 8)])
def test_batched_positions_rotate_each_sequence_by_its_own_row(interleaved, shape):
    rope = RotaryEmbedding(8, interleaved=interleaved)
    x = randn(*shape, seed=1)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12], [0, 0, 0, 1, 2, 3]])
    batched = rope(x, positions)
    for b in range(shape[0]):
        close(batched[b], rope(x[b], positions[b]))


def test_left_padded_rows_rotate_their_real_tokens_as_each_sequence_alone():
    rope = RotaryEmbedding(16)
    sequences = [randn(2, length, 16, seed=10 + i) for i, length in enumerate(LENGTHS)]   # [H, n, d] each
    batch = torch.stack([torch.cat((torch.zeros(2, N - s.shape[1], 16), s), dim=1) for s in sequences])
    rotated = rope(batch, left_padded_positions(LENGTHS, N))                             # [B, H, N, d]
    for b, sequence in enumerate(sequences):
        close(rotated[b, :, N - sequence.shape[1]:], rope(sequence))


def test_shared_positions_as_one_row_or_as_b_equal_rows_agree():
    rope = RotaryEmbedding(16)
    x = randn(2, 3, 5, 16, seed=2)
    positions = torch.arange(4, 9)
    close(rope(x, positions.expand(2, -1)), rope(x, positions))


@pytest.mark.parametrize("base", [10_000.0, 500_000.0])
def test_batched_positions_match_hugging_face_position_ids(base):
    B, H, d = 3, 2, 32
    config = LlamaConfig(hidden_size=H * d, num_attention_heads=H, head_dim=d,
                         rope_parameters={"rope_type": "default", "rope_theta": base})
    q, k = randn(B, H, N, d, seed=3), randn(B, H, N, d, seed=4)
    positions = left_padded_positions(LENGTHS, N)
    cos, sin = LlamaRotaryEmbedding(config=config)(q, positions)             # [B, N, d]
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    rope = RotaryEmbedding(d, base=base)
    close(rope(q, positions), q_hf, tol=2e-5)
    close(rope(k, positions), k_hf, tol=2e-5)


def test_partial_rotary_matches_gpt_neox_with_batched_positions():
    B, H, d = 2, 2, 16
    config = GPTNeoXConfig(hidden_size=H * d, num_attention_heads=H, rotary_pct=0.25,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.25})
    q, k = randn(B, H, 6, d, seed=5), randn(B, H, 6, d, seed=6)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 1, 2, 3, 4]])
    cos, sin = GPTNeoXRotaryEmbedding(config=config)(q, positions)
    assert cos.shape[-1] == 4                                                   # HF rotates 4 of 16
    q_hf, k_hf = neox_apply(q, k, cos, sin)
    rope = RotaryEmbedding(d, rotary_fraction=0.25)
    close(rope(q, positions), q_hf, tol=2e-5)
    close(rope(k, positions), k_hf, tol=2e-5)
    close(rope(q, positions)[..., 4:], q[..., 4:], tol=0)                      # the rest passes through


def model(rope: RotaryEmbedding | None = None, **kwargs) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(16, 4, rope=RotaryEmbedding(4) if rope is None else rope, **kwargs).eval()


def padded_batch(seed: int = 7) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The sequences alone (``[1, length, E]``) and left-padded into one ``[B, N, E]`` batch."""
    sequences = [randn(1, length, 16, seed=seed + i) for i, length in enumerate(LENGTHS)]
    padding = randn(len(LENGTHS), N, 16, seed=99)                   # junk in the padding slots
    batch = torch.stack([torch.cat((padding[b, : N - s.shape[1]], s[0])) for b, s in enumerate(sequences)])
    return sequences, batch


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_left_padded_batch_with_positions_equals_each_sequence_alone(num_kv_heads):
    attention = model(num_kv_heads=num_kv_heads)
    sequences, batch = padded_batch()
    mask = left_padding_keys(LENGTHS, N) & causal_mask(N)                   # [B, N, N]
    out, _ = attention(batch, mask=mask, positions=left_padded_positions(LENGTHS, N))
    for b, sequence in enumerate(sequences):
        alone, _ = attention(sequence, is_causal=True)
        close(out[b, N - sequence.shape[1]:], alone[0])


def test_with_plain_rope_shared_positions_only_shift_each_sequence_which_changes_nothing():
    """Scores depend on m - n only, so shifting a whole sequence by its padding is harmless for plain
    RoPE: the shared positions 0 .. N-1 give the same outputs, to round-off."""
    attention = model()
    sequences, batch = padded_batch()
    mask = left_padding_keys(LENGTHS, N) & causal_mask(N)
    shared, _ = attention(batch, mask=mask)
    per_sequence, _ = attention(batch, mask=mask, positions=left_padded_positions(LENGTHS, N))
    real = left_padding_keys(LENGTHS, N)[:, 0]                               # [B, N]
    close(shared[real], per_sequence[real])


def test_with_dynamic_ntk_only_per_sequence_positions_match_each_sequence_alone():
    """Dynamic NTK picks its base from the largest position: padding to a fixed length N > L0 with shared
    positions changes the frequencies of short sequences; their own positions do not."""
    rope = RotaryEmbedding(4, scaling=NTKScaling(8.0, original_context=4, dynamic=True))
    attention = model(rope=rope)
    lengths, n = [3, 3], 7
    sequences = [randn(1, length, 16, seed=40 + i) for i, length in enumerate(lengths)]
    batch = torch.stack([torch.cat((torch.zeros(n - s.shape[1], 16), s[0])) for s in sequences])
    mask = left_padding_keys(lengths, n) & causal_mask(n)
    own, _ = attention(batch, mask=mask, positions=left_padded_positions(lengths, n))
    shared, _ = attention(batch, mask=mask)
    for b, sequence in enumerate(sequences):
        alone, _ = attention(sequence, is_causal=True)
        close(own[b, n - lengths[b]:], alone[0])
        assert (shared[b, n - lengths[b]:] - alone[0]).abs().max() > 1e-4            # round-off: ~1e-7


def test_left_padded_prompt_then_cached_decoding_equals_each_sequence_alone():
    attention = model()
    extra = 3                                                                # tokens decoded after the prompt
    full = [randn(1, length + extra, 16, seed=20 + i) for i, length in enumerate(LENGTHS)]
    prompts = [s[:, :length] for s, length in zip(full, LENGTHS)]
    padding = randn(len(LENGTHS), N, 16, seed=98)
    batch = torch.stack([torch.cat((padding[b, : N - p.shape[1]], p[0])) for b, p in enumerate(prompts)])
    keys_real = left_padding_keys(LENGTHS, N)                               # [B, 1, N]
    cache = KVCache()
    attention(batch, mask=keys_real & causal_mask(N), kv_cache=cache, positions=left_padded_positions(LENGTHS, N))
    steps = []
    for t in range(extra):
        token = torch.stack([s[0, length + t] for s, length in zip(full, LENGTHS)])[:, None]   # [B, 1, E]
        positions = torch.tensor(LENGTHS)[:, None] + t                                            # [B, 1]
        keys_real = torch.cat((keys_real, torch.ones(len(LENGTHS), 1, 1, dtype=torch.bool)), dim=-1)
        steps.append(attention(token, mask=keys_real, kv_cache=cache, positions=positions)[0])
    decoded = torch.cat(steps, dim=1)                                        # [B, extra, E]
    for b, sequence in enumerate(full):
        alone, _ = attention(sequence, is_causal=True)
        close(decoded[b], alone[0, LENGTHS[b]:])


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"positions": torch.arange(4)}, ValueError,
         r"positions must be \[N_q\] = \[5\] or \[B, N_q\] = \[2, 5\] for query of shape \[2, 5, 16\], "
         r"got shape \[4\]"),
        ({"positions": torch.zeros(3, 5, dtype=torch.long)}, ValueError, r"positions must be .*got shape \[3, 5\]"),
        ({"positions": torch.zeros(2, 1, 5, dtype=torch.long)}, ValueError,
         r"positions must be .*got shape \[2, 1, 5\]"),
        ({"positions": torch.arange(5.0)}, TypeError, "positions must be an integer tensor, got dtype torch.float32"),
        ({"positions": [0, 1, 2, 3, 4]}, TypeError, "positions must be a torch.Tensor, got list"),
    ],
)
def test_bad_positions_are_rejected_by_name(kwargs, error, fragment):
    with pytest.raises(error, match=f"MultiHeadAttention.forward: {fragment}"):
        model()(torch.zeros(2, 5, 16), **kwargs)


def test_positions_without_rope_or_in_cross_attention_are_rejected():
    torch.manual_seed(0)
    plain = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match="positions only matter with rotary embeddings"):
        plain(torch.zeros(1, 3, 16), positions=torch.arange(3))
    with pytest.raises(ValueError, match="cross-attention is not rotated"):
        model()(torch.zeros(1, 3, 16), torch.zeros(1, 4, 16), torch.zeros(1, 4, 16), positions=torch.arange(3))


def test_a_rejected_call_leaves_the_cache_untouched():
    attention, cache = model(), KVCache()
    attention(torch.zeros(1, 3, 16), kv_cache=cache)
    with pytest.raises(ValueError):
        attention(torch.zeros(1, 2, 16), kv_cache=cache, positions=torch.arange(5))
    assert len(cache) == 3
