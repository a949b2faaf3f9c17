"""The sizes and settings of a Llama-style decoder, read from or checked like Hugging Face's ``config.json``.

Mistral is the same decoder with a sliding window on its attention (``sliding_window``), so a
Hugging Face ``"mistral"`` config reads into the same :class:`LlamaConfig`.

Only what this implementation computes can be expressed. Settings that would change the
computation and that it does not support (biases in the projections, another activation, a
head size other than ``hidden_size / num_attention_heads``, a rotary scaling it does not know)
are rejected by :meth:`LlamaConfig.from_dict` with an error naming the field, never ignored.
Reading the file (``from_json_file``) and the rotary settings is :mod:`attn_course.models.hugging_face`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from attn_course import _validate
from attn_course.models.hugging_face.config import (
    HuggingFaceConfig,
    RopeScaling,
    check_required,
    check_supported,
    rope_from_hugging_face,
)
from attn_course.positions.rope_scaling import LinearScaling, Llama3Scaling, NTKScaling, YaRNScaling

__all__ = ["LlamaConfig"]
_MISTRAL_DEFAULTS = {"sliding_window": 4096, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32}


@dataclasses.dataclass(frozen=True)
class LlamaConfig(HuggingFaceConfig):
    """The sizes of a Llama-style decoder, with the field names of Hugging Face's ``config.json``.

    Args:
        vocab_size: number of token ids ``V``.
        hidden_size: model width ``E``.
        intermediate_size: hidden width ``F`` of each SwiGLU feed-forward network.
        num_hidden_layers: number of decoder blocks ``L``.
        num_attention_heads: query heads ``H``; must divide ``E`` (head size ``d = E / H``).
        num_key_value_heads: key/value heads ``H_kv`` (grouped-query attention); must divide ``H``.
            Default ``H``.
        rms_norm_eps: the RMSNorms' ``eps``.
        rope_theta: the rotary base, ``θ_i = rope_theta^(-2i/d)``.
        rope_scaling: a context-extension method of :mod:`attn_course.positions.rope_scaling`
            (``LinearScaling``, ``NTKScaling``, ``YaRNScaling``, ``Llama3Scaling``), or None.
        max_position_embeddings: the trained context length (RoPE itself sets no limit; dynamic
            NTK scaling starts above it).
        tie_word_embeddings: the LM head reuses the token embedding matrix.
        attention_dropout: dropout on attention weights while training.
        sliding_window: ``W``, Mistral's window: query ``i`` sees key ``j`` only when
            ``i - W < j <= i`` (itself and the ``W - 1`` tokens before it); None (Llama) for full
            causal attention.

    Raises:
        TypeError: a field of the wrong type (the message names it).
        ValueError: a size below 1, ``E`` not divisible by ``H`` or ``H`` by ``H_kv``, an odd head
            size (RoPE rotates pairs), a non-positive ``rms_norm_eps`` or ``rope_theta``, a
            dropout outside ``[0, 1)``, or a ``sliding_window`` below 1.

    Example:
        >>> config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
        ...                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        >>> config.head_dim, config.num_key_value_heads
        (16, 2)
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_dropout: float = 0.0
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        where = "LlamaConfig"
        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "max_position_embeddings"):
            _validate.integer(where, field, getattr(self, field), minimum=1)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        _validate.integer(where, "num_key_value_heads", self.num_key_value_heads, minimum=1)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{where}: hidden_size={self.hidden_size} must be divisible by num_attention_heads="
                f"{self.num_attention_heads} (each head gets hidden_size / heads features)"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"{where}: num_attention_heads={self.num_attention_heads} must be divisible by "
                f"num_key_value_heads={self.num_key_value_heads} (each key/value head serves a whole group)"
            )
        if self.head_dim % 2:
            raise ValueError(f"{where}: the head size hidden_size / num_attention_heads = {self.head_dim} "
                             "must be even (RoPE rotates features in pairs)")
        object.__setattr__(self, "rms_norm_eps", _validate.positive_finite(where, "rms_norm_eps", self.rms_norm_eps))
        object.__setattr__(self, "rope_theta", _validate.positive_finite(where, "rope_theta", self.rope_theta))
        scalings = (LinearScaling, NTKScaling, YaRNScaling, Llama3Scaling)
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, scalings):
            raise TypeError(f"{where}: rope_scaling must be None or one of "
                            f"{', '.join(s.__name__ for s in scalings)}, got {type(self.rope_scaling).__name__}")
        _validate.boolean(where, "tie_word_embeddings", self.tie_word_embeddings)
        object.__setattr__(self, "attention_dropout",
                           _validate.dropout(where, self.attention_dropout, "attention_dropout"))
        if self.sliding_window is not None:
            _validate.integer(where, "sliding_window", self.sliding_window, minimum=1)

    @property
    def head_dim(self) -> int:
        """``d = E / H``."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, source: str = "config") -> LlamaConfig:
        """Read the fields from a Hugging Face Llama or Mistral ``config.json`` dictionary.

        A ``"mistral"`` config also gives ``sliding_window`` (null for none); where a key is
        absent, Hugging Face's ``MistralConfig`` defaults apply (``sliding_window`` 4096, 8
        key/value heads, 131072 positions), as ``MistralForCausalLM`` would use them. A
        ``"llama"`` config never has a window (Hugging Face's Llama reads no such key).
        Keys that do not change the computation (``architectures``, ``bos_token_id``,
        ``initializer_range``, ``use_cache``, ``pretraining_tp``, ...) are ignored. The rotary
        settings are read in both layouts: ``rope_parameters`` (transformers 5) or ``rope_theta``
        plus ``rope_scaling`` (older files); see
        :func:`~attn_course.models.hugging_face.config.rope_from_hugging_face`.

        Args:
            values: the parsed ``config.json``.
            source: where it came from, for error messages.

        Returns:
            the :class:`LlamaConfig`.

        Raises:
            TypeError: ``values`` not a mapping, or a field of the wrong type (the field is named).
            ValueError: a required field missing, or a setting this implementation does not
                support: ``model_type`` other than ``"llama"`` or ``"mistral"``, ``hidden_act`` other than
                ``"silu"``, ``attention_bias`` or ``mlp_bias`` true, a ``head_dim`` other than
                ``hidden_size / num_attention_heads``, or rotary settings as in
                :func:`~attn_course.models.hugging_face.config.rope_from_hugging_face`.

        Example:
            >>> config = LlamaConfig.from_dict({
            ...     "model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
            ...     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            ...     "rope_parameters": {"rope_type": "linear", "rope_theta": 500000.0, "factor": 4.0}})
            >>> config.rope_theta, config.rope_scaling
            (500000.0, LinearScaling(factor=4.0))
            >>> LlamaConfig.from_dict({
            ...     "model_type": "mistral", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
            ...     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            ...     "sliding_window": 16}).sliding_window
            16
        """
        where = "LlamaConfig.from_dict"
        if not isinstance(values, Mapping):
            raise TypeError(f"{where}: {source} must be a JSON object, got {type(values).__name__}")
        check_supported(values, {"model_type": (None, ("llama", "mistral", None)), "hidden_act": ("silu", ("silu",)),
                                 "attention_bias": (False, (False,)), "mlp_bias": (False, (False,))},
                        model="Llama", source=source, where=where)
        if values.get("model_type") == "mistral":
            # Hugging Face's MistralConfig (5.24) defaults, for keys a config.json leaves out.
            values = {**_MISTRAL_DEFAULTS, **values}
        check_required(cls, values, source=source, where=where)
        head_dim = values.get("head_dim")
        hidden, heads = values["hidden_size"], values["num_attention_heads"]
        if head_dim is not None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0 \
                and head_dim != hidden // heads:
            # MultiHeadAttention ties the head size to E / H (its q_proj is [E, E]).
            raise ValueError(f"{where}: unsupported config in {source}: head_dim={head_dim!r}; this Llama "
                             f"needs head_dim = hidden_size / num_attention_heads = {hidden // heads}")
        plain = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
                 "attention_dropout")
        kwargs = {name: values[name] for name in plain if values.get(name) is not None}
        if values.get("model_type") == "mistral":
            kwargs["sliding_window"] = values["sliding_window"]                 # None: no window
        try:
            kwargs["rope_theta"], kwargs["rope_scaling"] = rope_from_hugging_face(values, source=source)
            return cls(**kwargs)
        except (TypeError, ValueError) as error:
            message = str(error).removeprefix("rope_from_hugging_face: ")
            raise type(error)(f"{where}: unsupported config in {source}: {message}") from None
