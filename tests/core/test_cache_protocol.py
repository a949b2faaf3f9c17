"""The protocol between MultiHeadAttention and a KV cache (new_positions, update with a rotation callback):
a cache of its own that re-rotates what it holds, checked against attention recomputed from scratch in float64."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.core.kv_cache import KVCache
from attn_course.core.multihead import MultiHeadAttention
from attn_course.positions.rope import RotaryEmbedding

from helpers import randn

E, H, H_KV = 16, 4, 2
D = E // H


class StretchedCache(KVCache):
    """Holds keys before RoPE and numbers its tokens ``stretch · (0, 1, 2, ...)``, rotating every held key
    again at every update (as position interpolation would, the other way round)."""

    def __init__(self, stretch: int) -> None:
        super().__init__()
        self.stretch, self.rotations = stretch, 0

    def new_positions(self, new_tokens, *, given=None, device=None):
        return self.stretch * torch.arange(len(self), len(self) + new_tokens, device=device)

    def update(self, keys, values, *, positions=None, rotate=None):
        keys, values = self.append(keys, values)                   # un-rotated, [B, H_kv, N_k, d]
        if rotate is None:
            return keys, values
        self.rotations += 1
        return rotate(keys, self.stretch * torch.arange(keys.shape[2])), values


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Half-split RoPE in float64, written out: feature i turns with feature i + d/2 by m · base^(-2i/d)."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)            # [d/2]
    angle = positions.to(torch.float64)[:, None] * theta                         # [N, d/2]
    first, second = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([first * angle.cos() - second * angle.sin(), first * angle.sin() + second * angle.cos()], -1)


def from_scratch(attention: MultiHeadAttention, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Causal attention over ``x [1, N, E]`` in float64, queries and keys rotated at ``positions [N]``."""
    w = {n: getattr(attention, n).weight.detach().double() for n in ("q_proj", "k_proj", "v_proj", "out_proj")}
    b = {n: getattr(attention, n).bias.detach().double() for n in ("q_proj", "k_proj", "v_proj", "out_proj")}
    x = x.double()[0]
    n = x.shape[0]
    heads = []
    for h in range(H):
        g = h // (H // H_KV)
        q = rotate((x @ w["q_proj"].T + b["q_proj"])[:, h * D:(h + 1) * D], positions)     # [N, d]
        k = rotate((x @ w["k_proj"].T + b["k_proj"])[:, g * D:(g + 1) * D], positions)     # [N, d]
        v = (x @ w["v_proj"].T + b["v_proj"])[:, g * D:(g + 1) * D]                        # [N, d]
        scores = (q @ k.T / math.sqrt(D)).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v)
    return (torch.cat(heads, dim=-1) @ w["out_proj"].T + b["out_proj"])[None]             # [1, N, E]


@pytest.fixture
def attention() -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(E, H, num_kv_heads=H_KV, rope=RotaryEmbedding(D)).eval()


@pytest.mark.parametrize("stretch", [1, 3])
@pytest.mark.parametrize("chunks", [[1] * 8, [5, 1, 2]], ids=["one-by-one", "chunks"])
def test_a_cache_that_re_rotates_through_the_callback_matches_attention_from_scratch(attention, stretch, chunks):
    x, cache, pieces, start = randn(1, 8, E, seed=1), StretchedCache(stretch), [], 0
    with torch.no_grad():
        for size in chunks:
            pieces.append(attention(x[:, start:start + size], is_causal=True, kv_cache=cache)[0])
            start += size
    expected = from_scratch(attention, x, stretch * torch.arange(8))
    assert (torch.cat(pieces, dim=1).double() - expected).abs().max().item() < 1e-5
    assert cache.rotations == len(chunks)
    if stretch != 1:    # the cache's numbering is what counts: the text positions give other outputs
        assert (from_scratch(attention, x, torch.arange(8)) - expected).abs().max().item() > 1e-4


def test_a_plain_cache_rotates_each_new_key_once_at_its_position_and_keeps_it(attention):
    x, cache = randn(1, 6, E, seed=2), KVCache()
    with torch.no_grad():
        attention(x[:, :4], is_causal=True, kv_cache=cache)
        stored = cache.keys.clone()
        attention(x[:, 4:], is_causal=True, kv_cache=cache)
        keys = torch.nn.functional.linear(x, attention.k_proj.weight, attention.k_proj.bias)   # [1, N, H_kv·d]
    keys = keys.view(1, 6, H_KV, D).transpose(1, 2).double()                                # [1, H_kv, N, d]
    assert torch.equal(cache.keys[:, :, :4], stored)                                        # never rotated again
    assert (cache.keys.double() - rotate(keys, torch.arange(6))).abs().max().item() < 1e-6


def test_update_without_a_rotation_is_append_and_a_bad_rotation_is_refused():
    cache = KVCache()
    keys, _ = cache.update(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2))
    assert torch.equal(keys, torch.ones(1, 1, 2, 2)) and len(cache) == 2
    with pytest.raises(TypeError, match="KVCache.update: rotate must be callable"):
        cache.update(torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2), rotate="rope")
    assert len(cache) == 2
    assert cache.new_positions(2).tolist() == [2, 3]
    assert cache.new_positions(1, given=torch.tensor([[7], [0]])).tolist() == [[7], [0]]
