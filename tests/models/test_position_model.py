"""attn_course.models.position_model: one small character model per position scheme, against references built here
by hand (ALiBi's bias, RoPE's offsets, cached decoding), and its training with or without a fixed first token."""

import math

import pytest
import torch

from attn_course.core.kv_cache import KVCache
from attn_course.data.rhymes import load_rhymes
from attn_course.models.position_model import PositionConfig, PositionLanguageModel, train_position_model
from attn_course.variants.attention_sinks import SinkKVCache
from attn_course.variants.sliding_window import RollingKVCache


def _model(position, *, vocab_size=11, max_length=64, seed=0, heads=4):
    torch.manual_seed(seed)
    return PositionLanguageModel(PositionConfig(vocab_size, position, max_length, embed_dim=16,
                                                num_heads=heads)).eval()


class _OffsetCache(KVCache):
    """A cache that says ``offset`` tokens came before the ones it holds, without keeping them.

    ``len()`` is the next position (what MultiHeadAttention rotates new tokens by); the keys it
    returns are only those appended, as with an attention-sink or rolling cache.
    """

    def __init__(self, offset):
        super().__init__()
        self.offset = offset

    def __len__(self):
        return self.offset + self.length

    def attended_length(self, new_tokens):
        return self.length + new_tokens


def _capture_first_attention(model):
    """Record the input, additive mask and output of block 0's self-attention at every call."""
    calls = []

    def hook(module, args, kwargs, output):
        calls.append((args[0].detach(), kwargs.get("mask"), output[0].detach()))

    handle = model.blocks[0].self_attention.register_forward_hook(hook, with_kwargs=True)
    return calls, handle


def _reference_attention(attention, h, slopes, query_positions, key_positions, sign=1.0):
    """Causal attention with the score bias sign · m_h · (j - i), in float64, from the projections."""
    weight = {name: getattr(attention, name).weight.double() for name in ("q_proj", "k_proj", "v_proj", "out_proj")}
    bias = {name: getattr(attention, name).bias.double() for name in weight}
    B, N_q, E = h.shape
    H = len(slopes)
    d = E // H
    project = {name: h.double() @ weight[name].T + bias[name] for name in ("q_proj", "k_proj", "v_proj")}
    q, k, v = (project[name].view(B, N_q, H, d).transpose(1, 2) for name in ("q_proj", "k_proj", "v_proj"))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)                              # [B, H, N_q, N_k]
    for head, slope in enumerate(slopes):
        for a, i in enumerate(query_positions):
            for b, j in enumerate(key_positions):
                scores[:, head, a, b] += sign * slope * (j - i) if j <= i else -math.inf
    out = torch.softmax(scores, dim=-1) @ v                                      # [B, H, N_q, d]
    return out.transpose(1, 2).reshape(B, N_q, E) @ weight["out_proj"].T + bias["out_proj"]


SLOPES_4_HEADS = [2.0 ** (-8 * h / 4) for h in range(1, 5)]                      # the paper's §3: 1/4 ... 1/256


def test_alibi_scores_get_exactly_slope_times_key_minus_query():
    model = _model("alibi")
    ids = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(1))
    calls, handle = _capture_first_attention(model)
    with torch.no_grad():
        model(ids)
    handle.remove()
    h, mask, output = calls[0]
    positions = list(range(6))
    expected_bias = torch.tensor([[[s * (j - i) for j in positions] for i in positions] for s in SLOPES_4_HEADS],
                                 dtype=torch.float64)                            # [H, N, N]
    torch.testing.assert_close(mask[0].double(), expected_bias, rtol=0, atol=1e-7)
    reference = _reference_attention(model.blocks[0].self_attention, h, SLOPES_4_HEADS, positions, positions)
    torch.testing.assert_close(output.double(), reference, rtol=0, atol=1e-5)
    flipped = _reference_attention(model.blocks[0].self_attention, h, SLOPES_4_HEADS, positions, positions, -1.0)
    assert (output.double() - flipped).abs().max() > 1e-3                       # the test sees the sign


