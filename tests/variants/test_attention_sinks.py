"""SinkKVCache (StreamingLLM's attention sinks, positions inside the cache) and streaming_losses.

References are independent of the code under test: the kept positions come from the definition
(``j < sinks`` or ``j > p - window``), the rotation is written out here in float64, and the losses
are ``F.cross_entropy`` over the models' own full-sequence forwards.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attn_course.core.kv_cache import KVCache
from attn_course.core.multihead import MultiHeadAttention
from attn_course.models.llama import LlamaConfig, LlamaForCausalLM
from attn_course.models.tiny_language_model import LanguageModelConfig, TinyLanguageModel
from attn_course.positions.rope import RotaryEmbedding
from attn_course.variants.attention_sinks import SinkKVCache
from attn_course.variants.masks import attention_sink_mask
from attn_course.variants.sliding_window import RollingKVCache
from attn_course.variants.streaming import streaming_losses

E, H, H_KV = 16, 4, 2
D = E // H


def kept_positions(p: int, window: int, sinks: int) -> list[int]:
    """Text positions the query at ``p`` sees, from the definition (itself included, last)."""
    return [j for j in range(p + 1) if j < sinks or j > p - window]


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Half-split RoPE (LLaMA pairing), float64: feature i turns with feature i + d/2 by m · base^(-2i/d)."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)             # [d/2]
    angle = positions.to(torch.float64)[:, None] * theta                          # [N, d/2]
    first, second = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([first * angle.cos() - second * angle.sin(),
                      first * angle.sin() + second * angle.cos()], dim=-1)


def reference_decoding(attention: MultiHeadAttention, x: torch.Tensor, window: int, sinks: int,
                       *, in_cache: bool = True) -> torch.Tensor:
    """Float64 outputs ``[1, N, E]`` of one-token decoding under attention sinks, computed directly.

    For token ``p``: the un-rotated keys of the kept positions, rotated at ``0 .. k-1`` (in-cache)
    or at their text positions, the query at ``k - 1`` (or ``p``), softmax attention.
    """
    w = {name: getattr(attention, name).weight.detach().double() for name in ("q_proj", "k_proj", "v_proj", "out_proj")}
    b = {name: getattr(attention, name).bias.detach().double() for name in ("q_proj", "k_proj", "v_proj", "out_proj")}
    x = x.double()[0]                                                              # [N, E]
    q = (x @ w["q_proj"].T + b["q_proj"]).view(-1, H, D).transpose(0, 1)          # [H, N, d]
    k = (x @ w["k_proj"].T + b["k_proj"]).view(-1, H_KV, D).transpose(0, 1)       # [H_kv, N, d]
    v = (x @ w["v_proj"].T + b["v_proj"]).view(-1, H_KV, D).transpose(0, 1)       # [H_kv, N, d]
    outputs = []
    for p in range(x.shape[0]):
        kept = torch.tensor(kept_positions(p, window, sinks))
        key_pos = torch.arange(len(kept)) if in_cache else kept
        query_pos = key_pos[-1:]
        heads = []
        for h in range(H):
            g = h // (H // H_KV)                                                   # its key/value head
            qh = rotate(q[h, p:p + 1], query_pos)                                  # [1, d]
            kh = rotate(k[g, kept], key_pos)                                       # [k, d]
            weights = torch.softmax(qh @ kh.T / math.sqrt(D), dim=-1)              # [1, k]
            heads.append(weights @ v[g, kept])                                     # [1, d]
        outputs.append(torch.cat(heads, dim=-1) @ w["out_proj"].T + b["out_proj"])  # [1, E]
    return torch.cat(outputs)[None]                                                # [1, N, E]


def decode(attention: MultiHeadAttention, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Our outputs ``[1, N, E]``, one token at a time through ``cache``."""
    with torch.no_grad():
        return torch.cat([attention(x[:, t:t + 1], kv_cache=cache, is_causal=True)[0] for t in range(x.shape[1])],
                         dim=1)


@pytest.fixture
def attention() -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(E, H, num_kv_heads=H_KV, rope=RotaryEmbedding(D)).eval()


# --- the cache with RoPE against direct computations ---------------------------------------------


