"""The cache of a whole model by the layout of its layers: full, sliding-window and linear attention.

Today's open models mix three kinds of layer, and each keeps something different per sequence to decode
the next token (``N`` tokens so far; ``W`` the window; chapter 04's and 09's caches):

- ``full_attention``: ``2 · n_kv · d_h · N`` (MLA: ``(d_c + d_h^R) · N``), growing with every token;
- ``sliding_attention``: ``2 · n_kv · d_h · min(N, W - 1)``, fixed once ``N`` reaches ``W - 1``;
- ``linear_attention`` (Gated DeltaNet): the state ``h_v · d_k · d_v`` plus the short convolution's last
  ``K`` inputs, ``(2 · h_k · d_k + h_v · d_v) · K``, whatever ``N``.

A sliding layer keeps the last ``W - 1`` keys and values: the next token's query brings its window to
``W`` (Hugging Face's ``DynamicSlidingWindowLayer`` and chapter 09's ``RollingKVCache`` keep the same).
The linear state is what Hugging Face's ``LinearAttentionLayer`` keeps for Qwen3-Next
(``modeling_qwen3_next.py``): the recurrent state ``[h_v, d_k, d_v]`` and a ``conv_state`` of the last
``linear_conv_kernel_dim`` inputs of the depthwise convolution over queries, keys and values.

:func:`layer_kinds` reads a Hugging Face config's layout; :func:`cache_elements_by_layout` counts a whole
model's cache from it; :func:`published_config` loads the four configs chapter 12 compares (Qwen3-8B,
Gemma 3 27B, gpt-oss-120b, Qwen3-Next-80B-A3B), shipped in ``attn_course/data/published_configs/``
with their sources.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from attn_course import _validate
from attn_course.variants.kv_cache_size import cache_size_from_config

__all__ = ["LAYER_KINDS", "PUBLISHED_CONFIGS", "LINEAR_FIELDS", "layer_kinds", "linear_state_elements", "LayoutCache",
           "cache_elements_by_layout", "published_config"]

#: The layer kinds :func:`layer_kinds` reads (Hugging Face's ``layer_types`` names); any other is refused.
LAYER_KINDS = ("full_attention", "sliding_attention", "linear_attention")
#: The configs in ``attn_course/data/published_configs/`` (their README gives each one's source).
PUBLISHED_CONFIGS = ("qwen3-8b", "gemma-3-27b-it", "gpt-oss-120b", "qwen3-next-80b-a3b-instruct")
#: Gated DeltaNet's fields in a Qwen3-Next config (``Qwen3NextGatedDeltaNet`` reads these).
LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                 "linear_conv_kernel_dim")


def _text_config(where: str, config: object) -> Mapping[str, Any]:
    """The mapping to read: ``config`` itself, or its ``text_config`` (a vision-language model's language part)."""
    config = _validate.config_mapping(where, "config", config)
    text = config.get("text_config")
    if "num_hidden_layers" not in config and text is not None:
        return _validate.config_mapping(where, "config['text_config']", text)
    return config


def _field(where: str, config: Mapping[str, Any], name: str) -> int:
    """A positive int the config must hold."""
    if config.get(name) is None:
        raise ValueError(f"{where}: the config lacks {name}")
    return _validate.integer(where, name, config[name], minimum=1)


def _kinds(where: str, config: Mapping[str, Any]) -> list[str]:
    """Each layer's kind: ``layer_types``, else a pattern (Gemma's, Qwen3-Next's), else every layer full."""
    layers = _field(where, config, "num_hidden_layers")
    if config.get("layer_types") is not None:
        kinds = _validate.labels(where, "layer_types", config["layer_types"], expected=layers)
        unread = sorted(set(kinds) - set(LAYER_KINDS))
        if unread:
            raise ValueError(f"{where}: layer_types holds {', '.join(map(repr, unread))}, which this function "
                             f"does not read (it reads {', '.join(LAYER_KINDS)})")
        return kinds
    if config.get("sliding_window_pattern") is not None:             # Gemma 3: every p-th layer is global
        period = _field(where, config, "sliding_window_pattern")
        return ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(layers)]
    if config.get("full_attention_interval") is not None:            # Qwen3-Next: every k-th layer is full
        period = _field(where, config, "full_attention_interval")
        return ["full_attention" if (i + 1) % period == 0 else "linear_attention" for i in range(layers)]
    if config.get("attention_chunk_size") is not None:
        raise ValueError(f"{where}: the config has attention_chunk_size (chunked attention), which this function "
                         "does not read; give layer_types")
    if config.get("use_sliding_window") is True:                     # Qwen2/3: windows above max_window_layers
        raise ValueError(f"{where}: the config has use_sliding_window=True, whose layers (max_window_layers) this "
                         "function does not read; give layer_types")
    if config.get("sliding_window") is not None and config.get("use_sliding_window") is not False:
        raise ValueError(f"{where}: the config has sliding_window={config['sliding_window']!r} but says neither "
                         "which layers slide (layer_types, sliding_window_pattern) nor use_sliding_window=False; "
                         "give layer_types")
    return ["full_attention"] * layers