def test_alibi_with_a_cache_biases_new_queries_by_their_absolute_positions():
    model = _model("alibi")
    ids = torch.randint(0, 11, (1, 8), generator=torch.Generator().manual_seed(2))
    caches = [KVCache() for _ in model.blocks]
    calls, handle = _capture_first_attention(model)
    with torch.no_grad():
        model(ids[:, :5], kv_caches=caches)
        stepped = model(ids[:, 5:], kv_caches=caches)                            # queries at 5, 6, 7
        whole = model(ids)
    handle.remove()
    h_new, _, output = calls[1]
    h_all = calls[2][0]
    # The new queries' projections are those of positions 5..7 in the whole run; keys 0..7.
    torch.testing.assert_close(h_new, h_all[:, 5:], rtol=0, atol=1e-6)
    attention = model.blocks[0].self_attention
    reference = _reference_attention(attention, h_all, SLOPES_4_HEADS, range(8), range(8))[:, 5:]
    torch.testing.assert_close(output.double(), reference, rtol=0, atol=1e-5)
    torch.testing.assert_close(stepped, whole[:, 5:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("cache", [RollingKVCache(4), _OffsetCache(3)])
def test_alibi_refuses_caches_that_forget_keys(cache):
    model = _model("alibi", heads=2)
    with pytest.raises(ValueError, match="position='alibi' needs plain KVCache"):
        model(torch.zeros(1, 3, dtype=torch.long), kv_caches=[cache, cache])


def test_rope_logits_do_not_depend_on_where_the_window_starts():
    model = _model("rope")
    ids = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        at_zero = model(ids)
        at_1000 = model(ids, kv_caches=[_OffsetCache(1000) for _ in model.blocks])
    torch.testing.assert_close(at_1000, at_zero, rtol=0, atol=2e-5)


def test_learned_logits_do_depend_on_where_the_window_starts():
    model = _model("learned", max_length=64)
    ids = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        at_zero = model(ids)
        at_40 = model(ids, kv_caches=[_OffsetCache(40) for _ in model.blocks])
    assert (at_40 - at_zero).abs().max() > 1e-2


@pytest.mark.parametrize("position", ["learned", "rope", "alibi", "none"])
def test_decoding_with_a_cache_matches_the_whole_sequence(position):
    model = _model(position)
    ids = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(4))
    caches = [KVCache() for _ in model.blocks]
    with torch.no_grad():
        whole = model(ids)
        parts = [model(ids[:, :4], kv_caches=caches)] + [model(ids[:, t:t + 1], kv_caches=caches) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=0, atol=1e-5)


def test_training_is_deterministic():
    first, _ = train_position_model("alibi", train_length=8, max_length=8, steps=3)
    second, _ = train_position_model("alibi", train_length=8, max_length=8, steps=3)
    other, _ = train_position_model("alibi", train_length=8, max_length=8, steps=3, seed=1)
    for name, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[name]), name
    assert not torch.equal(first.head.weight, other.head.weight)


def test_learned_positions_beyond_the_training_length_get_no_gradient_only_weight_decay():
    steps, lr, L, max_length = 4, 5e-3, 8, 24
    model, tokenizer = train_position_model("learned", train_length=L, max_length=max_length, steps=steps,
                                            learning_rate=lr)
    torch.manual_seed(0)                                         # what training seeded the weights with
    initial = PositionLanguageModel(PositionConfig(tokenizer.vocab_size, "learned", max_length))
    before, after = initial.position_embedding.weight.detach(), model.position_embedding.weight.detach()
    # AdamW's decoupled weight decay multiplies every parameter by 1 - lr_t · 0.01 at each step,
    # lr_t cosine-decayed; rows without gradient move by nothing else.
    shrink = math.prod(1 - lr * 0.5 * (1 + math.cos(math.pi * t / steps)) * 0.01 for t in range(steps))
    torch.testing.assert_close(after[L:].double(), before[L:].double() * shrink, rtol=1e-6, atol=0)
    assert (after[:L] - before[:L] * shrink).abs().min() > 0                # the trained rows moved more
    model.train()
    windows = tokenizer.encode(load_rhymes()[: 4 * L]).view(4, L)
    model(windows).sum().backward()
    assert model.position_embedding.weight.grad[L:].abs().max() == 0
    assert model.position_embedding.weight.grad[:L].abs().max() > 0


