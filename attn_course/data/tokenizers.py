"""Tokenizers for the course's own small models (BERT's WordPiece tokenizer lives with BERT).

- :class:`CharTokenizer`: one id per distinct character of a text (chapters 04, 06, 09);
- :class:`WordVocabulary`: one id per word seen often enough, with BERT's special tokens
  (:data:`SPECIAL_TOKENS`), for chapter 08's small BERT;
- :func:`pad_batch`: id sequences of different lengths as one padded batch and its mask.
"""

from __future__ import annotations

import collections
import re

import torch

from attn_course import _validate

__all__ = ["CharTokenizer", "SPECIAL_TOKENS", "WordVocabulary", "pad_batch"]

#: The special tokens of :class:`WordVocabulary`, in the order of their ids 0..4.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


class CharTokenizer:
    """Maps each distinct character of a text to an integer id, and back.

    Example:
        >>> tokenizer = CharTokenizer("abca")
        >>> tokenizer.encode("cab").tolist(), tokenizer.decode(torch.tensor([2, 0]))
        ([2, 0, 1], 'ca')
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"CharTokenizer: text must be a str, got {type(text).__name__}")
        if not text:
            raise ValueError("CharTokenizer: text must not be empty")
        self.characters = sorted(set(text))
        self._ids = {character: index for index, character in enumerate(self.characters)}

    @property
    def vocab_size(self) -> int:
        return len(self.characters)

    def encode(self, text: str) -> torch.Tensor:
        """``str`` of length N to ``[N]`` int64 ids."""
        if not isinstance(text, str):
            raise TypeError(f"CharTokenizer.encode: text must be a str, got {type(text).__name__}")
        unknown = sorted(set(text) - set(self._ids))
        if unknown:
            raise ValueError(f"CharTokenizer.encode: characters not in the vocabulary: {unknown}")
        return torch.tensor([self._ids[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor) -> str:
        """``[N]`` ids to a ``str``."""
        ids = _validate.integer_tensor("CharTokenizer.decode", "ids", ids)
        if ids.dim() != 1:
            raise ValueError(f"CharTokenizer.decode: ids must be 1-D [N], got shape {_validate.shape_str(ids)}")
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"CharTokenizer.decode: ids must lie in 0..{self.vocab_size - 1}, "
                             f"got values from {int(ids.min())} to {int(ids.max())}")
        return "".join(self.characters[int(i)] for i in ids.tolist())


class WordVocabulary:
    """Lower-cased words to ids and back; the five :data:`SPECIAL_TOKENS` take ids 0..4.

    A word is a run of letters, with one apostrophe inside ("king's", "couldn't"); punctuation is
    dropped. Words seen fewer than ``min_count`` times when the vocabulary is built map to
    ``[UNK]``.

    Args:
        words: the ordinary words, most frequent first (ids 5, 6, ...).
        counts: how often each of ``words`` was seen (for the unigram baseline).

    Example:
        >>> vocab = WordVocabulary.from_text("the cat and the hat and the bat", min_count=2)
        >>> vocab.words, vocab.encode("The cat, the hat!").tolist()
        (['the', 'and'], [5, 1, 5, 1])
    """

    pad_id, unk_id, cls_id, sep_id, mask_id = range(5)

    def __init__(self, words: list[str], counts: list[int]) -> None:
        where = "WordVocabulary"
        words = list(_validate.sequence(where, "words", words, of="words"))
        counts = _validate.integer_sequence(where, "counts", counts, minimum=0)
        if len(words) != len(counts):
            raise ValueError(f"{where}: words and counts must have the same length, got {len(words)} and {len(counts)}")
        if len(set(words)) != len(words) or any(not isinstance(w, str) or w in SPECIAL_TOKENS for w in words):
            raise ValueError(f"{where}: words must be distinct strings other than {SPECIAL_TOKENS}")
        self.words = words
        self.counts = counts
        self.tokens = list(SPECIAL_TOKENS) + words
        self.index = {token: i for i, token in enumerate(self.tokens)}

    @classmethod
    def from_text(cls, text: str | list[str], *, min_count: int = 2) -> WordVocabulary:
        """Build the vocabulary of ``text`` (a str or a list of str): the words seen ``min_count`` times or more."""
        where = "WordVocabulary.from_text"
        text = _text(where, text)
        min_count = _validate.integer(where, "min_count", min_count, minimum=1)
        counter = collections.Counter(_WORD.findall(text.lower()))
        kept = sorted((w for w, c in counter.items() if c >= min_count), key=lambda w: (-counter[w], w))
        return cls(kept, [counter[w] for w in kept])

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def special_ids(self) -> list[int]:
        """``[PAD]``, ``[UNK]``, ``[CLS]``, ``[SEP]`` (and ``[MASK]``): never chosen as a target."""
        return [self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id]

    def split(self, text: str) -> list[str]:
        """The lower-cased words of ``text``, punctuation dropped."""
        return _WORD.findall(_text("WordVocabulary.split", text).lower())

    def encode(self, text: str, *, add_special: bool = False) -> torch.Tensor:
        """``[N]`` ids of the words of ``text`` (``[CLS] ... [SEP]`` around them with ``add_special``)."""
        ids = [self.index.get(w, self.unk_id) for w in self.split(text)]
        if add_special:
            ids = [self.cls_id, *ids, self.sep_id]
        return torch.tensor(ids, dtype=torch.long)

    def encode_pieces(self, texts: list[str], max_length: int) -> list[torch.Tensor]:
        """Each text as ``[CLS] words [SEP]`` ids, a longer one cut into pieces of at most ``max_length`` ids.

        Args:
            texts: the texts (rhymes), each encoded on its own.
            max_length: the most ids in a piece, ``[CLS]`` and ``[SEP]`` included; at least 3.

        Returns:
            one ``[N]`` id tensor per piece, ``N <= max_length``, in the order of ``texts``.

        Raises:
            TypeError: ``texts`` not a list of str. ValueError: ``max_length`` below 3.

        Example:
            >>> vocab = WordVocabulary(["a", "b"], [2, 2])
            >>> [piece.tolist() for piece in vocab.encode_pieces(["a b a", "b"], max_length=4)]
            [[2, 5, 6, 3], [2, 5, 3], [2, 6, 3]]
        """
        where = "WordVocabulary.encode_pieces"
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise TypeError(f"{where}: texts must be a list of str, got {type(texts).__name__}")
        max_length = _validate.integer(where, "max_length", max_length, minimum=3)
        pieces = []
        for text in texts:
            ids = self.encode(text)
            for start in range(0, len(ids), max_length - 2):
                chunk = ids[start:start + max_length - 2]
                pieces.append(torch.cat([torch.tensor([self.cls_id]), chunk, torch.tensor([self.sep_id])]))
        return pieces

    def decode(self, ids: torch.Tensor | list[int]) -> list[str]:
        """The token of each id."""
        if isinstance(ids, torch.Tensor):
            ids = _validate.integer_tensor("WordVocabulary.decode", "ids", ids).flatten().tolist()
        ids = _validate.integer_sequence("WordVocabulary.decode", "ids", ids, minimum=0)
        if any(i >= len(self.tokens) for i in ids):
            raise ValueError(f"WordVocabulary.decode: ids must be below {len(self.tokens)}")
        return [self.tokens[i] for i in ids]


def _text(where: str, text: object) -> str:
    if isinstance(text, list) and all(isinstance(t, str) for t in text):
        return "\n\n".join(text)
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be a str (or a list of str), got {type(text).__name__}")
    return text


def pad_batch(sequences: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D id tensors of different lengths into ``([B, N] ids, [B, N] mask)``, padded at the end.

    Args:
        sequences: ``B`` integer tensors ``[N_b]``, each with at least one id.
        pad_id: the id put after the shorter ones.

    Returns:
        ``(input_ids, attention_mask)``: ``[B, max N_b]`` ``torch.long``, and 1 for a real token, 0 for padding.

    Raises:
        TypeError: not a list of integer tensors. ValueError: an empty list, or a tensor that is not 1-D or empty.

    Example:
        >>> ids, mask = pad_batch([torch.tensor([2, 7, 3]), torch.tensor([2, 3])])
        >>> ids.tolist(), mask.tolist()
        ([[2, 7, 3], [2, 3, 0]], [[1, 1, 1], [1, 1, 0]])
    """
    where = "pad_batch"
    sequences = _validate.sequence(where, "sequences", sequences, of="tensors")
    if not sequences:
        raise ValueError(f"{where}: sequences must hold at least one tensor")
    sequences = [_validate.integer_tensor(where, "sequences", s) for s in sequences]
    if any(s.dim() != 1 or s.numel() == 0 for s in sequences):
        raise ValueError(f"{where}: every sequence must be a non-empty 1-D tensor")
    pad_id = _validate.integer(where, "pad_id", pad_id, minimum=0)
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)        # [B, N]
    mask = torch.zeros(len(sequences), length, dtype=torch.long)                # [B, N]
    for row, s in enumerate(sequences):
        ids[row, :len(s)], mask[row, :len(s)] = s, 1
    return ids, mask