def layer_kinds(config: Mapping[str, Any] | Any) -> list[str]:
    """Each layer's kind of attention, read from a Hugging Face config as its own config class reads it.

    ``layer_types`` where the config lists them; otherwise Gemma 3's ``sliding_window_pattern`` ``p``
    (layer ``i`` full when ``(i + 1) % p == 0``, sliding otherwise) or Qwen3-Next's
    ``full_attention_interval`` ``k`` (full when ``(i + 1) % k == 0``, linear otherwise); otherwise every
    layer is full, provided no sliding window is set (or ``use_sliding_window`` is false, as Qwen's
    configs say). A config with a window and no word on which layers use it is refused, not guessed.

    Args:
        config: the parsed ``config.json`` (or its ``text_config``), or a ``transformers`` config.

    Returns:
        a list of ``num_hidden_layers`` kinds, each one of :data:`LAYER_KINDS`.

    Raises:
        TypeError: ``config`` neither a mapping nor a config object, or a field of the wrong type.
        ValueError: a missing or non-positive field (named), ``layer_types`` of the wrong length or with a
            kind not in :data:`LAYER_KINDS`, chunked attention, or a window without a layout.

    Example:
        >>> layer_kinds({"num_hidden_layers": 4, "full_attention_interval": 4})
        ['linear_attention', 'linear_attention', 'linear_attention', 'full_attention']
    """
    where = "layer_kinds"
    return _kinds(where, _text_config(where, config))


def _linear_state(where: str, config: Mapping[str, Any]) -> int:
    """Gated DeltaNet's state per layer and sequence: recurrent ``h_v·d_k·d_v`` plus the convolution's ``C·K``."""
    h_k, h_v, d_k, d_v, kernel = (_field(where, config, name) for name in LINEAR_FIELDS)
    recurrent = h_v * d_k * d_v                                      # [h_v, d_k, d_v]
    conv = (2 * h_k * d_k + h_v * d_v) * kernel                      # [C, K]: queries, keys, values
    return recurrent + conv


def linear_state_elements(config: Mapping[str, Any] | Any) -> int:
    """Elements one Gated DeltaNet layer (Qwen3-Next) keeps per sequence, whatever the number of tokens.

    The recurrent state ``[h_v, d_k, d_v]`` plus the short convolution's last ``K`` inputs over the
    ``C = 2 · h_k · d_k + h_v · d_v`` channels of queries, keys and values, as Hugging Face's
    ``LinearAttentionLayer`` keeps them (``conv_states``, ``recurrent_states``).

    Args:
        config: a config with ``linear_num_key_heads`` (``h_k``), ``linear_num_value_heads`` (``h_v``),
            ``linear_key_head_dim`` (``d_k``), ``linear_value_head_dim`` (``d_v``) and
            ``linear_conv_kernel_dim`` (``K``).

    Returns:
        ``h_v · d_k · d_v + (2 · h_k · d_k + h_v · d_v) · K`` (an int).

    Raises:
        TypeError: ``config`` neither a mapping nor a config object, or a field that is not an int.
        ValueError: a missing or non-positive field (named).

    Example:
        >>> linear_state_elements(published_config("qwen3-next-80b-a3b-instruct"))   # 32·128·128 + 8192·4
        557056
    """
    where = "linear_state_elements"
    return _linear_state(where, _text_config(where, config))


