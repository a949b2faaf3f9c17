"""The sizes and settings of a Llama-style decoder, read from or checked like Hugging Face's ``config.json``.

Mistral is the same decoder with a sliding window on its attention (``sliding_window``), so a
Hugging Face ``"mistral"`` config reads into the same :class:`LlamaConfig`.

Only what this implementation computes can be expressed. Settings that would change the
computation and that it does not support (biases in the projections, another activation, a
head size other than ``hidden_size / num_attention_heads``, a rotary scaling it does not know)
are rejected by :meth:`LlamaConfig.from_dict` with an error naming the field, never ignored.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from attn_course import _validate
from attn_course.positions.rope import LinearScaling, Llama3Scaling, NTKScaling, YaRNScaling

__all__ = ["LlamaConfig", "ROPE_TYPES", "rope_from_hugging_face", "rope_parameters"]

RopeScaling = LinearScaling | NTKScaling | YaRNScaling | Llama3Scaling

#: Hugging Face's ``rope_type`` values this implementation reads, and the keys each may carry.
ROPE_TYPES = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "dynamic": frozenset({"factor"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                       "attention_factor", "mscale", "mscale_all_dim", "truncate"}),
    "llama3": frozenset({"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}),
}
_ROPE_COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
_MISTRAL_DEFAULTS = {"sliding_window": 4096, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
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
        rope_scaling: a context-extension method from :mod:`attn_course.positions.rope`
            (:class:`~attn_course.positions.rope.LinearScaling`,
            :class:`~attn_course.positions.rope.NTKScaling`, :class:`~attn_course.positions.rope.YaRNScaling`,
            :class:`~attn_course.positions.rope.Llama3Scaling`), or None.
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
        plus ``rope_scaling`` (older files); see :func:`rope_from_hugging_face`.

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
                :func:`rope_from_hugging_face`.

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
        supported = {"model_type": ("llama", "mistral", None), "hidden_act": ("silu",),
                     "attention_bias": (False,), "mlp_bias": (False,)}
        defaults = {"model_type": None, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}
        for key, allowed in supported.items():
            value = values.get(key, defaults[key])
            if value not in allowed:
                shown = " or ".join(repr(a) for a in allowed if a is not None)
                raise ValueError(f"{where}: unsupported config in {source}: {key}={value!r}; "
                                 f"this Llama supports only {key}={shown}")
        if values.get("model_type") == "mistral":
            # Hugging Face's MistralConfig (5.24) defaults, for keys a config.json leaves out.
            values = {**_MISTRAL_DEFAULTS, **values}
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        missing = sorted(required - set(values))
        if missing:
            raise ValueError(f"{where}: {source} lacks the required field(s) {', '.join(missing)}")
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

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> LlamaConfig:
        """Read a Hugging Face Llama or Mistral ``config.json``.

        Args:
            path: the file.

        Returns:
            the :class:`LlamaConfig`.

        Raises:
            TypeError: ``path`` not a str or path; or as in :meth:`from_dict`.
            FileNotFoundError: no such file.
            ValueError: a file that is not valid JSON; or as in :meth:`from_dict`.

        Example:
            >>> import json, pathlib, tempfile
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "config.json"
            >>> _ = path.write_text(json.dumps({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
            ...                                 "num_hidden_layers": 1, "num_attention_heads": 2}))
            >>> LlamaConfig.from_json_file(path).head_dim
            4
        """
        where = "LlamaConfig.from_json_file"
        path = _validate.existing_file(where, "path", path, what="config file")
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: {path} is not valid JSON: {error}") from None
        return cls.from_dict(values, source=str(path))


def rope_parameters(values: Mapping[str, Any], *, where: str = "rope_parameters") -> tuple[str, Mapping, str]:
    """Where a Hugging Face config keeps its rotary settings, what they are, and their ``rope_type``.

    transformers 5 writes ``rope_parameters``; older files ``rope_scaling`` (``None`` for plain
    RoPE), whose type key was once ``type`` rather than ``rope_type``.

    Args:
        values: the parsed ``config.json``.
        where: the name that error messages start with.

    Returns:
        ``(field, parameters, rope_type)``: the key read, its mapping (empty when absent) and the
        rotary type (``"default"`` when none is named).

    Raises:
        TypeError: that field is neither a mapping nor absent.

    Example:
        >>> rope_parameters({"rope_scaling": {"type": "linear", "factor": 2.0}})
        ('rope_scaling', {'type': 'linear', 'factor': 2.0}, 'linear')
    """
    field = "rope_parameters" if values.get("rope_parameters") is not None else "rope_scaling"
    parameters = values.get(field) or {}
    if not isinstance(parameters, Mapping):
        raise TypeError(f"{where}: {field} must be a JSON object, got {type(parameters).__name__}")
    return field, parameters, parameters.get("rope_type", parameters.get("type", "default"))


def rope_from_hugging_face(values: Mapping[str, Any], *, source: str = "config") -> tuple[float, RopeScaling | None]:
    """The rotary base and scaling of a Hugging Face config, as :mod:`attn_course.positions.rope` objects.

    Hugging Face's ``rope_type`` maps one to one onto the course's classes, which compute the
    same inverse frequencies (``tests/positions/test_rope_scaling.py``): ``"default"`` to no scaling,
    ``"linear"`` to :class:`~attn_course.positions.rope.LinearScaling`, ``"dynamic"`` to
    :class:`~attn_course.positions.rope.NTKScaling` with ``dynamic=True`` and ``original_context =
    max_position_embeddings`` (as Hugging Face), ``"yarn"`` to :class:`~attn_course.positions.rope.YaRNScaling`
    and ``"llama3"`` to :class:`~attn_course.positions.rope.Llama3Scaling`; ``original_max_position_embeddings``
    defaults to ``max_position_embeddings``, as Hugging Face fills it in. One difference: Hugging
    Face's dynamic NTK keeps the largest base it has seen until a call is shorter than the trained
    context, while ours recomputes the base from each call's positions; one pass over a sequence
    gets the same frequencies from both.

    Args:
        values: the parsed ``config.json``: ``rope_parameters`` (transformers 5), or the older
            ``rope_theta`` and ``rope_scaling`` (``type`` for ``rope_type`` is read too).
        source: where it came from, for error messages.

    Returns:
        ``(rope_theta, scaling or None)``.

    Raises:
        TypeError: ``values`` or the rotary parameters not a mapping, or a parameter of the wrong type.
        ValueError: a ``rope_type`` other than those above (``longrope``, per-layer parameters, ...),
            a key that the type does not use, a ``partial_rotary_factor`` other than 1, or a
            missing ``factor``; the field is named.

    Example:
        >>> rope_from_hugging_face({"rope_theta": 500000.0, "rope_scaling": {
        ...     "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        ...     "original_max_position_embeddings": 8192}})
        (500000.0, Llama3Scaling(factor=8.0, original_context=8192, low_freq_factor=1.0, high_freq_factor=4.0))
    """
    where = "rope_from_hugging_face"
    if not isinstance(values, Mapping):
        raise TypeError(f"{where}: {source} must be a JSON object, got {type(values).__name__}")
    field, parameters, rope_type = rope_parameters(values, where=where)
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{where}: {field}.rope_type={rope_type!r} is not supported; this Llama reads "
                         f"rope_type {', '.join(repr(t) for t in ROPE_TYPES)}")
    unknown = sorted(set(parameters) - _ROPE_COMMON_KEYS - ROPE_TYPES[rope_type])
    if unknown:
        raise ValueError(f"{where}: {field} has key(s) {', '.join(unknown)} that rope_type={rope_type!r} "
                         "does not use here (per-layer rotary settings are not supported)")
    fraction = parameters.get("partial_rotary_factor", values.get("partial_rotary_factor", 1.0))
    if fraction != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor={fraction!r} is not supported (Llama rotates every "
                         "feature of a head)")
    theta = parameters.get("rope_theta", values.get("rope_theta", 10000.0))
    theta = _validate.positive_finite(where, f"{field}.rope_theta", theta)
    if rope_type == "default":
        return theta, None
    if parameters.get("factor") is None:
        raise ValueError(f"{where}: {field}.factor is required for rope_type={rope_type!r}")
    factor = parameters["factor"]
    trained = values.get("max_position_embeddings", 2048)
    original = parameters.get("original_max_position_embeddings",
                              values.get("original_max_position_embeddings", trained))
    if rope_type == "linear":
        return theta, LinearScaling(factor)
    if rope_type == "dynamic":
        return theta, NTKScaling(factor, original_context=trained, dynamic=True)
    if rope_type == "llama3":
        return theta, Llama3Scaling(factor, original, parameters.get("low_freq_factor", 1.0),
                                    parameters.get("high_freq_factor", 4.0))
    attention_factor = parameters.get("attention_factor")
    mscale, mscale_all_dim = parameters.get("mscale"), parameters.get("mscale_all_dim")
    if attention_factor is None and mscale and mscale_all_dim:
        # DeepSeek's form of YaRN's temperature, as Hugging Face reads it: a ratio of two mscales.
        def temperature(scale: float) -> float:
            return 1.0 if factor <= 1 else 0.1 * scale * math.log(factor) + 1.0

        attention_factor = temperature(mscale) / temperature(mscale_all_dim)
    return theta, YaRNScaling(factor, original, beta_fast=parameters.get("beta_fast") or 32.0,
                              beta_slow=parameters.get("beta_slow") or 1.0, attention_factor=attention_factor,
                              truncate=parameters.get("truncate", True))
