"""What a small pre-trained BERT learned: blanks filled in, against always guessing the commonest words.

- :func:`masked_word_accuracy`: every known word of held-out rhymes hidden once, top-1 and top-5 hits;
- :func:`top_predictions`: the likeliest words for one blank, with their probabilities;
- :func:`score_blanks`: every word of texts hidden once, the model against the unigram and bigram
  guesses of :class:`~attn_course.models.bert.baselines.NgramGuesses`: first guesses and losses, blank by blank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from attn_course import _validate
from attn_course.data.tokenizers import SPECIAL_TOKENS, WordVocabulary
from attn_course.models.bert.baselines import NgramGuesses
from attn_course.models.bert.masked_lm import MaskedLanguageModel

__all__ = ["MaskedWordAccuracy", "masked_word_accuracy", "top_predictions", "BlankScores", "score_blanks"]


class MaskedWordAccuracy(NamedTuple):
    """What :func:`masked_word_accuracy` measured; every share is over the same blanks.

    Attributes:
        model: the share of blanks where the model's top word is the hidden word.
        model_top5: the share where the hidden word is among the model's 5 likeliest.
        unigram: the share for always guessing the most frequent training word.
        unigram_top5: the share where the hidden word is one of the 5 most frequent training words.
        unigram_word: the most frequent training word.
        blanks: how many blanks were scored (every known word of the rhymes, once).
    """

    model: float
    model_top5: float
    unigram: float
    unigram_top5: float
    unigram_word: str
    blanks: int


def _check_model_and_vocab(where: str, model: object, vocab: object) -> None:
    if not isinstance(model, MaskedLanguageModel):
        raise TypeError(f"{where}: model must be a MaskedLanguageModel, got {type(model).__name__}")
    if not isinstance(vocab, WordVocabulary):
        raise TypeError(f"{where}: vocab must be a WordVocabulary, got {type(vocab).__name__}")
    if len(vocab) != model.config.vocab_size:
        raise ValueError(f"{where}: vocab has {len(vocab)} tokens but the model {model.config.vocab_size}")


def masked_word_accuracy(model: MaskedLanguageModel, vocab: WordVocabulary, rhymes: list[str]) -> MaskedWordAccuracy:
    """How often the model fills a blank with the right word, against always guessing the commonest words.

    Every known word of every rhyme is hidden once, alone, by ``[MASK]`` (the rest of the rhyme
    intact), and the model's likeliest ordinary words are compared with it. ``[UNK]`` words are
    not asked for. Needs a vocabulary of at least 5 words.

    Args:
        model: a :class:`MaskedLanguageModel`.
        vocab: its :class:`WordVocabulary`.
        rhymes: the texts (held-out rhymes, to measure what was learned rather than remembered).

    Returns:
        :class:`MaskedWordAccuracy` ``(model, model_top5, unigram, unigram_top5, unigram_word, blanks)``.

    Raises:
        TypeError: arguments of the wrong kind. ValueError: a vocabulary that does not fit the model
            or has fewer than 5 words, or rhymes without a known word.

    Example:
        >>> from attn_course.models.bert.pretraining import PretrainingConfig, pretrain_mlm
        >>> rhymes = ["the cat sat on the mat in the hat"] * 8
        >>> config = PretrainingConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32,
        ...                            steps=5, batch_size=4, eval_every=5)
        >>> model, vocab, _ = pretrain_mlm(rhymes, rhymes[:2], config)
        >>> masked_word_accuracy(model, vocab, rhymes[:1]).blanks
        9
    """
    where = "masked_word_accuracy"
    _check_model_and_vocab(where, model, vocab)
    if not isinstance(rhymes, list) or not all(isinstance(r, str) for r in rhymes):
        raise TypeError(f"{where}: rhymes must be a list of str, got {type(rhymes).__name__}")
    if len(vocab.words) < 5:
        raise ValueError(f"{where}: the vocabulary has {len(vocab.words)} words; at least 5 are needed")
    first = len(SPECIAL_TOKENS)                                   # id of the most frequent training word
    right = right5 = blanks = unigram_right = unigram_right5 = 0
    with torch.no_grad():
        for piece in vocab.encode_pieces(rhymes, model.config.max_position_embeddings):
            known = (piece >= first).nonzero().flatten()                       # [K] positions asked about
            if not len(known):
                continue
            copies = piece.repeat(len(known), 1)                               # [K, N]: one blank per copy
            copies[torch.arange(len(known)), known] = vocab.mask_id
            logits = model(copies)[torch.arange(len(known)), known]            # [K, V]
            logits[:, :first] = -math.inf                                       # only ordinary words
            top5 = logits.topk(5, dim=-1).indices                               # [K, 5]
            hidden = piece[known]                                               # [K]
            right += int((top5[:, 0] == hidden).sum())
            right5 += int((top5 == hidden[:, None]).any(-1).sum())
            unigram_right += int((hidden == first).sum())
            unigram_right5 += int((hidden < first + 5).sum())
            blanks += len(known)
    if not blanks:
        raise ValueError(f"{where}: the rhymes hold no word of the vocabulary")
    return MaskedWordAccuracy(right / blanks, right5 / blanks, unigram_right / blanks, unigram_right5 / blanks,
                              vocab.tokens[first], blanks)


def top_predictions(model: MaskedLanguageModel, vocab: WordVocabulary, text: str, word_index: int,
                    k: int = 5) -> list[tuple[str, float]]:
    """The model's ``k`` likeliest words for the ``word_index``-th word of ``text``, hidden by ``[MASK]``.

    Args:
        model: a :class:`MaskedLanguageModel`.
        vocab: its :class:`WordVocabulary`.
        text: a sentence or rhyme (split into words as :meth:`WordVocabulary.split` does).
        word_index: which word to hide, counted from 0 among the words of ``text``.
        k: how many words to return.

    Returns:
        ``k`` pairs ``(word, probability)``, likeliest first (special tokens excluded).

    Raises:
        TypeError: arguments of the wrong kind. ValueError: ``word_index`` out of range, too long a
            text, or ``k`` larger than the vocabulary.

    Example:
        >>> from attn_course.models.bert.pretraining import PretrainingConfig, pretrain_mlm
        >>> rhymes = ["the cat sat on the mat"] * 8
        >>> config = PretrainingConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32,
        ...                            steps=5, batch_size=4, eval_every=5)
        >>> model, vocab, _ = pretrain_mlm(rhymes, rhymes[:2], config)
        >>> len(top_predictions(model, vocab, "the cat sat on the mat", 1, k=3))
        3
    """
    where = "top_predictions"
    _check_model_and_vocab(where, model, vocab)
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be a str, got {type(text).__name__}")
    ids = vocab.encode(text, add_special=True)                                # [N]
    word_index = _validate.integer(where, "word_index", word_index, minimum=0)
    if word_index >= len(ids) - 2:
        raise ValueError(f"{where}: word_index={word_index} but the text has {len(ids) - 2} words")
    if len(ids) > model.config.max_position_embeddings:
        raise ValueError(f"{where}: the text has {len(ids)} tokens, more than the model's "
                         f"{model.config.max_position_embeddings}")
    k = _validate.integer(where, "k", k, minimum=1)
    if k > len(vocab.words):
        raise ValueError(f"{where}: k={k} is more than the {len(vocab.words)} words of the vocabulary")
    ids[word_index + 1] = vocab.mask_id
    with torch.no_grad():
        logits = model(ids[None])[0, word_index + 1]                           # [V]
    logits[:len(SPECIAL_TOKENS)] = -math.inf
    probabilities, best = logits.softmax(-1).topk(k)
    return [(vocab.tokens[i], float(p)) for i, p in zip(best.tolist(), probabilities.tolist())]


@dataclass(frozen=True)
class BlankScores:
    """What :func:`score_blanks` measured, blank by blank; ``K`` blanks in all.

    Attributes:
        pieces: the ``[N]`` ids (``[CLS] words [SEP]``) of each text piece scored.
        piece: ``[K]`` the piece each blank is in; ``position``: ``[K]`` its position there (1 = first word).
        hidden: ``[K]`` the id of the hidden word.
        guesses: for ``"unigram"``, ``"bigram"`` and ``"model"``, the ``[K]`` ids of each one's likeliest word.
        log_probs: for the same three, the ``[K]`` log-probabilities they gave the hidden word (over the
            ordinary words: special tokens are never a guess).
    """

    pieces: list[torch.Tensor]
    piece: torch.Tensor
    position: torch.Tensor
    hidden: torch.Tensor
    guesses: dict[str, torch.Tensor]
    log_probs: dict[str, torch.Tensor]

    def accuracy(self, name: str) -> float:
        """The share of blanks where ``name``'s likeliest word is the hidden one (top-1 accuracy)."""
        return float((self.guesses[self._name(name)] == self.hidden).double().mean())

    def loss(self, name: str) -> float:
        """``name``'s mean cross-entropy over the blanks, ``-mean log p(hidden)``, in nats."""
        return float(-self.log_probs[self._name(name)].double().mean())

    def _name(self, name: str) -> str:
        if name not in self.guesses:
            raise ValueError(f"BlankScores: name must be one of {sorted(self.guesses)}, got {name!r}")
        return name


