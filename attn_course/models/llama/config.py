"""The sizes and settings of a Llama-style decoder, read from or checked like Hugging Face's ``config.json``.

Mistral is the same decoder with a sliding window on its attention (``sliding_window``), and Qwen3
the same with an RMSNorm on each head's query and key (``qk_norm``), a head size of its own
(``head_dim``), optional biases on the attention's projections (``attention_bias``) and a window on
the layers its ``layer_types`` marks; a Hugging Face ``"mistral"`` or ``"qwen3"`` config reads into
the same :class:`LlamaConfig`.

Only what this implementation computes can be expressed. Settings that would change the
computation and that it does not support (biases in the feed-forward network, another activation, a
rotary scaling it does not know; for Llama and Mistral, attention biases and a head size other than
``hidden_size / num_attention_heads``) are rejected by :meth:`LlamaConfig.from_dict` with an error
naming the field, never ignored.
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

__all__ = ["MODEL_TYPES", "LAYER_TYPES", "LlamaConfig"]

#: The Hugging Face ``model_type`` values that :meth:`LlamaConfig.from_dict` reads.
MODEL_TYPES = ("llama", "mistral", "qwen3")
#: The entries of ``layer_types``: a layer attends to every earlier token, or to its last ``sliding_window``.
LAYER_TYPES = ("full_attention", "sliding_attention")

# Hugging Face's config classes' defaults (transformers 5.25) for keys a config.json leaves out.
_DEFAULTS = {
    "mistral": {"sliding_window": 4096, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32},
    "qwen3": {"head_dim": 128, "num_key_value_heads": 32, "max_position_embeddings": 32768, "sliding_window": 4096,
              "use_sliding_window": False, "max_window_layers": 28},
}


@dataclasses.dataclass(frozen=True, repr=False)
class LlamaConfig(HuggingFaceConfig):
    """The sizes of a Llama-style decoder, with the field names of Hugging Face's ``config.json``.

    Args:
        vocab_size: number of token ids ``V``.
        hidden_size: model width ``E``.
        intermediate_size: hidden width ``F`` of each SwiGLU feed-forward network.
        num_hidden_layers: number of decoder blocks ``L``.
        num_attention_heads: query heads ``H``; must divide ``E`` unless ``head_dim`` is given.
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
            causal attention. Without ``layer_types`` every layer slides.
        head_dim: the head size ``d``; default (None) ``E / H``. Qwen3's need not be: ``H · d != E``.
        attention_bias: biases on the attention's four projections (Qwen3's ``attention_bias``).
        qk_norm: an RMSNorm over each head's query and key, before RoPE (Qwen3).
        layer_types: one entry of :data:`LAYER_TYPES` per layer (Qwen3's ``layer_types``): the
            ``"sliding_attention"`` layers see the last ``sliding_window`` tokens, the others all; None:
            every layer is alike.

    The fields after ``sliding_window`` appear in the ``repr`` only where they change something, so a
    Llama's or a Mistral's config reads as it always has.

    Raises:
        TypeError: a field of the wrong type (the message names it).
        ValueError: a size below 1, ``E`` not divisible by ``H`` (without ``head_dim``) or ``H`` by
            ``H_kv``, an odd head size (RoPE rotates pairs), a non-positive ``rms_norm_eps`` or
            ``rope_theta``, a dropout outside ``[0, 1)``, a ``sliding_window`` below 1, or ``layer_types``
            of another length than the layers, with an unknown entry, or with sliding layers but no window.

    Example:
        >>> config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
        ...                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        >>> config.head_dim, config.num_key_value_heads
        (16, 2)
        >>> qwen = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                    num_attention_heads=4, head_dim=32, qk_norm=True, sliding_window=8,
        ...                    layer_types=["full_attention", "sliding_attention"])
        >>> qwen.head_dim, [qwen.layer_window(i) for i in range(2)]
        (32, [None, 8])
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
    head_dim: int | None = None
    attention_bias: bool = False
    qk_norm: bool = False
    layer_types: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        where = "LlamaConfig"
        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "max_position_embeddings"):
            _validate.integer(where, field, getattr(self, field), minimum=1)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        _validate.integer(where, "num_key_value_heads", self.num_key_value_heads, minimum=1)
        if self.head_dim is not None:
            object.__setattr__(self, "head_dim", _validate.integer(where, "head_dim", self.head_dim, minimum=1))
        elif self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{where}: hidden_size={self.hidden_size} must be divisible by num_attention_heads="
                f"{self.num_attention_heads} (each head gets hidden_size / heads features)"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"{where}: num_attention_heads={self.num_attention_heads} must be divisible by "
                f"num_key_value_heads={self.num_key_value_heads} (each key/value head serves a whole group)"
            )
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
            size = "hidden_size / num_attention_heads"
        else:
            size = "head_dim"
        if self.head_dim % 2:
            raise ValueError(f"{where}: the head size {size} = {self.head_dim} "
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
        _validate.boolean(where, "attention_bias", self.attention_bias)
        _validate.boolean(where, "qk_norm", self.qk_norm)
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", self._checked_layer_types(where))

    def _checked_layer_types(self, where: str) -> tuple[str, ...]:
        """``layer_types`` as a tuple, one known entry per layer, with a window if any layer slides."""
        layer_types = tuple(_validate.labels(where, "layer_types", self.layer_types))
        if len(layer_types) != self.num_hidden_layers:
            raise ValueError(f"{where}: layer_types must have one entry per layer (num_hidden_layers="
                             f"{self.num_hidden_layers}), got {len(layer_types)}")
        unknown = sorted(set(layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(f"{where}: layer_types holds {', '.join(map(repr, unknown))}; this Llama reads "
                             f"{' and '.join(map(repr, LAYER_TYPES))}")
        if "sliding_attention" in layer_types and self.sliding_window is None:
            raise ValueError(f"{where}: layer_types marks sliding layers but sliding_window is None")
        return layer_types

    def __repr__(self) -> str:
        unset = {"head_dim": None if self.hidden_size % self.num_attention_heads
                 else self.hidden_size // self.num_attention_heads,
                 "attention_bias": False, "qk_norm": False, "layer_types": None}
        shown = [f"{field.name}={getattr(self, field.name)!r}" for field in dataclasses.fields(self)
                 if field.name not in unset or getattr(self, field.name) != unset[field.name]]
        return f"{type(self).__name__}({', '.join(shown)})"

    def layer_window(self, index: int) -> int | None:
        """The window of layer ``index``: ``sliding_window`` where the layer slides (every layer without
        ``layer_types``), else None.

        Raises:
            TypeError, ValueError: ``index`` not an int in ``0 .. num_hidden_layers - 1``.

        Example:
            >>> LlamaConfig(vocab_size=10, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            ...             num_attention_heads=2, sliding_window=4).layer_window(1)
            4
        """
        where = "LlamaConfig.layer_window"
        index = _validate.integer(where, "index", index, minimum=0)
        if index >= self.num_hidden_layers:
            raise ValueError(f"{where}: index must be < num_hidden_layers={self.num_hidden_layers}, got {index}")
        if self.layer_types is not None and self.layer_types[index] != "sliding_attention":
            return None
        return self.sliding_window

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, source: str = "config") -> LlamaConfig:
        """Read the fields from a Hugging Face Llama, Mistral or Qwen3 ``config.json`` dictionary.

        A ``"mistral"`` config also gives ``sliding_window`` (null for none), on every layer. A
        ``"qwen3"`` config gives ``qk_norm=True``, its ``head_dim`` and ``attention_bias``, and a window
        (``sliding_window``, when ``use_sliding_window`` is true) on the layers that ``layer_types`` marks
        ``"sliding_attention"``; without ``layer_types``, on layers ``max_window_layers`` and up, as
        Hugging Face's ``Qwen3Config`` derives them. Where a key is absent, Hugging Face's
        ``MistralConfig`` or ``Qwen3Config`` defaults apply (transformers 5.25: Mistral's
        ``sliding_window`` 4096, 8 key/value heads, 131072 positions; Qwen3's ``head_dim`` 128, 32
        key/value heads, 32768 positions, no sliding window), as Hugging Face's model would use them. A
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
                support: ``model_type`` other than those of :data:`MODEL_TYPES`, ``hidden_act`` other than
                ``"silu"``, ``mlp_bias`` true; for Llama and Mistral ``attention_bias`` true or a ``head_dim``
                other than ``hidden_size / num_attention_heads``; Qwen3 ``layer_types`` that mark sliding
                layers without a window; or rotary settings as in
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
            >>> qwen = LlamaConfig.from_dict({
            ...     "model_type": "qwen3", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
            ...     "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            ...     "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2})
            >>> qwen.qk_norm, qwen.head_dim, qwen.layer_types
            (True, 32, ('full_attention', 'full_attention', 'sliding_attention'))
        """
        where = "LlamaConfig.from_dict"
        if not isinstance(values, Mapping):
            raise TypeError(f"{where}: {source} must be a JSON object, got {type(values).__name__}")
        model_type = values.get("model_type")
        supported = {"model_type": (None, (*MODEL_TYPES, None)), "hidden_act": ("silu", ("silu",)),
                     "attention_bias": (False, (False, True) if model_type == "qwen3" else (False,)),
                     "mlp_bias": (False, (False,))}
        check_supported(values, supported, model="Llama", source=source, where=where)
        values = {**_DEFAULTS.get(model_type, {}), **values}
        check_required(cls, values, source=source, where=where)
        head_dim = values.get("head_dim")
        hidden, heads = values["hidden_size"], values["num_attention_heads"]
        if model_type != "qwen3" and head_dim is not None and isinstance(hidden, int) and isinstance(heads, int) \
                and heads > 0 and head_dim != hidden // heads:
            # Hugging Face's Llama and Mistral read it too; the course reads it for Qwen3 only, so far.
            raise ValueError(f"{where}: unsupported config in {source}: head_dim={head_dim!r}; this Llama "
                             f"needs head_dim = hidden_size / num_attention_heads = {hidden // heads}")
        plain = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
                 "attention_dropout", "head_dim")
        kwargs = {name: values[name] for name in plain if values.get(name) is not None}
        if model_type == "mistral":
            kwargs["sliding_window"] = values["sliding_window"]                 # None: no window
        if model_type == "qwen3":
            kwargs.update(_qwen3_fields(values, source, where))
        try:
            kwargs["rope_theta"], kwargs["rope_scaling"] = rope_from_hugging_face(values, source=source)
            return cls(**kwargs)
        except (TypeError, ValueError) as error:
            message = str(error).removeprefix("rope_from_hugging_face: ").removeprefix("LlamaConfig: ")
            raise type(error)(f"{where}: unsupported config in {source}: {message}") from None


def _qwen3_fields(values: Mapping[str, Any], source: str, where: str) -> dict[str, Any]:
    """What a Qwen3 config adds: QK-norm, attention biases, and which layers slide over which window.

    As Hugging Face's ``Qwen3Config`` (transformers 5.25): the window is ``sliding_window`` only when
    ``use_sliding_window`` is true; ``layer_types``, when the file leaves it out, marks layers
    ``max_window_layers`` and up as sliding if there is a window.
    """
    window = values["sliding_window"] if values.get("use_sliding_window") else None
    layer_types = values.get("layer_types")
    if layer_types is None:
        first = _validate.integer(where, "max_window_layers", values["max_window_layers"], minimum=0)
        layers = _validate.integer(where, "num_hidden_layers", values["num_hidden_layers"], minimum=1)
        layer_types = ["sliding_attention" if window is not None and i >= first else "full_attention"
                       for i in range(layers)]
    elif isinstance(layer_types, list) and "sliding_attention" in layer_types and window is None:
        # Hugging Face's create_sliding_window_causal_mask refuses it too ("Could not find a sliding_window").
        raise ValueError(f"{where}: unsupported config in {source}: layer_types marks sliding layers but "
                         f"use_sliding_window={values.get('use_sliding_window')!r} and sliding_window="
                         f"{values.get('sliding_window')!r} give no window")
    return {"qk_norm": True, "attention_bias": values.get("attention_bias", False), "sliding_window": window,
            "layer_types": layer_types}