def _inputs_seen_in_training(**kwargs):
    """Train a model and return the ids every forward of a PositionLanguageModel received meanwhile."""
    seen = []

    def hook(module, args):
        if isinstance(module, PositionLanguageModel):
            seen.append(args[0].clone())

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        model, tokenizer = train_position_model("rope", steps=3, batch_size=4, **kwargs)
    finally:
        handle.remove()
    return model, tokenizer, seen


def test_every_training_window_starts_with_the_fixed_token_and_keeps_its_length():
    model, tokenizer, seen = _inputs_seen_in_training(train_length=12, first_token=True)
    first = tokenizer.vocab_size                                        # one past the characters
    assert model.config.first_token_id == first and model.config.vocab_size == first + 1
    assert len(seen) == 3
    for ids in seen:
        assert ids.shape == (4, 12)                                     # the fixed token + 11 characters
        assert (ids[:, 0] == first).all() and (ids[:, 1:] < first).all()


def test_without_a_first_token_the_windows_are_plain_crops():
    model, tokenizer, seen = _inputs_seen_in_training(train_length=12)
    assert model.config.first_token_id is None and model.config.vocab_size == tokenizer.vocab_size
    assert all(ids.shape == (4, 12) and (ids < tokenizer.vocab_size).all() for ids in seen)


def test_first_token_training_is_deterministic_and_differs_from_plain_crops():
    first, _ = train_position_model("rope", train_length=8, steps=3, first_token=True)
    second, _ = train_position_model("rope", train_length=8, steps=3, first_token=True)
    plain, _ = train_position_model("rope", train_length=8, steps=3)
    for name, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[name]), name
    assert first.head.weight.shape[0] == plain.head.weight.shape[0] + 1


@pytest.mark.parametrize("call, error, message", [
    (lambda: train_position_model("rope", first_token=1), TypeError, "first_token must be a bool"),
    (lambda: train_position_model("rope", train_length=1, first_token=True), ValueError, "train_length must be >= 2"),
    (lambda: PositionConfig(1, "rope", first_token=True), ValueError, "vocab_size must be >= 2"),
    (lambda: PositionConfig(5, "rope", first_token="yes"), TypeError, "first_token must be a bool"),
    (lambda: PositionConfig(5, "sinusoidal"), ValueError, "position must be one of"),
    (lambda: PositionConfig(5, 3), TypeError, "position must be a str"),
    (lambda: PositionConfig(5, "rope", embed_dim=12, num_heads=4), ValueError, "even head size"),
    (lambda: train_position_model("alibi", train_length=0), ValueError, "train_length must be >= 1"),
    (lambda: train_position_model("learned", train_length=64, max_length=32), ValueError, "train_length=64"),
    (lambda: train_position_model("bogus", steps=1), ValueError, "position must be one of"),
    (lambda: _model("learned", max_length=4)(torch.zeros(1, 5, dtype=torch.long)), ValueError, "max_length=4"),
])
def test_bad_input_raises_naming_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_rope_model_streams_through_a_sink_cache_as_chapter_09_does():
    model = _model("rope")
    ids = torch.randint(0, 11, (1, 20), generator=torch.Generator().manual_seed(6))
    caches = [SinkKVCache(window=8, sinks=2) for _ in model.blocks]
    with torch.no_grad():
        streamed = torch.cat([model(ids[:, t:t + 1], kv_caches=caches) for t in range(20)], dim=1)
        whole = model(ids)
    # Nothing is evicted before sinks + window - 1 = 9 tokens: until then the stream is full attention.
    torch.testing.assert_close(streamed[:, :9], whole[:, :9], rtol=0, atol=1e-5)
    assert (streamed[:, 9:] - whole[:, 9:]).abs().max() > 1e-4                  # afterwards it forgets
    alibi = _model("alibi")
    with pytest.raises(ValueError, match="position='alibi' needs plain KVCache"):
        alibi(ids[:, :1], kv_caches=[SinkKVCache(window=8, sinks=2) for _ in alibi.blocks])
