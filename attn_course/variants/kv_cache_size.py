"""How many numbers each kind of attention caches per token: MHA, GQA, MQA and MLA.

Per token and per layer (DeepSeek-V2, arXiv 2405.04434, Table 1, which counts elements
"regardless of the storage precision"):

==========================  ======================  =========================================
attention                   elements per token      what is cached
==========================  ======================  =========================================
multi-head (MHA)            ``2 · n_h · d_h``       a key and a value for every head
grouped-query (GQA)         ``2 · n_kv · d_h``      a key and a value for every key/value head
multi-query (MQA)           ``2 · d_h``             one key and one value shared by all heads
multi-head latent (MLA)     ``d_c + d_h^R``         the latent ``c_KV`` and the rotary key ``k_R``
==========================  ======================  =========================================

Multiply by the number of layers for a whole model, by the tokens and the batch for a whole cache,
and by the bits per element for its size. :func:`cache_size_from_config` reads the numbers from a
Hugging Face ``config.json``; :data:`DEEPSEEK_V2` and :data:`DEEPSEEK_67B` are the two models the
DeepSeek-V2 paper compares. :func:`cache_bytes_rows` sets them beside a sliding window and linear
attention: the bytes one layer keeps per sequence to decode, a row per variant. A whole model whose layers
mix full, sliding-window and linear attention is counted layer kind by layer kind in
:mod:`~attn_course.variants.layout_cache_size`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from attn_course import _validate

__all__ = [
    "mha_cache_elements",
    "gqa_cache_elements",
    "mqa_cache_elements",
    "mla_cache_elements",
    "CacheSize",
    "cache_size_from_config",
    "cache_reduction",
    "DEEPSEEK_V2",
    "DEEPSEEK_67B",
    "CacheBytesRow",
    "cache_bytes_rows",
]

#: DeepSeek-V2 (236B), its attention as the paper's §3.1.2 gives it: 60 layers, hidden 5120,
#: n_h = 128 heads of d_h = 128, d_c = 512 (= 4·d_h), d_c' = 1536, d_h^R = 64 (= d_h/2); the field
#: names of its Hugging Face ``config.json``.
DEEPSEEK_V2 = {
    "num_hidden_layers": 60, "hidden_size": 5120, "num_attention_heads": 128, "num_key_value_heads": 128,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
}

#: DeepSeek 67B, the dense model DeepSeek-V2 is compared with: 95 layers, hidden 8192, 64 heads
#: (d_h = 128) and 8 key/value heads (grouped-query attention), as the DeepSeek LLM paper
#: (arXiv 2401.02954, Table 2) lists it.
DEEPSEEK_67B = {"num_hidden_layers": 95, "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8}


def _key_value(where: str, name: str, heads: object, head_dim: object) -> int:
    """``2 · heads · head_dim``, a key and a value per head, after checking both counts."""
    return 2 * _validate.integer(where, name, heads, minimum=1) * _validate.integer(where, "head_dim", head_dim,
                                                                                    minimum=1)


def mha_cache_elements(num_heads: int, head_dim: int) -> int:
    """Elements multi-head attention caches per token and layer: ``2 · n_h · d_h``.

    Args:
        num_heads: ``n_h``.
        head_dim: ``d_h``.

    Returns:
        the count (an int).

    Raises:
        TypeError, ValueError: an argument that is not a positive int.

    Example:
        >>> mha_cache_elements(128, 128)
        32768
    """
    return _key_value("mha_cache_elements", "num_heads", num_heads, head_dim)


def gqa_cache_elements(num_kv_heads: int, head_dim: int) -> int:
    """Elements grouped-query attention caches per token and layer: ``2 · n_kv · d_h``, :func:`mha_cache_elements`
    with only ``n_kv`` key/value heads (the paper's ``n_g`` groups); the same errors.

    Example:
        >>> gqa_cache_elements(8, 128)
        2048
    """
    return _key_value("gqa_cache_elements", "num_kv_heads", num_kv_heads, head_dim)


def mqa_cache_elements(head_dim: int) -> int:
    """Elements multi-query attention caches per token and layer: ``2 · d_h``, one key and one value shared by
    every head; the same errors as :func:`mha_cache_elements`.

    Example:
        >>> mqa_cache_elements(128)
        256
    """
    return _key_value("mqa_cache_elements", "num_kv_heads", 1, head_dim)


def mla_cache_elements(kv_lora_rank: int, qk_rope_head_dim: int) -> int:
    """Elements multi-head latent attention caches per token and layer: ``d_c + d_h^R``.

    Args:
        kv_lora_rank: ``d_c``, the latent's size.
        qk_rope_head_dim: ``d_h^R``, the rotary key's size.

    Returns:
        the count (an int).

    Raises:
        TypeError, ValueError: an argument that is not a positive int.

    Example:
        >>> mla_cache_elements(512, 64)                     # DeepSeek-V2: (9/2) · 128
        576
    """
    where = "mla_cache_elements"
    return _validate.integer(where, "kv_lora_rank", kv_lora_rank, minimum=1) + _validate.integer(
        where, "qk_rope_head_dim", qk_rope_head_dim, minimum=1)


@dataclasses.dataclass(frozen=True)
class CacheSize:
    """The cache of one model, per token: ``per_layer`` elements in each of ``num_layers`` layers.

    Args:
        kind: ``"MHA"``, ``"GQA"``, ``"MQA"`` or ``"MLA"``.
        per_layer: elements per token and layer.
        num_layers: ``l``.

    Raises:
        TypeError, ValueError: an unknown kind or counts that are not positive ints.

    Example:
        >>> size = CacheSize("MLA", 576, 60)
        >>> size.elements_per_token, size.bytes(1000, bits_per_element=16)
        (34560, 69120000.0)
    """

    kind: str
    per_layer: int
    num_layers: int

    def __post_init__(self) -> None:
        where = "CacheSize"
        if self.kind not in ("MHA", "GQA", "MQA", "MLA"):
            raise ValueError(f"{where}: kind must be 'MHA', 'GQA', 'MQA' or 'MLA', got {self.kind!r}")
        object.__setattr__(self, "per_layer", _validate.integer(where, "per_layer", self.per_layer, minimum=1))
        object.__setattr__(self, "num_layers", _validate.integer(where, "num_layers", self.num_layers, minimum=1))

    @property
    def elements_per_token(self) -> int:
        """All layers together: ``per_layer · num_layers``."""
        return self.per_layer * self.num_layers

    def bytes(self, num_tokens: int, *, batch: int = 1, bits_per_element: float = 16) -> float:
        """Bytes of the cache for ``batch`` sequences of ``num_tokens`` tokens.

        Args:
            num_tokens: tokens per sequence.
            batch: sequences.
            bits_per_element: 16 for bfloat16/float16, 32 for float32, or an average such as 6
                for a quantised cache.

        Returns:
            ``elements_per_token · num_tokens · batch · bits_per_element / 8`` (a float: averages of
            bits need not fill whole bytes).

        Raises:
            TypeError, ValueError: counts that are not positive ints, bits that are not positive.
        """
        where = "CacheSize.bytes"
        num_tokens = _validate.integer(where, "num_tokens", num_tokens, minimum=1)
        batch = _validate.integer(where, "batch", batch, minimum=1)
        bits = _validate.positive_finite(where, "bits_per_element", bits_per_element)
        return self.elements_per_token * num_tokens * batch * bits / 8


#: Where a config may say how many key/value heads it has, besides ``num_key_value_heads``: a name that contains one
#: of these and that :func:`cache_size_from_config` does not read is refused, not taken for multi-head attention.
KV_HEAD_MARKS = ("kv_head", "key_value", "multi_query", "query_group")
#: Falcon's config names (``RefinedWeb*``: its first checkpoints' own code).
FALCON_TYPES = ("falcon", "RefinedWeb", "RefinedWebModel")


def _kv_heads(where: str, config: Mapping[str, Any], heads: int, field: Callable[..., int]) -> int:
    """The key/value heads a config declares, in each of the ways Hugging Face's configs declare them."""
    if config.get("num_key_value_heads") is not None:                   # Llama, Mistral, Qwen, Gemma, ...
        return field("num_key_value_heads")
    falcon_names = ("new_decoder_architecture", "num_kv_heads", "n_head_kv")
    if config.get("model_type") in FALCON_TYPES or any(name in config for name in falcon_names):
        # FalconConfig: num_kv_heads (n_head_kv in the first checkpoints) under the new decoder
        # architecture (Falcon-40B) or without multi-query; one head with multi_query, its default (Falcon-7B).
        new = _validate.boolean(where, "new_decoder_architecture", config.get("new_decoder_architecture") or False)
        multi_query = _validate.boolean(where, "multi_query", config.get("multi_query", True))
        if new or not multi_query:
            return field("num_kv_heads" if "num_kv_heads" in config else "n_head_kv", heads)
        return 1
    if config.get("multi_query_attention"):                             # ChatGLM: groups of query heads
        return field("multi_query_group_num")
    if "multi_query" in config:                                         # GPT-BigCode (StarCoder)
        return 1 if _validate.boolean(where, "multi_query", config["multi_query"]) else heads
    unread = sorted(name for name, value in config.items() if any(mark in name for mark in KV_HEAD_MARKS)
                    and value not in (None, False) and name != "num_key_value_heads")
    if unread:
        raise ValueError(f"{where}: the config marks its key/value heads with {', '.join(unread)}, which this "
                         "function does not read; give num_key_value_heads")
    return heads


def cache_size_from_config(config: Mapping[str, Any] | Any) -> CacheSize:
    """The per-token cache of a model described by a Hugging Face config.

    MLA when the config has a ``kv_lora_rank`` (DeepSeek-V2/V3); otherwise a key and a value per
    key/value head: MHA when that is every head, MQA when it is one, GQA in between. The key/value
    heads are read where each family writes them: ``num_key_value_heads`` (most), Falcon's
    ``multi_query``, ``new_decoder_architecture`` and ``num_kv_heads`` (``n_head_kv``), ChatGLM's
    ``multi_query_group_num``, GPT-BigCode's ``multi_query``; with none of them, every head has its
    own, unless the config names its key/value heads some other way, which is refused. ``d_h`` is
    ``head_dim`` or ``hidden_size / num_attention_heads``; GPT-2's names (``n_layer``, ``n_head``,
    ``n_embd``) are read too. A full cache is assumed (no sliding window).

    Args:
        config: the parsed ``config.json``, or a ``transformers`` config (anything with ``to_dict()``).

    Returns:
        a :class:`CacheSize`.

    Raises:
        TypeError: ``config`` neither a mapping nor a config object, or a field of the wrong type.
        ValueError: a missing field (named), a hidden size not divisible by the heads, or key/value
            heads marked in a way this function does not read (named).

    Example:
        >>> cache_size_from_config(DEEPSEEK_V2)
        CacheSize(kind='MLA', per_layer=576, num_layers=60)
        >>> cache_size_from_config(DEEPSEEK_67B)
        CacheSize(kind='GQA', per_layer=2048, num_layers=95)
        >>> cache_size_from_config({"model_type": "falcon", "num_hidden_layers": 32, "hidden_size": 4544,
        ...                         "num_attention_heads": 71, "multi_query": True})     # Falcon-7B
        CacheSize(kind='MQA', per_layer=128, num_layers=32)
    """
    where = "cache_size_from_config"
    config = _validate.config_mapping(where, "config", config)

    def field(name: str, default: Any = None, *, alias: str | None = None) -> int:
        value = config.get(name, config.get(alias, default) if alias else default)
        if value is None:
            raise ValueError(f"{where}: the config lacks {name}")
        return _validate.integer(where, name, value, minimum=1)

    layers = field("num_hidden_layers", alias="n_layer")
    if config.get("kv_lora_rank") is not None:
        return CacheSize("MLA", field("kv_lora_rank") + field("qk_rope_head_dim"), layers)
    heads = field("num_attention_heads", alias="n_head")
    kv_heads = _kv_heads(where, config, heads, field)
    if config.get("head_dim") is not None:
        head_dim = field("head_dim")
    else:
        hidden = field("hidden_size", alias="n_embd")
        if hidden % heads:
            raise ValueError(f"{where}: hidden_size={hidden} is not divisible by num_attention_heads={heads}; "
                             "give head_dim")
        head_dim = hidden // heads
    kind = "MHA" if kv_heads == heads else "MQA" if kv_heads == 1 else "GQA"
    return CacheSize(kind, 2 * kv_heads * head_dim, layers)


def cache_reduction(model: CacheSize, baseline: CacheSize, *, bits: float = 16,
                    baseline_bits: float = 16) -> float:
    """How much smaller ``model``'s cache per token is than ``baseline``'s: ``1 - model / baseline``.

    Counted in bits, so that a quantised cache (``bits`` below 16) can be compared with a
    16-bit one; with equal bits it is the ratio of elements.

    Args:
        model, baseline: :class:`CacheSize` of the two models (all their layers).
        bits, baseline_bits: bits per cached element of each.

    Returns:
        the fraction saved (negative if ``model`` caches more).

    Raises:
        TypeError: a size that is not a :class:`CacheSize`, or bits that are not numbers.
        ValueError: bits that are not positive.

    Example:
        >>> v2, dense = cache_size_from_config(DEEPSEEK_V2), cache_size_from_config(DEEPSEEK_67B)
        >>> round(cache_reduction(v2, dense), 4), round(cache_reduction(v2, dense, bits=6), 4)
        (0.8224, 0.9334)
    """
    where = "cache_reduction"
    for name, value in (("model", model), ("baseline", baseline)):
        if not isinstance(value, CacheSize):
            raise TypeError(f"{where}: {name} must be a CacheSize, got {type(value).__name__}")
    bits = _validate.positive_finite(where, "bits", bits)
    baseline_bits = _validate.positive_finite(where, "baseline_bits", baseline_bits)
    return 1 - (model.elements_per_token * bits) / (baseline.elements_per_token * baseline_bits)


@dataclasses.dataclass(frozen=True)
class CacheBytesRow:
    """What one variant keeps per sequence to decode, from :func:`cache_bytes_rows` (one layer).

    Attributes:
        variant: ``"MHA"``, ``"GQA"``, ``"MQA"``, ``"MLA"``, ``"sliding window (MHA)"`` or ``"linear"``.
        elements_per_token: elements added per token (for the window, until it is full; 0 for linear).
        bytes_per_token: ``elements_per_token · bytes_per_element``.
        n: the sequence length of ``bytes_at_n``.
        bytes_at_n: bytes held for one sequence of ``n`` tokens.
        fixed: True when ``bytes_at_n`` stops growing with ``n`` (the window, linear attention).
        formula: how ``bytes_at_n`` is counted.
    """

    variant: str
    elements_per_token: int
    bytes_per_token: int
    n: int
    bytes_at_n: int
    fixed: bool
    formula: str


def cache_bytes_rows(n: int = 32768, *, heads: int = 8, head_dim: int = 64, kv_heads: int = 2,
                     kv_lora_rank: int = 256, qk_rope_head_dim: int = 32, window: int = 4096,
                     bytes_per_element: int = 2) -> list[CacheBytesRow]:
    """Bytes one layer keeps per sequence to decode, for each variant, in one small configuration.

    MHA, GQA, MQA and MLA per token as counted above; the sliding window keeps the last ``W - 1``
    tokens of MHA keys and values (a :class:`~attn_course.variants.sliding_window.RollingKVCache`),
    and linear attention a state ``S [d, d]`` and ``z [d]`` per head, whatever ``n``. A chapter shows
    the rows with :func:`attn_course.teaching.tables.table`.

    Args:
        n: tokens in the sequence.
        heads, head_dim: ``n_h`` and ``d_h``.
        kv_heads: ``n_kv`` for GQA (between 1 and ``heads``).
        kv_lora_rank, qk_rope_head_dim: MLA's ``d_c`` and ``d_h^R``.
        window: ``W`` of the sliding window.
        bytes_per_element: 2 for float16/bfloat16, 4 for float32.

    Returns:
        One :class:`CacheBytesRow` per variant: MHA, GQA, MQA, MLA, sliding window (MHA), linear.

    Raises:
        TypeError: a size that is not an int.
        ValueError: a size below 1, or ``kv_heads`` above ``heads``.

    Example:
        >>> rows = cache_bytes_rows(1000, heads=4, head_dim=8, kv_heads=2, kv_lora_rank=16,
        ...                         qk_rope_head_dim=4, window=10, bytes_per_element=2)
        >>> [(row.variant, row.bytes_at_n) for row in rows]
        [('MHA', 128000), ('GQA', 64000), ('MQA', 32000), ('MLA', 40000),
         ('sliding window (MHA)', 1152), ('linear', 576)]
    """
    where = "cache_bytes_rows"
    n, heads, head_dim, kv_heads, kv_lora_rank, qk_rope_head_dim, window, size = (
        _validate.integer(where, name, value, minimum=1) for name, value in (
            ("n", n), ("heads", heads), ("head_dim", head_dim), ("kv_heads", kv_heads),
            ("kv_lora_rank", kv_lora_rank), ("qk_rope_head_dim", qk_rope_head_dim), ("window", window),
            ("bytes_per_element", bytes_per_element)))
    if kv_heads > heads:
        raise ValueError(f"{where}: kv_heads must be at most heads, got kv_heads={kv_heads}, heads={heads}")
    mha = 2 * heads * head_dim
    growing = [("MHA", mha, "2·n_h·d_h·n"), ("GQA", 2 * kv_heads * head_dim, "2·n_kv·d_h·n"),
               ("MQA", 2 * head_dim, "2·d_h·n"), ("MLA", kv_lora_rank + qk_rope_head_dim, "(d_c + d_h^R)·n")]
    rows = [CacheBytesRow(name, elements, elements * size, n, elements * size * n, False, f"{formula} · bytes")
            for name, elements, formula in growing]
    rows.append(CacheBytesRow("sliding window (MHA)", mha, mha * size, n, mha * size * min(n, window - 1),
                              n >= window - 1, "2·n_h·d_h·min(n, W-1) · bytes"))
    linear_state = heads * (head_dim * head_dim + head_dim)
    rows.append(CacheBytesRow("linear", 0, 0, n, linear_state * size, True, "n_h·(d_h·d_h + d_h) · bytes"))
    return rows