def score_blanks(model: MaskedLanguageModel, vocab: WordVocabulary, texts: list[str],
                 guesses: NgramGuesses) -> BlankScores:
    """Hide every known word of every text once, alone, and score the model and the two count guesses on it.

    Each blank is one copy of its text with that word replaced by ``[MASK]`` (the rest intact). The
    model, the unigram guess and the bigram guess (which sees the two neighbours of the blank) each
    give a distribution over the ordinary words; ``[UNK]`` words are never asked for.

    Args:
        model: a :class:`MaskedLanguageModel` (put in eval mode by the caller).
        vocab: its :class:`WordVocabulary`.
        texts: the texts to score (a test split the model was neither trained nor selected on).
        guesses: :class:`~attn_course.models.bert.baselines.NgramGuesses` counted on the training texts.

    Returns:
        :class:`BlankScores`; ``.accuracy(name)`` and ``.loss(name)`` for ``"unigram"``, ``"bigram"``, ``"model"``.

    Raises:
        TypeError: arguments of the wrong kind. ValueError: a vocabulary that does not fit the model or
            the guesses, or texts without a known word.

    Example:
        >>> from attn_course.models.bert.pretraining import PretrainingConfig, pretrain_mlm
        >>> texts = ["the cat sat on the mat"] * 8
        >>> config = PretrainingConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32,
        ...                            steps=5, batch_size=4, eval_every=5, min_count=1)
        >>> model, vocab, _ = pretrain_mlm(texts, texts[:2], config)
        >>> scores = score_blanks(model, vocab, texts[:1], NgramGuesses(vocab, texts))
        >>> len(scores.hidden), scores.accuracy("unigram")                       # "the" is 2 of 6 words
        (6, 0.3333333333333333)
    """
    where = "score_blanks"
    _check_model_and_vocab(where, model, vocab)
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise TypeError(f"{where}: texts must be a list of str, got {type(texts).__name__}")
    if not isinstance(guesses, NgramGuesses):
        raise TypeError(f"{where}: guesses must be NgramGuesses, got {type(guesses).__name__}")
    if guesses.vocab.tokens != vocab.tokens:
        raise ValueError(f"{where}: guesses were counted with another vocabulary")
    first = len(SPECIAL_TOKENS)
    pieces = vocab.encode_pieces(texts, model.config.max_position_embeddings)
    found = {"piece": [], "position": [], "hidden": []}
    found_guesses = {"unigram": [], "bigram": [], "model": []}
    found_log_probs = {"unigram": [], "bigram": [], "model": []}
    with torch.no_grad():
        for number, piece in enumerate(pieces):
            known = (piece >= first).nonzero().flatten()                       # [K] positions asked about
            if not len(known):
                continue
            copies = piece.repeat(len(known), 1)                               # [K, N]: one blank per copy
            copies[torch.arange(len(known)), known] = vocab.mask_id
            logits = model(copies)[torch.arange(len(known)), known].double()   # [K, V]
            logits[:, :first] = -math.inf                                       # only ordinary words
            hidden = piece[known]                                               # [K]
            by_name = {"unigram": guesses.unigram(len(known)),
                       "bigram": guesses.bigram(piece[known - 1], piece[known + 1]),
                       "model": logits.log_softmax(-1)}                         # each [K, V]
            for name, log_p in by_name.items():
                found_guesses[name].append(log_p.argmax(-1))
                found_log_probs[name].append(log_p.gather(-1, hidden[:, None])[:, 0])
            found["piece"].append(torch.full_like(known, number))
            found["position"].append(known)
            found["hidden"].append(hidden)
    if not found["hidden"]:
        raise ValueError(f"{where}: the texts hold no word of the vocabulary")
    return BlankScores(pieces, *(torch.cat(found[k]) for k in ("piece", "position", "hidden")),
                       {k: torch.cat(v) for k, v in found_guesses.items()},
                       {k: torch.cat(v) for k, v in found_log_probs.items()})
