"""The guesses chapter 08's small BERT must beat, and the stories it is trained on.

The unigram and bigram guesses are recomputed here with Python counters and math.log (no tensor
code of the package), blank by blank; score_blanks is compared with a loop that hides each word
itself; the stories' grammar is checked word by word against what the chapter says of it."""

from __future__ import annotations

import collections
import math
import random

import pytest
import torch

from attn_course.data.stories import ANIMALS, NAMES, OBJECTS, make_story, story_splits
from attn_course.data.tokenizers import SPECIAL_TOKENS, WordVocabulary
from attn_course.models.bert import BertConfig, MaskedLanguageModel
from attn_course.models.bert.baselines import NgramGuesses
from attn_course.models.bert.evaluation import score_blanks


def reference_guesses(train, smoothing=0.1):
    """Counters over [CLS] words [SEP], and the two guesses as dicts word -> probability."""
    vocab = WordVocabulary.from_text(train, min_count=1)
    words = vocab.words
    tokens = list(SPECIAL_TOKENS) + words
    pairs, singles, follows = collections.Counter(), collections.Counter(), collections.Counter()
    for text in train:
        seq = ["[CLS]", *text.split(), "[SEP]"]
        for a, b in zip(seq, seq[1:]):
            pairs[a, b] += 1
            follows[a] += 1
        singles.update(text.split())
    total = sum(singles.values())
    unigram = {w: singles[w] / total for w in words}

    def bigram(left, right):
        score = {w: (pairs[left, w] + smoothing) / (follows[left] + smoothing * len(tokens))
                 * (pairs[w, right] + smoothing) / (follows[w] + smoothing * len(tokens)) for w in words}
        norm = sum(score.values())
        return {w: s / norm for w, s in score.items()}

    return vocab, unigram, bigram


def reference_scores(texts, unigram, bigram):
    """Top-1 accuracy and loss of both guesses, every word of every text hidden once."""
    hits, nats, blanks = collections.Counter(), collections.Counter(), 0
    for text in texts:
        seq = ["[CLS]", *text.split(), "[SEP]"]
        for i in range(1, len(seq) - 1):
            hidden = seq[i]
            for name, p in (("unigram", unigram), ("bigram", bigram(seq[i - 1], seq[i + 1]))):
                best = max(p.values())
                first_best = next(w for w in p if p[w] == best)       # ties: the commonest word, as argmax
                hits[name] += first_best == hidden
                nats[name] -= math.log(p[hidden])
            blanks += 1
    return {name: (hits[name] / blanks, nats[name] / blanks) for name in ("unigram", "bigram")}, blanks


def test_bigram_guess_is_the_posterior_of_a_bigram_model_given_both_neighbours():
    train = ["the cat sat on the mat", "the dog sat on the rug", "a cat ran to the mat"]
    vocab, unigram, bigram = reference_guesses(train, smoothing=0.5)
    guesses = NgramGuesses(vocab, train, smoothing=0.5)
    first = len(SPECIAL_TOKENS)
    for left, right in [("the", "sat"), ("[CLS]", "cat"), ("mat", "[SEP]"), ("on", "mat"), ("[UNK]", "the")]:
        got = guesses.bigram(torch.tensor([vocab.index[left]]), torch.tensor([vocab.index[right]]))[0]
        assert torch.isinf(got[:first]).all()
        expected = torch.tensor([math.log(bigram(left, right)[w]) for w in vocab.words], dtype=torch.float64)
        assert torch.allclose(got[first:], expected, rtol=1e-12), (left, right)
    got = guesses.unigram(2)
    expected = torch.tensor([math.log(unigram[w]) for w in vocab.words], dtype=torch.float64)
    assert got.shape == (2, len(vocab)) and torch.allclose(got[1, first:], expected, rtol=1e-12)


def test_chapter_07_baselines_on_the_test_stories():
    """What section 7 prints for the two guesses, recomputed with counters and math.log."""
    train, _, test = story_splits()
    vocab, unigram, bigram = reference_guesses(train)
    expected, blanks = reference_scores(test, unigram, bigram)
    model = MaskedLanguageModel(BertConfig(vocab_size=len(vocab), hidden_size=8, num_hidden_layers=1,
                                           num_attention_heads=2, intermediate_size=8, max_position_embeddings=24))
    scores = score_blanks(model.eval(), vocab, test, NgramGuesses(vocab, train))
    assert len(scores.hidden) == blanks == 2_967
    for name, (accuracy, loss) in expected.items():
        assert scores.accuracy(name) == pytest.approx(accuracy, abs=1e-12)
        assert scores.loss(name) == pytest.approx(loss, rel=1e-9)
    assert [f"{v:.1%}" for v in (*expected["unigram"][:1], *expected["bigram"][:1])] == ["13.5%", "47.5%"]
    assert [f"{v:.2f}" for v in (expected["unigram"][1], expected["bigram"][1])] == ["3.52", "1.06"]