@pytest.mark.parametrize("window, sinks", [(4, 3), (5, 1), (3, 3), (1, 1)])
def test_one_token_decoding_matches_a_float64_computation_at_in_cache_positions(attention, window, sinks):
    x = torch.randn(1, 30, E)
    ours = decode(attention, x, SinkKVCache(window, sinks))
    reference = reference_decoding(attention, x, window, sinks)
    error = (ours.double() - reference).abs().max().item()
    assert error < 1e-5, error
    if sinks:
        # The in-cache numbering matters: text positions give other outputs once tokens are evicted.
        text_positions = reference_decoding(attention, x, window, sinks, in_cache=False)
        assert (text_positions - reference).abs().max().item() > 1e-4


def test_no_sinks_gives_the_rolling_window(attention):
    x = torch.randn(1, 25, E)
    ours = decode(attention, x, SinkKVCache(window=4, sinks=0))
    rolling = decode(attention, x, RollingKVCache(window=4))      # rotated at text positions
    assert (ours - rolling).abs().max().item() < 1e-5


def test_before_the_cache_is_full_it_is_a_plain_cache(attention):
    window, sinks = 5, 3
    x = torch.randn(1, window + sinks, E)                          # the last token is the first one evicting nothing
    assert kept_positions(x.shape[1] - 1, window, sinks) == list(range(x.shape[1]))
    ours = decode(attention, x, SinkKVCache(window, sinks))
    plain = decode(attention, x, KVCache())
    assert (ours - plain).abs().max().item() < 1e-5
    # The same tokens appended at once (a prompt) while nothing is evicted: the plain causal attention.
    with torch.no_grad():
        prompt, _ = attention(x, kv_cache=SinkKVCache(window, sinks), is_causal=True)
    assert (prompt - plain).abs().max().item() < 1e-5


def test_a_prompt_then_one_token_at_a_time_matches_the_direct_computation(attention):
    window, sinks = 4, 2
    x = torch.randn(1, 20, E)
    cache = SinkKVCache(window, sinks)
    with torch.no_grad():
        prompt, _ = attention(x[:, :window + sinks], kv_cache=cache, is_causal=True)
        rest = decode(attention, x[:, window + sinks:], cache)
    reference = reference_decoding(attention, x, window, sinks)
    assert (torch.cat([prompt, rest], dim=1).double() - reference).abs().max().item() < 1e-5


def test_several_tokens_with_rope_past_the_first_eviction_are_refused_and_the_cache_is_untouched(attention):
    cache = SinkKVCache(window=4, sinks=2)
    with torch.no_grad():
        attention(torch.randn(1, 5, E), kv_cache=cache, is_causal=True)
        with pytest.raises(ValueError, match=r"new_tokens=2 .* sinks \+ window = 6 \(here at most 1\)"):
            attention(torch.randn(1, 2, E), kv_cache=cache, is_causal=True)
    assert len(cache) == 5 and cache.held == 5


# --- what the cache holds and returns ------------------------------------------------------------


@pytest.mark.parametrize("window, sinks", [(4, 2), (3, 0), (2, 2), (1, 1), (6, 3)])
def test_append_returns_the_keys_the_new_queries_see_in_chunks_of_any_size(window, sinks):
    generator = torch.Generator().manual_seed(window * 10 + sinks)
    cache, length = SinkKVCache(window, sinks), 0
    while length < 60:
        n = int(torch.randint(1, 8, (1,), generator=generator))
        # Some new query sees j: j < S, or j > (first new position) - W; up to the newest token.
        expected = [j for j in range(length + n) if j < sinks or j > length - window]
        positions = cache.token_positions(n)
        assert positions.tolist() == expected and cache.attended_length(n) == len(expected)
        # The mask is attention_sink_mask's, at the columns the cache returns.
        full = attention_sink_mask(n, length + n, window=window, sinks=sinks)      # [n, length + n]
        assert torch.equal(cache.window_mask(n), full[:, expected])
        new = torch.arange(length, length + n, dtype=torch.float32).view(1, 1, n, 1)
        keys, values = cache.append(new, -new)
        assert keys.flatten().tolist() == [float(j) for j in expected]
        assert values.flatten().tolist() == [-float(j) for j in expected]
        length += n
        held = [j for j in range(length) if j < sinks or j > length - window]   # what the next token sees
        assert len(cache) == length and cache.keys.flatten().tolist() == [float(j) for j in held]


