"""The guesses a masked language model must beat: word counts, with and without the neighbouring words.

For a blank at position ``i`` of ``[CLS] w_1 ... w_n [SEP]``, both guesses are probabilities over the
ordinary words of a :class:`~attn_course.data.tokenizers.WordVocabulary`, counted on the training texts:

- **unigram**: ``p(w)``, each word's share of the training words; the context is ignored;
- **bigram**: a bigram (first-order Markov) model of the text, ``p(w_i | w_{i-1})``, conditioned
  on both neighbours of the blank, as a bidirectional model is:
  ``p(w | left, right) ∝ p(w | left) · p(right | w)``, with add-``smoothing`` counts
  ``p(b | a) = (count(a b) + smoothing) / (count(a ·) + smoothing · V)``.
  It sees the two words beside the blank, and nothing further away.

``[CLS]`` and ``[SEP]`` count as neighbours (the first and last words have one); ``[UNK]`` counts as a
word of its own.
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.data.tokenizers import SPECIAL_TOKENS, WordVocabulary

__all__ = ["NgramGuesses"]


class NgramGuesses:
    """Unigram and bigram guesses for a blank, counted on training texts.

    Args:
        vocab: the :class:`~attn_course.data.tokenizers.WordVocabulary` of the model.
        texts: the training texts, each read as ``[CLS] words [SEP]``.
        smoothing: the count added to every pair (add-k smoothing), a positive number.

    Raises:
        TypeError: ``vocab`` not a ``WordVocabulary`` or ``texts`` not a list of str.
        ValueError: ``smoothing`` not positive and finite, or no text.

    Example:
        >>> vocab = WordVocabulary.from_text("the cat sat the cat ran", min_count=1)
        >>> guesses = NgramGuesses(vocab, ["the cat sat", "the cat ran"])
        >>> left, right = torch.tensor([vocab.index["the"]]), torch.tensor([vocab.index["sat"]])
        >>> vocab.tokens[int(guesses.bigram(left, right).argmax())]        # the _ sat
        'cat'
    """

    def __init__(self, vocab: WordVocabulary, texts: list[str], smoothing: float = 0.1) -> None:
        where = "NgramGuesses"
        if not isinstance(vocab, WordVocabulary):
            raise TypeError(f"{where}: vocab must be a WordVocabulary, got {type(vocab).__name__}")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise TypeError(f"{where}: texts must be a list of str, got {type(texts).__name__}")
        if not texts:
            raise ValueError(f"{where}: texts is empty")
        self.smoothing = _validate.positive_finite(where, "smoothing", smoothing)
        self.vocab = vocab
        size = len(vocab)
        pairs = torch.zeros(size, size, dtype=torch.float64)                      # [V, V]: count(a b)
        words = torch.zeros(size, dtype=torch.float64)                            # [V]: count(w)
        for text in texts:
            ids = vocab.encode(text, add_special=True)                            # [N]
            pairs.index_put_((ids[:-1], ids[1:]), torch.ones(len(ids) - 1, dtype=torch.float64), accumulate=True)
            words.index_put_((ids[1:-1],), torch.ones(len(ids) - 2, dtype=torch.float64), accumulate=True)
        self.pair_counts, self.word_counts = pairs, words
        ordinary = torch.zeros(size, dtype=torch.bool)
        ordinary[len(SPECIAL_TOKENS):] = True
        self._ordinary = ordinary                                                 # [V]: the words a guess may name
        # log p(b | a), add-k smoothed over all V tokens that may follow a: [V, V]
        self.next_log_probs = ((pairs + self.smoothing) / (pairs.sum(-1, keepdim=True) + self.smoothing * size)).log()

    def _normalise(self, scores: torch.Tensor) -> torch.Tensor:
        """Log-probabilities over the ordinary words only; special tokens get -inf."""
        return scores.masked_fill(~self._ordinary, -torch.inf).log_softmax(-1)

    def unigram(self, count: int) -> torch.Tensor:
        """``[count, V]`` log-probabilities: every row is the training words' frequencies (specials: -inf)."""
        count = _validate.integer("NgramGuesses.unigram", "count", count, minimum=0)
        log_freq = self._normalise(self.word_counts.log())                        # [V]
        return log_freq.expand(count, -1)                                         # [count, V]

    def bigram(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        """``[K, V]`` log-probabilities ``log p(w | left_k, right_k)`` of a bigram model, over the ordinary words.

        Args:
            left, right: ``[K]`` ids of the token before and after each blank.
        """
        where = "NgramGuesses.bigram"
        left = _validate.integer_tensor(where, "left", left)
        right = _validate.integer_tensor(where, "right", right)
        if left.dim() != 1 or left.shape != right.shape:
            raise ValueError(f"{where}: left and right must be [K] of the same length, got "
                             f"{_validate.shape_str(left)} and {_validate.shape_str(right)}")
        if left.numel() and (min(left.min(), right.min()) < 0 or max(left.max(), right.max()) >= len(self.vocab)):
            raise ValueError(f"{where}: ids must lie in 0..{len(self.vocab) - 1}")
        scores = self.next_log_probs[left] + self.next_log_probs[:, right].T      # [K, V]: p(w|left) p(right|w)
        return self._normalise(scores)