def test_score_blanks_hides_one_word_at_a_time_and_scores_the_model_over_ordinary_words():
    texts = ["anna met ben", "ben met anna in the park"]
    vocab = WordVocabulary.from_text(texts, min_count=1)
    torch.manual_seed(0)
    model = MaskedLanguageModel(BertConfig(vocab_size=len(vocab), hidden_size=8, num_hidden_layers=1,
                                           num_attention_heads=2, intermediate_size=8)).eval()
    scores = score_blanks(model, vocab, texts + ["zebra yak anna"], NgramGuesses(vocab, texts))
    first, expected = len(SPECIAL_TOKENS), []
    for text in texts + ["zebra yak anna"]:
        ids = [vocab.cls_id] + [vocab.index.get(w, vocab.unk_id) for w in text.split()] + [vocab.sep_id]
        for i in range(1, len(ids) - 1):
            if ids[i] == vocab.unk_id:
                continue                                                      # [UNK] is never asked for
            blank = list(ids)
            blank[i] = vocab.mask_id
            with torch.no_grad():
                logits = model(torch.tensor([blank]))[0, i].double()
            log_p = logits[first:] - torch.logsumexp(logits[first:], 0)
            expected.append((ids[i], int(log_p.argmax()) + first, float(log_p[ids[i] - first])))
    assert scores.hidden.tolist() == [h for h, _, _ in expected]
    assert scores.guesses["model"].tolist() == [g for _, g, _ in expected]
    assert torch.allclose(scores.log_probs["model"], torch.tensor([lp for _, _, lp in expected], dtype=torch.float64),
                          atol=1e-5)
    assert scores.loss("model") == pytest.approx(-sum(lp for _, _, lp in expected) / len(expected), rel=1e-5)
    with pytest.raises(ValueError, match="name must be one of"):
        scores.accuracy("trigram")
    with pytest.raises(TypeError, match="guesses"):
        score_blanks(model, vocab, texts, {"unigram": None})
    with pytest.raises(ValueError, match="another vocabulary"):
        score_blanks(model, vocab, texts, NgramGuesses(WordVocabulary(["x", "y"], [1, 1]), ["x y"]))
    with pytest.raises(ValueError, match="no word"):
        score_blanks(model, vocab, ["zebra yak"], NgramGuesses(vocab, texts))


def test_ngram_guesses_refuse_wrong_arguments():
    vocab = WordVocabulary(["a", "b"], [2, 1])
    with pytest.raises(TypeError, match="vocab"):
        NgramGuesses({"a": 5}, ["a b"])
    with pytest.raises(TypeError, match="texts"):
        NgramGuesses(vocab, "a b")
    with pytest.raises(ValueError, match="texts is empty"):
        NgramGuesses(vocab, [])
    with pytest.raises(ValueError, match="smoothing"):
        NgramGuesses(vocab, ["a b"], smoothing=0)
    guesses = NgramGuesses(vocab, ["a b a"])
    with pytest.raises(ValueError, match="same length"):
        guesses.bigram(torch.tensor([5, 6]), torch.tensor([5]))
    with pytest.raises(ValueError, match="0..6"):
        guesses.bigram(torch.tensor([7]), torch.tensor([5]))
    with pytest.raises(TypeError, match="left"):
        guesses.bigram(torch.tensor([5.0]), torch.tensor([5]))


def test_stories_follow_the_grammar_the_chapter_describes():
    rng = random.Random(1)
    verbs = {verb: noun for noun, (plural, one, many) in ANIMALS.items() for verb in (one, many)}
    for _ in range(500):
        words = make_story(rng).split()
        if words[0] in NAMES:                 # a met b in the [adj] place and b gave a a x so a thanked b for the x
            a, b, thing = words[0], words[2], words[-1]
            assert a != b and thing in OBJECTS
            assert words[words.index("and") + 1] == b and words[words.index("gave") + 1] == a
            assert words[words.index("so") + 1] == a and words[words.index("thanked") + 1] == b
            assert words[words.index("gave") + 3] == thing
        else:                                           # the [adj] noun that name saw in the [adj] place verb
            noun = words[words.index("that") - 1]
            singular = noun if noun in ANIMALS else next(k for k, v in ANIMALS.items() if v[0] == noun)
            assert verbs[words[-1]] == singular                                   # each animal its own sound
            assert (noun == singular) == words[-1].endswith("s")                  # agreement in number
            assert words[words.index("that") + 1] in NAMES


def test_story_splits_are_distinct_reproducible_and_checked():
    train, validation, test = story_splits()
    assert (len(train), len(validation), len(test)) == (2000, 200, 200)
    assert len(set(train) | set(validation) | set(test)) == 2400                 # no story in two splits
    assert story_splits() == (train, validation, test)
    assert story_splits(seed=1)[2] != test
    with pytest.raises(ValueError, match="train"):
        story_splits(train=0)
    with pytest.raises(ValueError, match="4,000"):
        story_splits(train=4000)
    with pytest.raises(TypeError, match="seed"):
        story_splits(seed=1.5)
    with pytest.raises(TypeError, match="rng"):
        make_story(0)