def test_several_tokens_without_rope_under_window_mask_equal_one_at_a_time():
    torch.manual_seed(1)
    attention = MultiHeadAttention(E, H, num_kv_heads=H_KV).eval()   # no RoPE: no positions needed
    x = torch.randn(1, 23, E)
    one_by_one = decode(attention, x, SinkKVCache(window=4, sinks=2))
    cache, outputs, start = SinkKVCache(window=4, sinks=2), [], 0
    with torch.no_grad():
        for n in (3, 7, 1, 5, 7):
            mask = cache.window_mask(n)
            outputs.append(attention(x[:, start:start + n], kv_cache=cache, mask=mask)[0])
            start += n
    assert (torch.cat(outputs, dim=1) - one_by_one).abs().max().item() < 1e-5


def test_memory_stays_at_sinks_plus_window_minus_one_tokens():
    window, sinks, batch, d_k, d_v = 6, 4, 2, 8, 5
    cache = SinkKVCache(window, sinks)
    sizes = {}
    for t in range(500):
        cache.append(torch.randn(batch, H_KV, 1, d_k), torch.randn(batch, H_KV, 1, d_v))
        if t + 1 in (10, 500):
            sizes[t + 1] = cache.memory_bytes
    assert sizes[10] == sizes[500] == batch * H_KV * (sinks + window - 1) * (d_k + d_v) * 4
    assert len(cache) == 500 and cache.held == sinks + window - 1 == cache.capacity


def test_reset_forgets_everything():
    cache = SinkKVCache(window=3, sinks=1)
    cache.append(torch.zeros(1, 1, 7, 2), torch.zeros(1, 1, 7, 2))
    cache.reset()
    assert len(cache) == 0 and cache.memory_bytes == 0 and cache.attended_length(1) == 1
    cache.append(torch.ones(2, 3, 1, 4), torch.ones(2, 3, 1, 4))    # another layout is fine after a reset
    assert cache.keys.shape == (2, 3, 1, 4)


# --- streaming_losses ------------------------------------------------------------------------------


def tiny_llama(**overrides) -> LlamaForCausalLM:
    torch.manual_seed(2)
    config = LlamaConfig(**{**dict(vocab_size=13, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2), **overrides})
    return LlamaForCausalLM(config).eval()


