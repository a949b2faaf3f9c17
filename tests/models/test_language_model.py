"""The tiny character-level language model of chapter 04."""

from __future__ import annotations

import math

import pytest
import torch

from attn_course.core.kv_cache import KVCache
from attn_course.data.rhymes import held_out_split, load_rhymes
from attn_course.data.tokenizers import CharTokenizer
from attn_course.models.tiny_language_model import LanguageModelConfig, TinyLanguageModel
from attn_course.models.training import TrainingHistory, train_language_model

# Small enough to train in about a second: windows of 32, 16 per step.
SMALL = {"batch_size": 16, "sequence_length": 32, "progress": False}


def record_positions(model: TinyLanguageModel) -> list[list[int]]:
    """The positions each forward pass looks up, recorded by a hook on the position table."""
    seen = []
    model.position_embedding.register_forward_hook(lambda module, args, output: seen.append(args[0].tolist()))
    return seen


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


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("prompt_length", [3, 8, 11])
def test_generation_never_uses_a_position_beyond_the_window(use_cache, prompt_length):
    """Three windows' worth of text from a model that knows 8 positions, from prompts shorter
    than, as long as, and longer than the window: every lookup stays within 0..7."""
    torch.manual_seed(0)
    model = TinyLanguageModel(LanguageModelConfig(vocab_size=7, max_length=8)).eval()
    seen = record_positions(model)
    prompt = torch.randint(0, 7, (prompt_length,))
    out = model.generate(prompt, 24, use_cache=use_cache, generator=torch.Generator().manual_seed(0))
    assert out.shape == (prompt_length + 24,) and torch.equal(out[:prompt_length], prompt)
    assert len(seen) == 24 and max(max(positions) for positions in seen) == 7
    assert all(positions == list(range(positions[0], positions[0] + len(positions))) for positions in seen)


def test_cached_and_uncached_generation_agree_as_the_window_slides():
    torch.manual_seed(0)
    model = TinyLanguageModel(LanguageModelConfig(vocab_size=11, max_length=10, num_layers=3)).eval()
    prompt = torch.randint(0, 11, (2, 4))
    for seed in range(3):
        cached = model.generate(prompt, 30, use_cache=True, generator=torch.Generator().manual_seed(seed))
        uncached = model.generate(prompt, 30, use_cache=False, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(cached, uncached)


def test_cache_feeds_one_token_per_step_until_the_window_slides_then_recomputes_it():
    """Prompt of 3, window of 6: the first step reads the prompt, the next three only the
    newest token (at positions 3, 4, 5); from then on the window has slid, so every step
    reads the whole cropped context again at positions 0..5."""
    torch.manual_seed(0)
    model = TinyLanguageModel(LanguageModelConfig(vocab_size=5, max_length=6)).eval()
    seen = record_positions(model)
    model.generate(torch.tensor([1, 2, 3]), 7, generator=torch.Generator().manual_seed(0))
    assert seen == [[0, 1, 2], [3], [4], [5], *[[0, 1, 2, 3, 4, 5]] * 3]
    seen.clear()
    model.generate(torch.tensor([1, 2, 3]), 7, use_cache=False, generator=torch.Generator().manual_seed(0))
    assert seen == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4], *[[0, 1, 2, 3, 4, 5]] * 4]


def test_generation_crops_the_context_to_the_last_window():
    """What the model sees is only the last max_length tokens: two texts that differ only
    before the window give the same next-token distribution, hence the same sample."""
    torch.manual_seed(0)
    model = TinyLanguageModel(LanguageModelConfig(vocab_size=9, max_length=5)).eval()
    tail = torch.tensor([1, 2, 3, 4, 5])
    first = model.generate(torch.cat([torch.tensor([0, 0, 0]), tail]), 1, generator=torch.Generator().manual_seed(1))
    second = model.generate(torch.cat([torch.tensor([8, 7]), tail]), 1, generator=torch.Generator().manual_seed(1))
    assert first[-1] == second[-1]
    with torch.no_grad():
        expected = torch.multinomial(torch.softmax(model(tail[None])[:, -1], dim=-1), 1,
                                     generator=torch.Generator().manual_seed(1))
    assert first[-1] == expected.item()


