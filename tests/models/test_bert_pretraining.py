"""MLM pre-training of a small BERT: the loss on chosen positions only, the 80/10/10 rule on the
course's rhymes, a run that beats the unigram guess, determinism, and the errors."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from attn_course.data.rhymes import load_pretraining_text, split_rhymes
from attn_course.data.tokenizers import SPECIAL_TOKENS, WordVocabulary, pad_batch
from attn_course.models.bert import (
    IGNORE_INDEX,
    MaskedLanguageModel,
    NgramGuesses,
    PretrainingConfig,
    mask_tokens,
    masked_lm_loss,
    pretrain_mlm,
    score_blanks,
)

NUMBERS = "one two three four five six seven eight nine ten eleven twelve".split()


def counting_rhymes(count: int, seed: int) -> list[str]:
    """Runs of the counting words from a random start: every word follows from its neighbours."""
    rng = random.Random(seed)
    rhymes = []
    for _ in range(count):
        start, length = rng.randrange(len(NUMBERS) - 4), rng.randrange(4, 9)
        rhymes.append(" ".join(NUMBERS[start:start + length]))
    return rhymes


SMALL = PretrainingConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                          dropout=0.0, max_length=16, min_count=1, steps=200, batch_size=16, eval_every=50,
                          learning_rate=1e-2, seed=0)


@pytest.fixture(scope="module")
def small_run():
    train, held_out = counting_rhymes(200, seed=1), counting_rhymes(30, seed=2)
    model, vocab, history = pretrain_mlm(train, held_out, SMALL)
    return model, vocab, history, held_out, train


def test_loss_is_the_mean_cross_entropy_over_chosen_positions_only():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=generator, dtype=torch.float64)
    labels = torch.full((3, 5), IGNORE_INDEX)
    labels[0, 1], labels[1, 4], labels[2, 0], labels[2, 2] = 3, 6, 0, 2
    log_p = logits.log_softmax(-1)                                                  # independent reference
    chosen = [(0, 1), (1, 4), (2, 0), (2, 2)]
    expected = -sum(log_p[b, i, labels[b, i]] for b, i in chosen) / len(chosen)
    assert masked_lm_loss(logits, labels).item() == pytest.approx(expected.item(), rel=1e-12)
    changed = logits.clone()
    changed[labels == IGNORE_INDEX] = 100 * torch.randn_like(changed[labels == IGNORE_INDEX])
    assert masked_lm_loss(changed, labels).item() == pytest.approx(expected.item(), rel=1e-12)


def test_loss_refuses_what_it_cannot_average():
    logits = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="no position is chosen"):
        masked_lm_loss(logits, torch.full((2, 3), IGNORE_INDEX))
    with pytest.raises(ValueError, match="labels"):
        masked_lm_loss(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="0..3"):
        masked_lm_loss(logits, torch.full((2, 3), 4))
    with pytest.raises(TypeError, match="labels"):
        masked_lm_loss(logits, torch.zeros(2, 3))
    with pytest.raises(TypeError, match="logits"):
        masked_lm_loss(torch.zeros(2, 3, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))


def test_80_10_10_rule_measured_on_the_course_rhymes():
    train, _ = split_rhymes(load_pretraining_text())
    vocab = WordVocabulary.from_text(train)
    ids, _ = pad_batch([vocab.encode(r, add_special=True) for r in train])           # [R, N]
    ids = ids.repeat(60, 1)                                                           # enough draws to measure
    out = mask_tokens(ids, mask_id=vocab.mask_id, vocab_size=len(vocab), special_ids=vocab.special_ids,
                      generator=torch.Generator().manual_seed(0))
    ordinary = ids >= len(SPECIAL_TOKENS)
    assert not out.chosen[~ordinary].any()                                           # never [PAD] [UNK] [CLS] [SEP]
    chosen = out.chosen.sum().item()
    assert chosen / ordinary.sum().item() == pytest.approx(0.15, abs=0.01)
    assert out.to_mask.sum().item() / chosen == pytest.approx(0.8, abs=0.02)
    assert out.to_random.sum().item() / chosen == pytest.approx(0.1, abs=0.02)
    assert out.kept.sum().item() / chosen == pytest.approx(0.1, abs=0.02)


def test_held_out_rhymes_are_not_trained_on_and_the_text_is_shipped():
    text = load_pretraining_text()
    train, held_out = split_rhymes(text)
    assert len(text) > 12_000 and len(held_out) >= 5
    assert not set(train) & set(held_out)
    assert sum(len(r) for r in held_out) / len(text) == pytest.approx(0.1, abs=0.03)


def test_vocabulary_keeps_words_seen_twice_and_maps_the_rest_to_unk():
    vocab = WordVocabulary.from_text("The king's cat; the king's hat. A cat!", min_count=2)
    assert vocab.words == ["cat", "king's", "the"]
    assert vocab.tokens[:5] == list(SPECIAL_TOKENS)
    ids = vocab.encode("the dog's cat", add_special=True)
    assert vocab.decode(ids) == ["[CLS]", "the", "[UNK]", "cat", "[SEP]"]
    with pytest.raises(TypeError, match="text"):
        WordVocabulary.from_text(3)
    with pytest.raises(ValueError, match="min_count"):
        WordVocabulary.from_text("a b", min_count=0)


def test_pad_batch_pads_at_the_end_and_marks_real_tokens():
    ids, mask = pad_batch([torch.tensor([2, 9, 3]), torch.tensor([2, 3])], pad_id=0)
    assert ids.tolist() == [[2, 9, 3], [2, 3, 0]] and mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    with pytest.raises(ValueError, match="at least one"):
        pad_batch([])
    with pytest.raises(ValueError, match="1-D"):
        pad_batch([torch.zeros(2, 2, dtype=torch.long)])


def test_a_small_run_beats_the_unigram_guess_on_held_out_text(small_run):
    model, vocab, history, held_out, train = small_run
    assert min(history.validation_losses) < history.unigram_loss - 1.0
    scores = score_blanks(model, vocab, held_out, NgramGuesses(vocab, train))
    assert scores.accuracy("model") > scores.accuracy("unigram") + 0.3
    ids = vocab.encode("three four five six", add_special=True)                   # [CLS] three four five six [SEP]
    ids[3] = vocab.mask_id
    with torch.no_grad():
        logits = model(ids[None])[0, 3]                                               # [V]
    assert vocab.tokens[int(logits.argmax())] == "five"


def test_history_keeps_the_best_held_out_weights(small_run):
    _, _, history, _, _ = small_run
    assert len(history.train_losses) == SMALL.steps
    assert history.eval_steps == [0, 50, 100, 150, 200]
    assert history.best_step == history.eval_steps[history.validation_losses.index(min(history.validation_losses))]


def test_training_is_deterministic_and_leaves_the_callers_random_state_and_grad_mode():
    train, held_out = counting_rhymes(40, seed=3), counting_rhymes(5, seed=4)
    config = PretrainingConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                               max_length=16, min_count=1, steps=10, batch_size=4, eval_every=5)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    with torch.no_grad():                                    # as in chapter 08, where gradients are off
        _, _, first = pretrain_mlm(train, held_out, config)
        assert not torch.is_grad_enabled()
    assert torch.equal(torch.get_rng_state(), before)
    _, _, again = pretrain_mlm(train, held_out, config)
    assert first.train_losses == again.train_losses and first.validation_losses == again.validation_losses
    assert first.train_losses[0] != first.train_losses[-1]


def test_mlm_head_shares_the_input_embeddings_and_scores_every_token(small_run):
    model, vocab, _, _, _ = small_run
    logits = model(torch.tensor([[vocab.cls_id, vocab.mask_id, vocab.sep_id]]))
    assert logits.shape == (1, 3, len(vocab))
    vocab_by_width = [n for n, p in model.named_parameters() if p.shape == (len(vocab), model.config.hidden_size)]
    assert vocab_by_width == ["encoder.embeddings.word.weight"]                   # no separate output matrix
    manual = F.layer_norm(F.gelu(model.transform(model.encoder(torch.tensor([[2, 4, 3]])).last_hidden_state)),
                          (model.config.hidden_size,), model.norm.weight, model.norm.bias, model.norm.eps)
    assert torch.allclose(logits, manual @ model.encoder.embeddings.word.weight.T + model.bias, atol=1e-5)


def test_errors_name_the_argument(small_run):
    model, vocab, _, held_out, _ = small_run
    with pytest.raises(TypeError, match="train_texts"):
        pretrain_mlm("one two", held_out, SMALL)
    with pytest.raises(ValueError, match="validation_texts is empty"):
        pretrain_mlm(held_out, [], SMALL)
    with pytest.raises(TypeError, match="config"):
        pretrain_mlm(held_out, held_out, {"steps": 3})
    with pytest.raises(ValueError, match="probability"):
        PretrainingConfig(probability=1.5)
    with pytest.raises(ValueError, match="steps"):
        PretrainingConfig(steps=0)
    with pytest.raises(TypeError, match="model"):
        score_blanks("model", vocab, held_out, NgramGuesses(vocab, held_out))
    with pytest.raises(ValueError, match="no word"):
        score_blanks(model, vocab, ["zebra yak"], NgramGuesses(vocab, held_out))
    with pytest.raises(TypeError, match="MaskedLanguageModel|BertConfig"):
        MaskedLanguageModel({"vocab_size": 3})
