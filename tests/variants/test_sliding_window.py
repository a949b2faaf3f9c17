"""Sliding-window attention with a rolling KV cache, and Mistral against Hugging Face ``transformers``.

The rolling cache is compared with full attention under :func:`sliding_window_mask` (no cache) and
with a plain list of the last tokens; the Mistral decoder with a small random
``transformers.MistralForCausalLM`` (eager attention, sliding_window=4) saved with ``save_pretrained``
and read back by :func:`load_pretrained`, within 1e-5 in float32 on sequences of three windows and more.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from attn_course.core.kv_cache import KVCache
from attn_course.core.multihead import MultiHeadAttention
from attn_course.models.llama import LlamaConfig, LlamaForCausalLM, load_pretrained
from attn_course.positions.rope import RotaryEmbedding
from attn_course.variants.masks import sliding_window_mask
from attn_course.variants.sliding_window import RollingKVCache

transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-5
WINDOW = 4
SIZES = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def reference_model(seed: int = 0, **overrides) -> transformers.MistralForCausalLM:
    """A random Hugging Face Mistral in eval mode, weights drawn with std 0.1 and norms around 1.

    Larger than Hugging Face's 0.02 initialisation, so that every weight matters and greedy
    decoding does not hinge on near-ties.
    """
    torch.manual_seed(seed)
    config = transformers.MistralConfig(**{**SIZES, "sliding_window": WINDOW, **overrides}, bos_token_id=None,
                                        eos_token_id=None, pad_token_id=None, attn_implementation="eager")
    model = transformers.MistralForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1 + 0.2 * torch.randn_like(parameter))
            else:
                parameter.normal_(0.0, 0.1)
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """``(folder, Hugging Face Mistral)``, saved once for the whole file."""
    folder = tmp_path_factory.mktemp("mistral")
    reference = reference_model()
    with contextlib.redirect_stderr(io.StringIO()):             # the "Writing model shards" bar
        reference.save_pretrained(folder, safe_serialization=True)
    return folder, reference


@pytest.fixture(scope="module")
def ours(checkpoint):
    return load_pretrained(checkpoint[0])


def held_bytes(cache: RollingKVCache) -> int:
    """Bytes of every tensor storage the cache object refers to (each storage counted once)."""
    storages = {}
    for value in vars(cache).values():
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


# --- the window convention --------------------------------------------------------------------


def test_the_window_is_hugging_faces_query_itself_and_the_window_minus_one_before():
    # transformers 5.24 masking_utils: key j is visible to query i when i - W < j <= i.
    from transformers.masking_utils import sliding_window_causal_mask_function

    n = 11
    for window in (1, 2, WINDOW, 7):
        visible = sliding_window_causal_mask_function(window)
        queries, keys = torch.arange(n)[:, None], torch.arange(n)[None, :]         # indices, vectorised
        theirs = visible(torch.tensor(0), torch.tensor(0), queries, keys)          # [N, N]
        assert torch.equal(sliding_window_mask(n, window=window), theirs)
        assert sliding_window_mask(n, window=window).sum(-1).max() == window


# --- the rolling cache ------------------------------------------------------------------------


@pytest.mark.parametrize("window", [1, 2, 5])
@pytest.mark.parametrize("chunks", [[1] * 17, [6, 1, 1, 4, 5], [17], [3, 9, 2, 3]])
def test_append_returns_the_held_tokens_then_the_new_ones_in_position_order(window, chunks):
    cache, seen = RollingKVCache(window), []
    for n in chunks:
        start = len(seen)
        positions = torch.arange(start, start + n, dtype=torch.float64)            # the value is the position
        keys = positions.view(1, 1, n, 1).expand(2, 3, n, 1)                       # [B, H_kv, N_new, 1]
        assert cache.attended_length(n) == min(len(seen), window - 1) + n
        returned, values = cache.append(keys, -keys)
        expected = seen[len(seen) - min(len(seen), window - 1):] + positions.tolist()
        assert returned[0, 0, :, 0].tolist() == expected and values[1, 2, :, 0].tolist() == [-p for p in expected]
        seen += positions.tolist()
        assert len(cache) == len(seen)                                             # the next position
        assert cache.keys[0, 0, :, 0].tolist() == seen[len(seen) - min(len(seen), window - 1):]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
@pytest.mark.parametrize("window", [1, 3, WINDOW, 20])
@pytest.mark.parametrize("chunks", [[1] * 15, [5, 1, 1, 4, 4], [2, 9, 4]])
def test_decoding_with_a_rolling_cache_equals_full_attention_under_the_sliding_mask(dtype, tolerance, window,
                                                                                     chunks):
    torch.manual_seed(3)
    attention = MultiHeadAttention(32, 4, num_kv_heads=2, rope=RotaryEmbedding(8)).to(dtype)
    x = torch.randn(2, sum(chunks), 32, dtype=dtype)                                 # [B, N, E], N > window
    full, _ = attention(x, mask=sliding_window_mask(x.shape[1], window=window))     # no cache
    cache, outputs, start = RollingKVCache(window), [], 0
    for n in chunks:
        output, weights = attention(x[:, start:start + n], mask=cache.window_mask(n), is_causal=True,
                                    kv_cache=cache)
        assert weights.shape[-1] == min(start, window - 1) + n                     # only the window is read
        outputs.append(output)
        start += n
    assert max_difference(torch.cat(outputs, dim=1), full) <= tolerance


def test_one_token_at_a_time_needs_no_window_mask():
    # The cache returns exactly the window, so the causal mask alone gives sliding-window attention.
    torch.manual_seed(4)
    attention = MultiHeadAttention(16, 2, rope=RotaryEmbedding(8)).double()
    x = torch.randn(1, 12, 16, dtype=torch.float64)
    full, _ = attention(x, mask=sliding_window_mask(12, window=3))
    cache = RollingKVCache(3)
    steps = [attention(x[:, t:t + 1], is_causal=True, kv_cache=cache)[0] for t in range(12)]
    assert max_difference(torch.cat(steps, dim=1), full) < 1e-12


def test_the_cache_memory_stays_at_the_window_however_long_it_runs():
    batch, heads, head_dim, window = 2, 3, 8, 16
    window_bytes = 2 * batch * heads * (window - 1) * head_dim * 4                  # keys + values, float32
    rolling, growing, measured = RollingKVCache(window), KVCache(), {}
    for t in range(1, 1001):
        new = torch.randn(batch, heads, 1, head_dim)
        rolling.append(new, new)
        growing.append(new, new)
        if t in (10, 100, 1000):
            measured[t] = held_bytes(rolling)
            assert rolling.memory_bytes == measured[t]
            assert growing.memory_bytes >= 2 * batch * heads * t * head_dim * 4        # the contrast: grows
    assert measured == {10: window_bytes, 100: window_bytes, 1000: window_bytes}   # 5760 bytes each
    assert len(rolling) == 1000 and rolling.capacity == window - 1
    prefilled = RollingKVCache(window)
    prefilled.append(torch.randn(batch, heads, 1000, head_dim), torch.randn(batch, heads, 1000, head_dim))
    assert held_bytes(prefilled) == window_bytes                                   # a long prompt too


def test_reset_forgets_tokens_and_positions():
    cache = RollingKVCache(3)
    cache.append(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))
    cache.reset()
    assert len(cache) == 0 and cache.capacity == 0 and cache.memory_bytes == 0
    keys, _ = cache.append(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))           # another shape is fine now
    assert keys.shape == (2, 1, 1, 4)


def test_invalid_windows_and_inputs_are_named():
    with pytest.raises(ValueError, match="RollingKVCache: window must be >= 1, got 0"):
        RollingKVCache(0)
    with pytest.raises(TypeError, match="RollingKVCache: window must be an int, got float"):
        RollingKVCache(4.0)
    with pytest.raises(TypeError, match="window must be an int, got bool"):
        RollingKVCache(True)
    cache = RollingKVCache(4)
    with pytest.raises(ValueError, match="RollingKVCache.keys: the cache is empty"):
        _ = cache.keys
    with pytest.raises(ValueError, match="RollingKVCache.window_mask: new_tokens must be >= 1, got 0"):
        cache.window_mask(0)
    with pytest.raises(ValueError, match="RollingKVCache.attended_length: new_tokens must be >= 0, got -1"):
        cache.attended_length(-1)
    with pytest.raises(ValueError, match=r"RollingKVCache.append: keys must be 4-D \[B, H_kv, N_new, d\]"):
        cache.append(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="do not match the cache's"):
        cache.append(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))
    assert len(cache) == 3                                                         # a rejected call changes nothing
    with pytest.raises(ValueError, match="LlamaConfig: sliding_window must be >= 1, got 0"):
        LlamaConfig(**SIZES, sliding_window=0)
    with pytest.raises(TypeError, match="LlamaConfig: sliding_window must be an int, got str"):
        LlamaConfig(**SIZES, sliding_window="4")


def test_a_model_refuses_a_cache_that_forgot_what_its_attention_reads():
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    for window, cache_window in ((None, 4), (6, 4)):
        model = LlamaForCausalLM(LlamaConfig(**SIZES, sliding_window=window)).eval()
        caches = [RollingKVCache(cache_window) for _ in model.model.blocks]
        model(ids, kv_caches=caches)                                               # the prompt alone is fine
        with pytest.raises(ValueError, match="returns 4 keys for 1 new token"):
            model(ids[:, :1], kv_caches=caches)


# --- Mistral against transformers -------------------------------------------------------------


def test_a_mistral_config_reads_its_window_and_hugging_faces_defaults(checkpoint, ours):
    assert ours.config.sliding_window == WINDOW
    values = {"model_type": "mistral", "vocab_size": 10, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 8}
    assert LlamaConfig.from_dict({**values, "sliding_window": None}).sliding_window is None
    defaults = transformers.MistralConfig(**values)
    read = LlamaConfig.from_dict(values)                                           # keys left out
    assert (read.sliding_window, read.num_key_value_heads) == (defaults.sliding_window, defaults.num_key_value_heads)
    assert LlamaConfig.from_dict({**values, "model_type": "llama", "sliding_window": 8}).sliding_window is None
    with pytest.raises(ValueError, match="sliding_window must be >= 1, got 0"):
        LlamaConfig.from_dict({**values, "sliding_window": 0})


def test_logits_and_attentions_match_mistral_over_three_windows(checkpoint, ours):
    _, reference = checkpoint
    ids = torch.randint(0, 100, (2, 3 * WINDOW), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        theirs = reference(ids, output_attentions=True)
        mine = ours(ids, output_attentions=True)
        unwindowed = LlamaForCausalLM(LlamaConfig(**SIZES))
        unwindowed.load_state_dict(ours.state_dict())
        plain = unwindowed.eval()(ids).logits
    assert max_difference(mine.logits, theirs.logits) < TOLERANCE
    for a, b in zip(mine.attentions, theirs.attentions):
        assert max_difference(a, b) < TOLERANCE
        assert torch.equal(a == 0, b == 0)                                         # the same keys hidden
    assert max_difference(plain, theirs.logits) > 1e-2                             # the window matters


def test_greedy_generation_past_the_window_matches_mistral_generate(checkpoint, ours):
    _, reference = checkpoint
    ids = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(7))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])                  # one left-padded prompt
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                    output_logits=True, return_dict_in_generate=True)
    mine = ours.generate(ids, 12, attention_mask=mask)                            # rolling caches
    assert mine.sequences.tolist() == theirs.sequences.tolist()
    assert max_difference(mine.logits, torch.stack(theirs.logits, dim=1)) < TOLERANCE


def test_rolling_and_full_caches_decode_alike_and_hold_what_hugging_face_holds(checkpoint, ours):
    _, reference = checkpoint
    ids = torch.randint(0, 100, (1, 3 * WINDOW + 2), generator=torch.Generator().manual_seed(8))
    prompt = 5
    with torch.no_grad():
        full = ours(ids).logits                                                    # [1, N, V]
        for make in (lambda: RollingKVCache(WINDOW), KVCache, lambda: RollingKVCache(2 * WINDOW)):
            caches = [make() for _ in ours.model.blocks]
            steps = [ours(ids[:, :prompt], kv_caches=caches).logits]
            steps += [ours(ids[:, t:t + 1], kv_caches=caches).logits for t in range(prompt, ids.shape[1])]
            assert max_difference(torch.cat(steps, dim=1), full) < TOLERANCE
        theirs = reference(ids, use_cache=True).cache
    rolling = [RollingKVCache(WINDOW) for _ in ours.model.blocks]
    with torch.no_grad():
        ours(ids, kv_caches=rolling)
    for mine, layer in zip(rolling, theirs.layers):
        assert mine.keys.shape == layer.keys.shape                                 # [1, H_kv, W - 1, d]
        assert max_difference(mine.keys, layer.keys) < TOLERANCE                   # the same, rotated, keys
        assert max_difference(mine.values, layer.values) < TOLERANCE
