"""The sizes of a BERT encoder, read from or checked like Hugging Face's ``config.json``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from attn_course import _validate
from attn_course.models.hugging_face.config import HuggingFaceConfig, check_required, check_supported

__all__ = ["BertConfig"]


@dataclasses.dataclass(frozen=True)
class BertConfig(HuggingFaceConfig):
    """The sizes of a BERT encoder, with the field names of Hugging Face's ``config.json``.

    Only what this implementation supports can be expressed: absolute position
    embeddings, exact GELU, an encoder without cross-attention. Other settings are
    rejected by :meth:`from_dict` rather than silently ignored; :meth:`from_json_file`
    reads the file.

    Args:
        vocab_size: number of token ids.
        hidden_size: model width ``E``.
        num_hidden_layers: number of encoder blocks ``L``.
        num_attention_heads: ``H``; must divide ``E``.
        intermediate_size: hidden width of each feed-forward network (``4 · E`` in BERT).
        max_position_embeddings: the longest sequence ``N`` the model can read.
        type_vocab_size: number of segment ids (2: sentence A and sentence B).
        layer_norm_eps: the LayerNorms' ``eps`` (``1e-12`` in BERT).
        hidden_dropout_prob: dropout on embeddings and sub-layer outputs while training.
        attention_probs_dropout_prob: dropout on attention weights while training.
        pad_token_id: the id of ``[PAD]``.

    Raises:
        TypeError: a size that is not an int, or a ``layer_norm_eps`` or dropout that is not
            a number (the message names the field).
        ValueError: a size below 1 (``pad_token_id`` below 0), ``E`` not divisible by ``H``,
            a non-positive ``layer_norm_eps`` or a dropout outside ``[0, 1)``.

    Example:
        >>> config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
        ...                     num_attention_heads=4, intermediate_size=64)
        >>> config.head_dim
        8
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        where = "BertConfig"
        for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            _validate.integer(where, field, getattr(self, field), minimum=1)
        _validate.integer(where, "pad_token_id", self.pad_token_id, minimum=0)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{where}: hidden_size={self.hidden_size} must be divisible by "
                f"num_attention_heads={self.num_attention_heads} (each head gets hidden_size / heads features)"
            )
        _validate.positive_finite(where, "layer_norm_eps", self.layer_norm_eps)
        for field in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            _validate.dropout(where, getattr(self, field), field)

    @property
    def head_dim(self) -> int:
        """``d = E / H``."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, source: str = "config") -> BertConfig:
        """Read the fields from a Hugging Face ``config.json`` dictionary.

        Keys this implementation does not need (``architectures``, ``initializer_range``,
        ``use_cache``, ...) are ignored. Keys that would change the computation are checked.

        Args:
            values: the parsed ``config.json``.
            source: where it came from, for error messages.

        Returns:
            the :class:`BertConfig`.

        Raises:
            TypeError: ``values`` not a mapping, or a field of the wrong type (as in
                :class:`BertConfig`, with ``source`` named).
            ValueError: a required field missing, a field with a wrong value, or a setting
                this implementation does not support (``model_type`` other than ``"bert"``,
                ``position_embedding_type`` other than ``"absolute"``, ``hidden_act`` other
                than ``"gelu"``, a decoder or cross-attention configuration).

        Example:
            >>> BertConfig.from_dict({"model_type": "bert", "vocab_size": 100, "hidden_size": 32,
            ...                       "num_hidden_layers": 2, "num_attention_heads": 4,
            ...                       "intermediate_size": 64, "use_cache": True}).head_dim
            8
        """
        where = "BertConfig.from_dict"
        if not isinstance(values, Mapping):
            raise TypeError(f"{where}: {source} must be a JSON object, got {type(values).__name__}")
        check_supported(values, {"model_type": (None, ("bert",)),
                                 "position_embedding_type": ("absolute", ("absolute",)),
                                 "hidden_act": ("gelu", ("gelu",)),
                                 "is_decoder": (False, (False,)),
                                 "add_cross_attention": (False, (False,))}, model="BERT", source=source, where=where)
        check_required(cls, values, source=source, where=where)
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {name: values[name] for name in fields if name in values and values[name] is not None}
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{where}: unsupported config in {source}: {error}") from None
