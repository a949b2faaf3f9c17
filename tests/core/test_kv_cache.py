"""Tests for attn_course.core.kv_cache: storage laws, growth, errors, and decoding with MultiHeadAttention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from attn_course.core.kv_cache import KVCache
from attn_course.core.masks import padding_mask
from attn_course.core.multihead import MultiHeadAttention

from helpers import FAST, close, randn

E, H = 16, 4                      # model width and query heads of the attention modules
D = E // H                        # head size


def bytes_per_element(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8


def next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


# --- KVCache on its own ---------------------------------------------------------------------


def test_new_cache_is_empty():
    cache = KVCache()
    assert len(cache) == 0 and cache.length == 0
    assert cache.capacity == 0 and cache.memory_bytes == 0


@pytest.mark.parametrize("attribute", ["keys", "values"])
def test_reading_an_empty_cache_raises_value_error(attribute):
    with pytest.raises(ValueError, match=rf"KVCache\.{attribute}: the cache is empty"):
        getattr(KVCache(), attribute)


@FAST
@given(
    chunks=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    batch=st.integers(1, 2),
    heads=st.integers(1, 3),
    d_k=st.integers(1, 4),
    d_v=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_cache_holds_the_concatenation_of_everything_appended(chunks, batch, heads, d_k, d_v, seed):
    cache = KVCache()
    all_keys = [randn(batch, heads, n, d_k, seed=seed + 2 * i) for i, n in enumerate(chunks)]
    all_values = [randn(batch, heads, n, d_v, seed=seed + 2 * i + 1) for i, n in enumerate(chunks)]
    for step, (keys, values) in enumerate(zip(all_keys, all_values)):
        returned_keys, returned_values = cache.append(keys, values)
        expected_keys = torch.cat(all_keys[: step + 1], dim=2)
        expected_values = torch.cat(all_values[: step + 1], dim=2)
        assert torch.equal(returned_keys, expected_keys) and torch.equal(returned_values, expected_values)
        assert torch.equal(cache.keys, expected_keys) and torch.equal(cache.values, expected_values)
        assert len(cache) == expected_keys.shape[2]
        # Doubling keeps at least half of the buffer in use: length <= capacity < 2 · length.
        assert len(cache) <= cache.capacity < 2 * len(cache)


def test_capacity_doubles_when_appending_one_token_at_a_time():
    cache = KVCache()
    capacities = []
    for t in range(1, 18):
        cache.append(randn(2, 3, 1, 4, seed=t), randn(2, 3, 1, 4, seed=-t))
        capacities.append(cache.capacity)
    assert capacities == [next_power_of_two(t) for t in range(1, 18)]
    assert capacities[:9] == [1, 2, 4, 4, 8, 8, 8, 8, 16]


def test_buffer_moves_only_when_the_capacity_grows():
    cache = KVCache()
    moves, address = 0, None
    for t in range(1, 34):
        cache.append(randn(1, 2, 1, 4, seed=t), randn(1, 2, 1, 4, seed=-t))
        if cache.keys.data_ptr() != address:
            moves, address = moves + 1, cache.keys.data_ptr()
    # Buffers of 1, 2, 4, ..., 64: seven allocations for 33 tokens, O(log N) copies in all.
    assert cache.capacity == 64
    assert moves == 7


def test_max_length_preallocates_and_never_copies_within_it():
    cache = KVCache(max_length=8)
    cache.append(randn(2, 3, 1, 4, seed=0), randn(2, 3, 1, 4, seed=1))
    assert cache.capacity == 8
    key_address, value_address = cache.keys.data_ptr(), cache.values.data_ptr()
    for t in range(1, 8):
        cache.append(randn(2, 3, 1, 4, seed=2 * t), randn(2, 3, 1, 4, seed=2 * t + 1))
        assert cache.capacity == 8
        assert cache.keys.data_ptr() == key_address and cache.values.data_ptr() == value_address
    assert len(cache) == 8


def test_max_length_is_exceeded_by_growing_and_keeps_the_contents():
    cache = KVCache(max_length=4)
    keys, values = randn(1, 2, 4, 3, seed=1), randn(1, 2, 4, 3, seed=2)
    cache.append(keys, values)
    assert cache.capacity == 4
    more_keys, more_values = randn(1, 2, 1, 3, seed=3), randn(1, 2, 1, 3, seed=4)
    cache.append(more_keys, more_values)
    assert cache.capacity > 4 and len(cache) == 5
    assert torch.equal(cache.keys, torch.cat([keys, more_keys], 2))
    assert torch.equal(cache.values, torch.cat([values, more_values], 2))


def test_first_chunk_larger_than_max_length_still_fits():
    cache = KVCache(max_length=2)
    keys = randn(1, 1, 5, 3, seed=1)
    cache.append(keys, keys)
    assert len(cache) == 5 and cache.capacity >= 5
    assert torch.equal(cache.keys, keys)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("max_length", [None, 6])
def test_memory_bytes_counts_keys_and_values_at_full_capacity(dtype, max_length):
    batch, heads, head_dim = 2, 3, 4
    cache = KVCache(max_length=max_length)
    for t in range(5):
        cache.append(randn(batch, heads, 1, head_dim, seed=t, dtype=dtype),
                     randn(batch, heads, 1, head_dim, seed=-t, dtype=dtype))
    capacity = 8 if max_length is None else 6
    assert cache.capacity == capacity
    assert cache.memory_bytes == 2 * batch * heads * capacity * head_dim * bytes_per_element(dtype)


def test_memory_bytes_with_different_key_and_value_sizes():
    cache = KVCache()
    cache.append(randn(2, 3, 3, 4), randn(2, 3, 3, 6))               # d_k = 4, d_v = 6
    assert cache.keys.shape == (2, 3, 3, 4) and cache.values.shape == (2, 3, 3, 6)
    assert cache.memory_bytes == 2 * 3 * 3 * (4 + 6) * 4


def test_reset_empties_the_cache_and_accepts_new_shapes():
    cache = KVCache()
    cache.append(randn(2, 3, 5, 4), randn(2, 3, 5, 4))
    cache.reset()
    assert len(cache) == 0 and cache.capacity == 0 and cache.memory_bytes == 0
    with pytest.raises(ValueError, match="empty"):
        _ = cache.keys
    keys = randn(1, 2, 2, 8, seed=1, dtype=torch.float64)            # other shape and dtype than before
    values = randn(1, 2, 2, 8, seed=2, dtype=torch.float64)
    returned_keys, returned_values = cache.append(keys, values)
    assert torch.equal(returned_keys, keys) and torch.equal(returned_values, values)


APPEND_BAD_ARGUMENTS = [
    pytest.param(randn(2, 3, 1, 4), randn(2, 3, 1, 4)[0], ValueError, "values", id="values-3d"),
    pytest.param(randn(3, 1, 4), randn(3, 1, 4), ValueError, "keys", id="both-3d"),
    pytest.param(randn(1, 2, 3, 1, 4), randn(1, 2, 3, 1, 4), ValueError, "[B, H_kv, N_new, d]", id="both-5d"),
    pytest.param(randn(2, 3, 1, 4), randn(2, 3, 2, 4), ValueError, "N_new", id="different-token-counts"),
    pytest.param(randn(2, 3, 1, 4), randn(2, 2, 1, 4), ValueError, "H_kv", id="different-heads"),
    pytest.param(randn(2, 3, 1, 4), randn(1, 3, 1, 4), ValueError, "B", id="different-batches"),
    pytest.param(torch.zeros(2, 3, 1, 4, dtype=torch.long), randn(2, 3, 1, 4), TypeError, "keys",
                 id="int-keys"),
    pytest.param(randn(2, 3, 1, 4), torch.zeros(2, 3, 1, 4, dtype=torch.int32), TypeError, "values",
                 id="int-values"),
    pytest.param(torch.zeros(2, 3, 1, 4, dtype=torch.bool), randn(2, 3, 1, 4), TypeError, "keys",
                 id="bool-keys"),
    pytest.param([[[[0.0]]]], randn(1, 1, 1, 1), TypeError, "keys", id="list-keys"),
    pytest.param(randn(2, 3, 1, 4), randn(2, 3, 1, 4, dtype=torch.float64), TypeError, "dtype",
                 id="keys-and-values-of-two-dtypes"),
]


@pytest.mark.parametrize(("keys", "values", "error", "fragment"), APPEND_BAD_ARGUMENTS)
def test_append_rejects_bad_keys_and_values(keys, values, error, fragment):
    cache = KVCache()
    with pytest.raises(error) as raised:
        cache.append(keys, values)
    assert str(raised.value).startswith("KVCache.append:")
    assert fragment in str(raised.value)
    assert len(cache) == 0 and cache.capacity == 0


MISMATCHES_WITH_THE_CACHE = [
    pytest.param(randn(1, 3, 1, 4), randn(1, 3, 1, 4), id="other-batch-size"),
    pytest.param(randn(2, 2, 1, 4), randn(2, 2, 1, 4), id="other-head-count"),
    pytest.param(randn(2, 3, 1, 5), randn(2, 3, 1, 4), id="other-key-size"),
    pytest.param(randn(2, 3, 1, 4), randn(2, 3, 1, 5), id="other-value-size"),
    pytest.param(randn(2, 3, 1, 4, dtype=torch.float64), randn(2, 3, 1, 4, dtype=torch.float64),
                 id="other-dtype"),
    pytest.param(randn(2, 3, 1, 4, dtype=torch.float16), randn(2, 3, 1, 4, dtype=torch.float16),
                 id="half-precision"),
]


@pytest.mark.parametrize(("keys", "values"), MISMATCHES_WITH_THE_CACHE)
def test_append_rejects_keys_and_values_that_do_not_match_the_cache(keys, values):
    cache = KVCache()
    held_keys, held_values = randn(2, 3, 2, 4, seed=1), randn(2, 3, 2, 4, seed=2)
    cache.append(held_keys, held_values)
    with pytest.raises(ValueError, match=r"^KVCache\.append: .*do not match the cache"):
        cache.append(keys, values)
    # The failed append changed nothing.
    assert len(cache) == 2
    assert torch.equal(cache.keys, held_keys) and torch.equal(cache.values, held_values)


@pytest.mark.parametrize(("max_length", "error"), [(0, ValueError), (-3, ValueError), (2.0, TypeError),
                                                   (True, TypeError), ("8", TypeError)])
def test_max_length_must_be_a_positive_int(max_length, error):
    with pytest.raises(error, match=r"^KVCache: max_length must"):
        KVCache(max_length=max_length)


# --- decoding with MultiHeadAttention -------------------------------------------------------


def attention(kv_heads: int, *, seed: int = 0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(E, H, num_kv_heads=kv_heads).eval()


KV_HEADS = [pytest.param(4, id="multi-head"), pytest.param(2, id="grouped-query"),
            pytest.param(1, id="multi-query")]


def decode(module: MultiHeadAttention, x: torch.Tensor, chunks, cache: KVCache, **kwargs):
    """Feed x to the module chunk by chunk through the cache; return outputs and per-step weights."""
    outputs, weights, start = [], [], 0
    for size in chunks:
        output, weight = module(x[:, start:start + size], kv_cache=cache, **kwargs)
        start += size
        assert len(cache) == start
        assert weight.shape == (x.shape[0], H, size, start)
        outputs.append(output)
        weights.append(weight)
    assert start == x.shape[1]
    return torch.cat(outputs, dim=1), weights


@pytest.mark.parametrize("chunks", [[1] * 7, [2, 2, 3], [3, 1, 2, 1], [7]],
                         ids=["one-at-a-time", "twos-and-three", "mixed", "single-prefill"])
@pytest.mark.parametrize("kv_heads", KV_HEADS)
@torch.no_grad()
def test_decoding_through_the_cache_matches_one_causal_pass(kv_heads, chunks):
    module = attention(kv_heads)
    x = randn(2, 7, E, seed=1)
    expected, expected_weights = module(x, is_causal=True)
    cache = KVCache()
    output, weights = decode(module, x, chunks, cache, is_causal=True)
    close(output, expected)
    start = 0
    for size, weight in zip(chunks, weights):
        close(weight, expected_weights[:, :, start:start + size, :start + size])
        start += size
    assert cache.keys.shape == cache.values.shape == (2, kv_heads, 7, D)


@pytest.mark.parametrize("kv_heads", KV_HEADS)
@torch.no_grad()
def test_cache_holds_the_projected_keys_and_values_of_every_token(kv_heads):
    module = attention(kv_heads)
    x = randn(2, 5, E, seed=1)
    cache = KVCache()
    decode(module, x, [2, 1, 2], cache, is_causal=True)
    keys = F.linear(x, module.k_proj.weight, module.k_proj.bias)      # [B, N, H_kv · d]
    values = F.linear(x, module.v_proj.weight, module.v_proj.bias)
    for b in range(2):
        for h in range(kv_heads):
            for n in range(5):
                close(cache.keys[b, h, n], keys[b, n, h * D:(h + 1) * D])
                close(cache.values[b, h, n], values[b, n, h * D:(h + 1) * D])


@FAST
@given(
    chunks=st.lists(st.integers(1, 3), min_size=1, max_size=5),
    kv_heads=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**31 - 1),
)
@torch.no_grad()
def test_any_split_into_chunks_decodes_like_one_causal_pass(chunks, kv_heads, seed):
    module = attention(kv_heads, seed=seed % 1000)
    x = randn(1, sum(chunks), E, seed=seed)
    output, _ = decode(module, x, chunks, KVCache(), is_causal=True)
    close(output, module(x, is_causal=True)[0])


@pytest.mark.parametrize("kv_heads", KV_HEADS)
@torch.no_grad()
def test_decoding_with_a_padding_mask_over_all_keys_matches_one_pass(kv_heads):
    module = attention(kv_heads)
    x = randn(2, 6, E, seed=1)
    lengths = [6, 4]                             # sequence 1 ends in padding
    expected, _ = module(x, mask=padding_mask(lengths, 6), is_causal=True)
    cache, outputs, start = KVCache(), [], 0
    for size in [3, 1, 2]:
        start += size
        mask = padding_mask(lengths, 6)[..., :start]                  # [B, 1, N_k so far]
        outputs.append(module(x[:, start - size:start], mask=mask, kv_cache=cache, is_causal=True)[0])
    close(torch.cat(outputs, 1), expected)


@pytest.mark.parametrize("kv_heads", KV_HEADS)
@torch.no_grad()
def test_without_is_causal_new_queries_attend_to_every_cached_key(kv_heads):
    module = attention(kv_heads)
    x = randn(2, 6, E, seed=1)
    cache = KVCache()
    module(x[:, :4], kv_cache=cache, is_causal=True)                  # prefill 4 tokens
    output, weights = module(x[:, 4:], kv_cache=cache)                # 2 new tokens, no mask
    assert weights.shape == (2, H, 2, 6)
    assert (weights[:, :, 0, 5] > 0).all()                            # the first new query sees the second

    # Reference: project independently, repeat key/value heads for the groups, SDPA without a mask.
    q = F.linear(x[:, 4:], module.q_proj.weight, module.q_proj.bias).view(2, 2, H, D).transpose(1, 2)
    k = F.linear(x, module.k_proj.weight, module.k_proj.bias).view(2, 6, kv_heads, D).transpose(1, 2)
    v = F.linear(x, module.v_proj.weight, module.v_proj.bias).view(2, 6, kv_heads, D).transpose(1, 2)
    k, v = k.repeat_interleave(H // kv_heads, dim=1), v.repeat_interleave(H // kv_heads, dim=1)
    heads = F.scaled_dot_product_attention(q, k, v)                   # [B, H, 2, d]
    expected = F.linear(heads.transpose(1, 2).reshape(2, 2, E), module.out_proj.weight, module.out_proj.bias)
    close(output, expected)


@torch.no_grad()
def test_is_causal_with_a_cache_places_new_queries_after_the_cached_tokens():
    module = attention(4)
    x = randn(1, 5, E, seed=1)
    cache = KVCache()
    module(x[:, :3], kv_cache=cache, is_causal=True)
    _, weights = module(x[:, 3:], kv_cache=cache, is_causal=True)     # queries at positions 3 and 4
    assert torch.equal(weights[0, :, 0, 4], torch.zeros(H))           # position 3 cannot see 4
    assert (weights[0, :, 0, :4] > 0).all() and (weights[0, :, 1] > 0).all()


@pytest.mark.parametrize("kv_heads", KV_HEADS)
@torch.no_grad()
def test_cache_memory_shrinks_with_fewer_key_value_heads(kv_heads):
    module = attention(kv_heads)
    cache = KVCache(max_length=16)
    for t in range(5):
        module(randn(3, 1, E, seed=t), kv_cache=cache, is_causal=True)
    assert cache.capacity == 16
    assert cache.memory_bytes == 2 * 3 * kv_heads * 16 * D * bytes_per_element(torch.float32)


@torch.no_grad()
def test_reset_cache_decodes_a_new_sequence_like_a_fresh_one():
    module = attention(2)
    first, second = randn(2, 4, E, seed=1), randn(2, 5, E, seed=2)
    cache = KVCache()
    decode(module, first, [1] * 4, cache, is_causal=True)
    cache.reset()
    reused, _ = decode(module, second, [2, 1, 2], cache, is_causal=True)
    fresh, _ = decode(module, second, [2, 1, 2], KVCache(), is_causal=True)
    assert torch.equal(reused, fresh)
    close(reused, module(second, is_causal=True)[0])


@torch.no_grad()
def test_a_cache_from_a_module_with_other_head_counts_is_rejected():
    cache = KVCache()
    attention(2)(randn(1, 3, E), kv_cache=cache)
    with pytest.raises(ValueError, match=r"^KVCache\.update: .*do not match the cache"):
        attention(4)(randn(1, 1, E), kv_cache=cache)


def test_an_empty_first_append_allocates_nothing_and_the_next_token_sizes_the_buffer():
    cache = KVCache()
    empty = torch.zeros(1, 2, 0, 4)
    keys, values = cache.append(empty, empty)
    assert keys.shape == (1, 2, 0, 4) and len(cache) == 0 and cache.memory_bytes == 0
    one = torch.ones(1, 2, 1, 4)
    for _ in range(5):
        cache.append(one, one)
    assert (len(cache), cache.capacity) == (5, 8)          # room for 1, then doubled: 2, 4, 8