def test_cached_logits_equal_full_pass_logits():
    torch.manual_seed(0)
    model = TinyLanguageModel(LanguageModelConfig(vocab_size=9, max_length=12, num_layers=3)).eval()
    ids = torch.randint(0, 9, (1, 8))
    from attn_course.core.kv_cache import KVCache

    caches = [KVCache() for _ in model.blocks]
    with torch.no_grad():
        full = model(ids)
        steps = [model(ids[:, i : i + 1], kv_caches=caches) for i in range(8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_short_training_beats_chance_and_is_deterministic():
    text = load_rhymes()
    model, tokenizer, history = train_language_model(text, steps=60, patience=None, **SMALL)
    _, _, again = train_language_model(text, steps=60, patience=None, **SMALL)
    assert history == again
    losses = history.train_losses
    assert len(losses) == 60
    assert losses[0] > math.log(tokenizer.vocab_size) - 0.5
    assert sum(losses[-10:]) / 10 < math.log(tokenizer.vocab_size) - 1.0
    assert history.validation_losses[-1] < history.validation_losses[0] - 1.0
    assert not model.training


def test_held_out_split_cuts_at_a_blank_line_and_loses_nothing():
    text = load_rhymes()
    train, held_out = held_out_split(text, 0.1)
    assert train + held_out == text
    assert train.endswith("\n\n") and not held_out.startswith("\n")
    assert 0.08 < len(held_out) / len(text) < 0.12
    assert held_out_split("no blank line here", 0.25) == ("no blank line ", "here")
    assert held_out_split(text, 0) == (text, "")


def held_out_loss(model: TinyLanguageModel, tokenizer: CharTokenizer, text: str, length: int) -> float:
    """Mean next-character loss over the held-out part, each character a target once: an
    independent recomputation (per window, summed in float64)."""
    _, held_out = held_out_split(text, 0.1)
    ids = tokenizer.encode(held_out)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - length, length):
            window = ids[start : start + length + 1]
            log_probs = torch.log_softmax(model(window[None, :-1])[0].double(), dim=-1)
            total -= log_probs[torch.arange(length), window[1:]].sum().item()
            count += length
    return total / count


def test_training_returns_the_weights_with_the_lowest_validation_loss():
    text = load_rhymes()
    model, tokenizer, history = train_language_model(text, steps=80, eval_every=10, patience=None, **SMALL)
    assert history.validation_steps == list(range(0, 81, 10))
    best = history.validation_losses.index(min(history.validation_losses))
    assert history.best_step == history.validation_steps[best]
    assert history.best_validation_loss == min(history.validation_losses)
    assert held_out_loss(model, tokenizer, text, 32) == pytest.approx(history.best_validation_loss, abs=1e-5)


def test_training_stops_once_validation_stops_improving():
    """A learning rate far too high for this model: validation stops improving quickly, and
    training ends `patience` scorings after the best one instead of running all 400 steps."""
    text = load_rhymes()
    _, _, history = train_language_model(text, steps=400, learning_rate=0.3, eval_every=5, patience=2, **SMALL)
    assert len(history.train_losses) < 400
    assert history.validation_steps[-1] == len(history.train_losses)
    after_best = history.validation_losses[history.validation_steps.index(history.best_step) + 1 :]
    assert len(after_best) == 2 and min(after_best) >= history.best_validation_loss


def test_training_without_a_held_out_part_keeps_the_last_weights():
    _, _, history = train_language_model(load_rhymes(), steps=5, validation_fraction=0, **SMALL)
    assert history == TrainingHistory(history.train_losses, [], [], None) and len(history.train_losses) == 5
    assert history.best_validation_loss is None


def test_training_trains_every_position_of_the_model():
    text = load_rhymes()
    model, _, _ = train_language_model(text, steps=1, **SMALL)
    assert model.config.max_length == 32 == model.position_embedding.num_embeddings
    longer = LanguageModelConfig(vocab_size=CharTokenizer(text).vocab_size, max_length=64)
    with pytest.raises(ValueError, match=r"config.max_length must equal sequence_length=32"):
        train_language_model(text, longer, **SMALL)


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
        (lambda m: m.generate(torch.zeros(1, 0, dtype=torch.long), 2), ValueError, r"prompt must be \[N\] or \[B, N\]"),
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


@pytest.mark.parametrize(
    "text, changes, error, fragment",
    [
        ("abc", {"sequence_length": 8}, ValueError, r"the training part of the text \(3 characters\) must be longer"),
        ("abcdefgh" * 20, {"sequence_length": 20}, ValueError, r"the held-out part \(16 characters\) must be longer"),
        ("abcd" * 50, {"validation_fraction": 1.0}, ValueError, r"validation_fraction must lie in \[0, 1\)"),
        ("abcd" * 50, {"eval_every": 0}, ValueError, "eval_every must be >= 1"),
        ("abcd" * 50, {"patience": 0}, ValueError, "patience must be >= 1"),
        ("abcd" * 50, {"patience": 1.5}, TypeError, "patience must be an int"),
    ],
)
def test_training_rejects_bad_sizes_by_name(text, changes, error, fragment):
    with pytest.raises(error, match=r"^train_language_model: " + fragment):
        train_language_model(text, **{"sequence_length": 8, "progress": False, **changes})


def test_held_out_split_rejects_bad_input():
    with pytest.raises(TypeError, match="^held_out_split: text must be a str, got bytes"):
        held_out_split(b"abc")
    with pytest.raises(ValueError, match=r"^held_out_split: fraction must lie in \[0, 1\)"):
        held_out_split("abc", 1.5)


def test_a_model_that_returns_an_output_with_logits_trains_too():
    """Chapter 14 trains the course's Llama, whose forward returns an output with ``.logits``: its losses must be
    the cross-entropy of those logits, as for a model that returns the tensor itself."""
    from attn_course.models.llama import LlamaConfig, LlamaForCausalLM

    def llama(vocab):
        return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                                            num_hidden_layers=1, num_attention_heads=2))

    class LogitsOnly(torch.nn.Module):                   # the same model, returning the bare tensor
        def __init__(self, vocab):
            super().__init__()
            self.inner = llama(vocab)

        def forward(self, ids):
            return self.inner(ids).logits

    text = load_rhymes()
    model, tokenizer, history = train_language_model(text, steps=20, patience=None, make_model=llama, **SMALL)
    _, _, bare = train_language_model(text, steps=20, patience=None, make_model=LogitsOnly, **SMALL)
    assert history.train_losses == bare.train_losses and history.validation_losses == bare.validation_losses
    assert history.validation_losses[-1] < history.validation_losses[0] < math.log(tokenizer.vocab_size) + 1
    assert isinstance(model, LlamaForCausalLM) and not model.training
