"""The tiny character-level language model of chapter 04."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.kv_cache import KVCache
from attn_course.language_model import (
    CharTokenizer,
    LanguageModelConfig,
    TinyLanguageModel,
    load_rhymes,
    train_language_model,
)


def test_shipped_text_is_there_and_plain():
    text = load_rhymes()
    assert len(text) > 4000 and "Twinkle, twinkle, little star" in text
    assert all(ord(character) < 128 for character in text)


def test_tokenizer_round_trips_and_rejects_unknown_characters():
    tokenizer = CharTokenizer("hello world")
    assert tokenizer.decode(tokenizer.encode("low red")) == "low red"
    assert tokenizer.vocab_size == len(set("hello world"))
    with pytest.raises(ValueError, match=r"\['z'\]"):
        tokenizer.encode("zed")
    with pytest.raises(ValueError, match="must not be empty"):
        CharTokenizer("")


def test_model_is_causal():
    torch.manual_seed(0)
    model = TinyLanguageModel(LanguageModelConfig(vocab_size=11, max_length=16)).eval()
    ids = torch.randint(0, 11, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 11
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, :6], model(changed)[:, :6])


def test_generation_with_and_without_cache_is_identical():
    torch.manual_seed(0)
    model = TinyLanguageModel(LanguageModelConfig(vocab_size=13, max_length=40)).eval()
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    cached = model.generate(prompt, 20, use_cache=True, generator=torch.Generator().manual_seed(3))
    uncached = model.generate(prompt, 20, use_cache=False, generator=torch.Generator().manual_seed(3))
    assert cached.shape == (2, 23) and torch.equal(cached, uncached)
    assert torch.equal(cached[:, :3], prompt)


def test_cached_logits_equal_full_pass_logits():
    torch.manual_seed(0)
    model = TinyLanguageModel(LanguageModelConfig(vocab_size=9, max_length=12, num_layers=3)).eval()
    ids = torch.randint(0, 9, (1, 8))
    from attn_course.kv_cache import KVCache

    caches = [KVCache() for _ in model.blocks]
    with torch.no_grad():
        full = model(ids)
        steps = [model(ids[:, i : i + 1], kv_caches=caches) for i in range(8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_short_training_beats_chance_and_is_deterministic():
    text = load_rhymes()
    model, tokenizer, losses = train_language_model(text, steps=60, batch_size=16, sequence_length=32, progress=False)
    _, _, again = train_language_model(text, steps=60, batch_size=16, sequence_length=32, progress=False)
    assert losses == again
    assert losses[0] > math.log(tokenizer.vocab_size) - 0.5
    assert sum(losses[-10:]) / 10 < math.log(tokenizer.vocab_size) - 1.0
    assert not model.training


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda m: m(torch.zeros(2, 3)), TypeError, "TinyLanguageModel.forward: ids must be an integer tensor"),
        (lambda m: m(torch.zeros(2, 3, 1, dtype=torch.long)), ValueError, r"ids must be \[B, N\]"),
        (lambda m: m(torch.full((1, 3), 5)), ValueError, r"ids must lie in 0..4"),
        (lambda m: m(torch.zeros(1, 2, dtype=torch.long), kv_caches=KVCache()), TypeError, "list of KVCache"),
        (lambda m: m.generate([1, 2], 2), TypeError, "TinyLanguageModel.generate: prompt must be a torch.Tensor"),
        (lambda m: m.generate(torch.zeros(3, dtype=torch.long), 2, use_cache=1), TypeError, "use_cache must be a bool"),
        (lambda m: m(torch.zeros(2, 20, dtype=torch.long)), ValueError, "max_length"),
        (lambda m: m.generate(torch.zeros(3, dtype=torch.long), 20), ValueError, "max_length"),
        (lambda m: m.generate(torch.zeros(3, dtype=torch.long), 2, temperature=0), ValueError, "temperature"),
        (lambda m: m(torch.zeros(1, 2, dtype=torch.long), kv_caches=[]), ValueError, "one KVCache per block"),
    ],
)
def test_bad_inputs_raise_with_the_argument_named(call, error, fragment):
    model = TinyLanguageModel(LanguageModelConfig(vocab_size=5, max_length=16))
    with pytest.raises(error, match=fragment):
        call(model)


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"vocab_size": 0}, ValueError, "LanguageModelConfig: vocab_size must be >= 1"),
        ({"vocab_size": 5, "embed_dim": 10, "num_heads": 4}, ValueError, "divisible by num_heads"),
        ({"vocab_size": 5, "num_layers": 1.5}, TypeError, "num_layers must be an int"),
        ({"vocab_size": 5, "dropout": 1.0}, ValueError, "dropout must lie in"),
        ({"vocab_size": 5, "dropout": "0.1"}, TypeError, "dropout must be a number"),
    ],
)
def test_config_rejects_bad_fields_by_name(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        LanguageModelConfig(**kwargs)


def test_tokenizer_and_training_reject_non_strings_with_type_errors():
    with pytest.raises(TypeError, match="CharTokenizer: text must be a str, got list"):
        CharTokenizer(["a"])
    with pytest.raises(TypeError, match="train_language_model: text must be a str, got bytes"):
        train_language_model(b"abc" * 100, progress=False)


def test_training_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    train_language_model(load_rhymes(), steps=2, batch_size=2, sequence_length=8, progress=False)
    assert torch.equal(torch.rand(3), expected)


def test_training_rejects_text_shorter_than_a_window():
    with pytest.raises(ValueError, match="longer than sequence_length"):
        train_language_model("abc", sequence_length=8, progress=False)
