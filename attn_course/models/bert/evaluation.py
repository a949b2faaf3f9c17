"""What a small pre-trained BERT learned: :func:`score_blanks` hides every word of texts once and sets the model
against the unigram and bigram guesses of :class:`~attn_course.models.bert.baselines.NgramGuesses`: first guesses
and losses, blank by blank."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attn_course.data.tokenizers import SPECIAL_TOKENS, WordVocabulary
from attn_course.models.bert.baselines import NgramGuesses
from attn_course.models.bert.masked_lm import MaskedLanguageModel

__all__ = ["BlankScores", "score_blanks"]


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
        >>> from attn_course.models.bert import PretrainingConfig, pretrain_mlm
        >>> texts = ["the cat sat on the mat"] * 8
        >>> config = PretrainingConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32,
        ...                            steps=5, batch_size=4, eval_every=5, min_count=1)
        >>> model, vocab, _ = pretrain_mlm(texts, texts[:2], config)
        >>> scores = score_blanks(model, vocab, texts[:1], NgramGuesses(vocab, texts))
        >>> len(scores.hidden), scores.accuracy("unigram")                       # "the" is 2 of 6 words
        (6, 0.3333333333333333)
    """
    where = "score_blanks"
    if not isinstance(model, MaskedLanguageModel):
        raise TypeError(f"{where}: model must be a MaskedLanguageModel, got {type(model).__name__}")
    if not isinstance(vocab, WordVocabulary):
        raise TypeError(f"{where}: vocab must be a WordVocabulary, got {type(vocab).__name__}")
    if len(vocab) != model.config.vocab_size:
        raise ValueError(f"{where}: vocab has {len(vocab)} tokens but the model {model.config.vocab_size}")
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