@dataclasses.dataclass(frozen=True)
class LayoutCache:
    """What a whole model keeps per sequence after ``tokens`` tokens, kind by kind of layer.

    Attributes:
        tokens: ``N``, the tokens in the sequence.
        full_layers, sliding_layers, linear_layers: how many layers of each kind.
        full_elements: elements all full-attention layers keep (grows with ``N``).
        sliding_elements: elements all sliding-window layers keep (fixed once ``N >= W - 1``).
        linear_elements: elements all linear-attention layers keep (fixed).

    Example:
        >>> size = cache_elements_by_layout(published_config("gpt-oss-120b"), 4096)
        >>> size.elements, size.bytes(bits_per_element=16)
        (77838336, 155676672.0)
    """

    tokens: int
    full_layers: int
    sliding_layers: int
    linear_layers: int
    full_elements: int
    sliding_elements: int
    linear_elements: int

    @property
    def elements(self) -> int:
        """All layers together."""
        return self.full_elements + self.sliding_elements + self.linear_elements

    def bytes(self, *, batch: int = 1, bits_per_element: float = 16) -> float:
        """Bytes of the cache for ``batch`` sequences: ``elements · batch · bits_per_element / 8``.

        Args:
            batch: sequences.
            bits_per_element: 16 for bfloat16/float16, 32 for float32.

        Returns:
            the bytes (a float: averages of bits need not fill whole bytes).

        Raises:
            TypeError, ValueError: ``batch`` not a positive int, bits that are not positive.
        """
        where = "LayoutCache.bytes"
        batch = _validate.integer(where, "batch", batch, minimum=1)
        bits = _validate.positive_finite(where, "bits_per_element", bits_per_element)
        return self.elements * batch * bits / 8


def cache_elements_by_layout(config: Mapping[str, Any] | Any, tokens: int) -> LayoutCache:
    """The elements a whole model keeps per sequence after ``tokens`` tokens, by the kind of each layer.

    Each layer's kind comes from :func:`layer_kinds`; a full layer keeps ``tokens`` keys and values
    (their size per token from :func:`~attn_course.variants.kv_cache_size.cache_size_from_config`), a
    sliding layer ``min(tokens, sliding_window - 1)``, a linear layer its constant
    :func:`linear_state_elements`. Elements, not bytes: Hugging Face's PyTorch path keeps Gated DeltaNet's
    recurrent state in float32 even in a bfloat16 model, so count its bytes apart if it matters.

    Args:
        config: the parsed ``config.json`` (its ``text_config`` is read when it has one and no
            ``num_hidden_layers`` of its own), or a ``transformers`` config.
        tokens: ``N``, the tokens in the sequence so far.

    Returns:
        a :class:`LayoutCache`.

    Raises:
        TypeError: ``config`` neither a mapping nor a config object, a field of the wrong type, or
            ``tokens`` not an int.
        ValueError: ``tokens`` below 1, a field missing (named), or a layout :func:`layer_kinds`
            cannot read; the errors of ``cache_size_from_config`` for the keys and values.

    Example:
        >>> size = cache_elements_by_layout(published_config("gemma-3-27b-it"), 131072)
        >>> size.full_layers, size.sliding_layers, size.full_elements, size.sliding_elements
        (10, 52, 5368709120, 217890816)
    """
    where = "cache_elements_by_layout"
    tokens = _validate.integer(where, "tokens", tokens, minimum=1)
    config = _text_config(where, config)
    kinds = _kinds(where, config)
    full, sliding, linear = (kinds.count(kind) for kind in LAYER_KINDS)
    per_token = cache_size_from_config(config).per_layer if full or sliding else 0   # keys and values per token
    kept = min(tokens, _field(where, config, "sliding_window") - 1) if sliding else 0
    state = _linear_state(where, config) if linear else 0
    return LayoutCache(tokens, full, sliding, linear, full * per_token * tokens, sliding * per_token * kept,
                       linear * state)


def published_config(name: str) -> dict[str, Any]:
    """One of the four published configs chapter 12 compares, as shipped with the course.

    Only the fields the cache needs (and ``model_type``, ``architectures``), copied from the models'
    published ``config.json``; ``attn_course/data/published_configs/README.md`` gives each file's source.

    Args:
        name: one of :data:`PUBLISHED_CONFIGS`.

    Returns:
        the config as a dict (a fresh one on every call).

    Raises:
        TypeError: ``name`` not a str.
        ValueError: an unknown name.

    Example:
        >>> published_config("qwen3-8b")["num_key_value_heads"]
        8
    """
    where = "published_config"
    if not isinstance(name, str):
        raise TypeError(f"{where}: name must be a str, got {type(name).__name__}")
    if name not in PUBLISHED_CONFIGS:
        raise ValueError(f"{where}: name must be one of {', '.join(PUBLISHED_CONFIGS)}, got {name!r}")
    text = resources.files("attn_course.data").joinpath(f"published_configs/{name}.json").read_text(
        encoding="utf-8")
    return json.loads(text)
