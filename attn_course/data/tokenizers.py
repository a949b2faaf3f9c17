"""Tokenizers for the course's own small models (BERT's WordPiece tokenizer lives with BERT).

- :class:`CharTokenizer`: one id per distinct character of a text (chapters 04, 06, 08).
"""

from __future__ import annotations

import torch

from attn_course import _validate

__all__ = ["CharTokenizer"]


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
