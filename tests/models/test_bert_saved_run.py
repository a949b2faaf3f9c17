"""Chapter 08's saved small BERT: save_run and load_saved_run give back the run (weights, vocabulary, history),
the shipped file is the run of the chapter's settings, and the errors name the argument."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import save_file

from attn_course.data.stories import story_splits
from attn_course.data.tokenizers import WordVocabulary
from attn_course.models.bert import (
    NgramGuesses,
    PretrainingConfig,
    load_saved_run,
    pretrain_mlm,
    save_run,
    score_blanks,
)

TINY = PretrainingConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                         max_length=16, min_count=1, steps=10, batch_size=4, eval_every=5)
TEXTS = ["one two three four", "two three four five", "three four five six", "four five six seven"] * 3


@pytest.fixture(scope="module")
def tiny_run():
    return pretrain_mlm(TEXTS, TEXTS[:2], TINY)


def test_a_saved_run_loads_back_as_it_was(tiny_run, tmp_path):
    model, vocab, history = tiny_run
    save_run(model, vocab, history, TINY, tmp_path / "run.safetensors", texts={"what": "counting"})
    loaded, loaded_vocab, loaded_history = load_saved_run(tmp_path / "run.safetensors")
    assert loaded_vocab.tokens == vocab.tokens and loaded_vocab.counts == vocab.counts
    assert dataclasses.astuple(loaded_history)[:-1] == dataclasses.astuple(history)[:-1]     # all but the seconds
    assert not loaded.training
    state = model.state_dict()
    assert all(torch.equal(tensor, state[name]) for name, tensor in loaded.state_dict().items())
    ids = vocab.encode("one two [MASK] four", add_special=True)[None]
    assert torch.equal(loaded(ids), model.eval()(ids))


def test_the_shipped_run_is_chapter_08s_and_fills_most_blanks_in_float64():
    model, vocab, history = load_saved_run()
    train, validation, test = story_splits(train=2000, validation=200, test=200, seed=0)
    assert vocab.tokens == WordVocabulary.from_text(train, min_count=PretrainingConfig().min_count).tokens
    assert history.eval_steps == list(range(0, 801, 100)) and len(history.train_losses) == 800
    assert history.best_step == history.eval_steps[history.validation_losses.index(min(history.validation_losses))]
    scores = score_blanks(model.double(), vocab, test, NgramGuesses(vocab, train))
    assert scores.accuracy("model") > scores.accuracy("bigram") + 0.3 > scores.accuracy("unigram") + 0.3
    assert scores.loss("model") < scores.loss("bigram") / 2


def test_saving_and_loading_refuse_what_is_not_a_run(tiny_run, tmp_path):
    model, vocab, history = tiny_run
    with pytest.raises(TypeError, match="model"):
        save_run("model", vocab, history, TINY, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="config"):
        save_run(model, vocab, history, {"steps": 3}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="vocab has"):
        save_run(model, WordVocabulary(["one"], [1]), history, TINY, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="path"):
        load_saved_run(3)
    with pytest.raises(FileNotFoundError):
        load_saved_run(tmp_path / "missing.safetensors")
    save_file({"bias": torch.zeros(3)}, str(tmp_path / "bare.safetensors"))
    with pytest.raises(ValueError, match="metadata"):
        load_saved_run(tmp_path / "bare.safetensors")