def test_streaming_losses_without_eviction_are_the_full_forward_cross_entropy():
    model = tiny_llama()
    ids = torch.randint(13, (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = F.cross_entropy(model(ids).logits[0, :-1], ids[0, 1:], reduction="none")   # [N - 1]
    for caches in ([SinkKVCache(window=24, sinks=4) for _ in range(2)], [KVCache() for _ in range(2)]):
        losses = streaming_losses(model, ids, caches)
        assert losses.shape == (23,) and losses.dtype == torch.float32
        assert (losses - full).abs().max().item() < 1e-5
    assert len(caches[0]) == 23


def test_streaming_losses_with_eviction_in_one_layer_are_a_forward_over_the_kept_tokens():
    # One layer: the keys and values of a token depend on the token alone, so decoding token p with
    # the sinks cache is one forward over the kept tokens, renumbered 0..k-1.
    window, sinks = 4, 2
    model = tiny_llama(num_hidden_layers=1, sliding_window=sinks + window)
    ids = torch.randint(13, (1, 30), generator=torch.Generator().manual_seed(4))
    losses = streaming_losses(model, ids, [SinkKVCache(window, sinks)])
    reference = []
    with torch.no_grad():
        for p in range(ids.shape[1] - 1):
            kept = ids[:, kept_positions(p, window, sinks)]                             # [1, k]
            reference.append(F.cross_entropy(model(kept).logits[0, -1], ids[0, p + 1]))
    assert (losses - torch.stack(reference)).abs().max().item() < 1e-5


def test_streaming_losses_read_a_model_that_returns_logits_and_leave_its_mode():
    torch.manual_seed(5)
    model = TinyLanguageModel(LanguageModelConfig(vocab_size=11, max_length=32, embed_dim=16, num_heads=2,
                                                  num_layers=2))
    ids = torch.randint(11, (1, 20), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        full = F.cross_entropy(model.eval()(ids)[0, :-1], ids[0, 1:], reduction="none")
    model.train()
    losses = streaming_losses(model, ids, [SinkKVCache(window=20, sinks=2) for _ in range(2)])
    assert (losses - full).abs().max().item() < 1e-5
    assert model.training


# --- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(window=0, sinks=0), ValueError, "window must be >= 1, got 0"),
    (dict(window=4, sinks=5), ValueError, "sinks must be at most window .* got sinks=5, window=4"),
    (dict(window=4, sinks=-1), ValueError, "sinks must be >= 0, got -1"),
    (dict(window=4, sinks=1.5), TypeError, "sinks must be an int, got float"),
    (dict(window="4", sinks=1), TypeError, "window must be an int, got str"),
])
def test_bad_sizes_are_refused(kwargs, error, message):
    with pytest.raises(error, match="SinkKVCache: " + message):
        SinkKVCache(**kwargs)


def test_positions_other_than_the_default_are_refused_with_the_cache(attention):
    cache = SinkKVCache(window=3, sinks=1)
    with torch.no_grad():
        attention(torch.randn(1, 2, E), kv_cache=cache, positions=torch.tensor([0, 1]))  # the default: fine
        with pytest.raises(ValueError, match=r"positions cannot be given with SinkKVCache\(.*got \[5\]"):
            attention(torch.randn(1, 1, E), kv_cache=cache, positions=torch.tensor([5]))
    assert len(cache) == 2


@pytest.mark.parametrize("keys, values, message", [
    (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), "keys must be"),
    (torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 2, 4), "keys and values must be .* got keys \\[1, 2, 3, 4\\]"),
    (torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4), "do not match the cache's .* \\[1, 2, ·, 4\\]"),
    (torch.zeros(1, 2, 1, 5), torch.zeros(1, 2, 1, 4), "do not match the cache's"),
])
def test_tensors_of_the_wrong_shape_are_refused(keys, values, message):
    cache = SinkKVCache(window=3, sinks=1)
    cache.append(torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 4, 4))     # past the sinks: both parts filled
    with pytest.raises(ValueError, match="SinkKVCache.append: .*" + message):
        cache.append(keys, values)
    assert len(cache) == 4


def test_an_empty_cache_has_no_keys_and_new_tokens_are_checked():
    cache = SinkKVCache(window=3, sinks=1)
    with pytest.raises(ValueError, match="SinkKVCache.keys: the cache is empty"):
        _ = cache.keys
    with pytest.raises(ValueError, match="SinkKVCache.window_mask: new_tokens must be >= 1, got 0"):
        cache.window_mask(0)
    with pytest.raises(TypeError, match="SinkKVCache.cache_positions: new_tokens must be an int"):
        cache.cache_positions(1.0)


@pytest.mark.parametrize("ids, caches, error, message", [
    (torch.zeros(2, 5, dtype=torch.long), None, ValueError, r"ids must be \[1, N\] with N >= 2, got shape \[2, 5\]"),
    (torch.zeros(1, 1, dtype=torch.long), None, ValueError, r"ids must be \[1, N\] .* got shape \[1, 1\]"),
    (torch.zeros(1, 5), None, TypeError, "ids must be an integer tensor"),
    (torch.zeros(1, 5, dtype=torch.long), SinkKVCache(4, 1), TypeError, "caches must be a list of KVCache"),
    (torch.zeros(1, 5, dtype=torch.long), "full", ValueError, r"caches must be .* empty caches .* \[3, 3\]"),
])
def test_streaming_losses_check_their_input(ids, caches, error, message):
    model = tiny_llama()
    if caches is None:
        caches = [SinkKVCache(4, 1) for _ in range(2)]
    elif caches == "full":
        caches = [SinkKVCache(4, 1) for _ in range(2)]
        model(torch.zeros(1, 3, dtype=torch.long), kv_caches=caches)
    with pytest.raises(error, match="streaming_losses: " + message):
        streaming_losses(model, ids, caches)
