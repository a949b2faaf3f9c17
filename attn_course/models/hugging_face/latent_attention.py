"""Hugging Face DeepSeek-V2 attention (``DeepseekV2Attention``, ``transformers`` 5.24) into the course's
:class:`~attn_course.variants.latent_attention.MultiHeadLatentAttention`: the config, and the weights cut apart.

Hugging Face fuses what the paper keeps apart, so loading is a small cut rather than a renaming:

- ``q_proj`` / ``q_b_proj`` give each head ``[q_C (d_h) | q_R (d_R)]`` one head after another;
- ``kv_a_proj_with_mqa`` gives ``[c_KV before its norm (d_c) | k_R (d_R)]``;
- ``kv_b_proj`` gives each head ``[k_C (d_h) | v (d_v)]``.

Every expected name and shape is checked first, by
:func:`~attn_course.models.hugging_face.checkpoint.check_weights`, and all problems are listed together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from attn_course import _validate
from attn_course.models.hugging_face.checkpoint import check_weights
from attn_course.models.hugging_face.config import rope_from_hugging_face, rope_parameters
from attn_course.variants.latent_attention import MLAConfig

__all__ = ["MLA_ROPE_TYPES", "mla_config_from_hugging_face", "hugging_face_shapes", "from_hugging_face_weights"]

#: The rotary types a DeepSeek-V2 config may name here (``rope_parameters.rope_type``).
MLA_ROPE_TYPES = ("default", "yarn")


def mla_config_from_hugging_face(values: Mapping[str, Any] | Any) -> MLAConfig:
    """Read a DeepSeek-V2 ``config.json`` (or a ``transformers`` ``DeepseekV2Config``) into an :class:`MLAConfig`.

    Args:
        values: the parsed JSON, or a config object with ``to_dict()``. Read: ``hidden_size``,
            ``num_attention_heads``, ``kv_lora_rank``, ``q_lora_rank`` (may be null),
            ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim`` (all required),
            ``attention_bias``, ``num_key_value_heads`` (must equal the heads: MLA has no
            grouping), ``rope_interleave`` (DeepSeek-V3's; must be true), and the rotary settings,
            ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling``.

    Returns:
        the :class:`~attn_course.variants.latent_attention.MLAConfig`.

    Raises:
        TypeError: ``values`` neither a mapping nor a config object.
        ValueError: a missing field, grouped key/value heads, half-split rotary pairs
            (``rope_interleave`` false), or a rotary type other than ``"default"`` and ``"yarn"``; the
            field is named.

    Example:
        >>> config = mla_config_from_hugging_face({
        ...     "hidden_size": 5120, "num_attention_heads": 128, "kv_lora_rank": 512, "q_lora_rank": 1536,
        ...     "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        ...     "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32,
        ...     "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
        ...     "original_max_position_embeddings": 4096}})
        >>> round(config.score_temperature, 4), config.rope_scaling.attention_factor
        (1.5896, 1.0)
    """
    where = "mla_config_from_hugging_face"
    values = _validate.config_mapping(where, "values", values)
    required = ("hidden_size", "num_attention_heads", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                "qk_rope_head_dim", "v_head_dim")
    missing = [name for name in required if name not in values]
    if missing:
        raise ValueError(f"{where}: the config lacks {', '.join(missing)} (is it a DeepSeek-V2 config?)")
    heads = values["num_attention_heads"]
    kv_heads = values.get("num_key_value_heads")
    if kv_heads is not None and kv_heads != heads:
        raise ValueError(f"{where}: num_key_value_heads={kv_heads} differs from num_attention_heads={heads}; "
                         "MLA projects a key and a value for every head from the latent")
    interleave = values.get("rope_interleave", True)
    if interleave is not True:
        # DeepSeek-V3's configs may pair the two halves of the rotary features (rotate_half) instead of
        # neighbours: read as neighbours, every rotary score would be wrong without an error.
        raise ValueError(f"{where}: rope_interleave={interleave!r} is not supported; the course's MLA pairs "
                         "neighbouring rotary features (rope_interleave=true, DeepSeek-V2's and V3's default)")
    field, parameters, rope_type = rope_parameters(values, where=where)
    if rope_type not in MLA_ROPE_TYPES:
        raise ValueError(f"{where}: {field} rope_type={rope_type!r} is not supported; DeepSeek-V2's "
                         f"attention reads {' and '.join(repr(t) for t in MLA_ROPE_TYPES)}")
    base, scaling = rope_from_hugging_face(values, source="the DeepSeek-V2 config")
    temperature = 1.0
    mscale_all_dim = parameters.get("mscale_all_dim")
    if rope_type == "yarn" and mscale_all_dim:
        # Hugging Face's yarn_apply_mscale: the softmax scale grows with the context stretch.
        factor = scaling.factor
        temperature = (1.0 if factor <= 1 else 0.1 * mscale_all_dim * math.log(factor) + 1.0) ** 2
    return MLAConfig(values["hidden_size"], heads, kv_lora_rank=values["kv_lora_rank"],
                     qk_nope_head_dim=values["qk_nope_head_dim"], qk_rope_head_dim=values["qk_rope_head_dim"],
                     v_head_dim=values["v_head_dim"], q_lora_rank=values["q_lora_rank"], rope_base=base,
                     rope_scaling=scaling, score_temperature=temperature,
                     attention_bias=values.get("attention_bias", False))


def hugging_face_shapes(config: MLAConfig) -> dict[str, tuple[int, ...]]:
    """The names and shapes of a ``DeepseekV2Attention``'s weights for ``config``.

    Args:
        config: the layer's :class:`~attn_course.variants.latent_attention.MLAConfig`.

    Returns:
        ``{Hugging Face name: shape}``.

    Raises:
        TypeError: ``config`` not an :class:`MLAConfig`.

    Example:
        >>> config = MLAConfig(8, 2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2)
        >>> hugging_face_shapes(config)["kv_a_proj_with_mqa.weight"]                 # [d_c + d_R, E]
        (6, 8)
    """
    if not isinstance(config, MLAConfig):
        raise TypeError(f"hugging_face_shapes: config must be an MLAConfig, got {type(config).__name__}")
    c, heads = config, config.num_heads
    query_rows = heads * (c.qk_nope_head_dim + c.qk_rope_head_dim)
    shapes: dict[str, tuple[int, ...]] = {}
    if c.q_lora_rank is None:
        shapes["q_proj.weight"] = (query_rows, c.hidden_size)
    else:
        shapes["q_a_proj.weight"] = (c.q_lora_rank, c.hidden_size)
        if c.attention_bias:
            shapes["q_a_proj.bias"] = (c.q_lora_rank,)
        shapes["q_a_layernorm.weight"] = (c.q_lora_rank,)
        shapes["q_b_proj.weight"] = (query_rows, c.q_lora_rank)
    shapes["kv_a_proj_with_mqa.weight"] = (c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size)
    if c.attention_bias:
        shapes["kv_a_proj_with_mqa.bias"] = (c.kv_lora_rank + c.qk_rope_head_dim,)
    shapes["kv_a_layernorm.weight"] = (c.kv_lora_rank,)
    shapes["kv_b_proj.weight"] = (heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)
    shapes["o_proj.weight"] = (c.hidden_size, heads * c.v_head_dim)
    if c.attention_bias:
        shapes["o_proj.bias"] = (c.hidden_size,)
    return shapes


def from_hugging_face_weights(state: Mapping[str, torch.Tensor], config: MLAConfig, *,
                              prefix: str = "") -> dict[str, torch.Tensor]:
    """Hugging Face ``DeepseekV2Attention`` weights as a :class:`MultiHeadLatentAttention` state dict.

    Every expected name is looked up and its shape checked first, and all problems are listed
    together; then the fused matrices are cut apart: ``q_proj``/``q_b_proj`` per head into
    ``query_up`` (first ``d_h`` rows) and ``query_rope`` (last ``d_R``), ``kv_a_proj_with_mqa`` into
    ``kv_down`` (first ``d_c`` rows) and ``key_rope``, ``kv_b_proj`` per head into ``key_up`` and
    ``value_up``.

    Args:
        state: ``{name: tensor}``, e.g. ``DeepseekV2Attention.state_dict()`` or a whole model's.
        config: the layer's :class:`~attn_course.variants.latent_attention.MLAConfig`.
        prefix: what precedes the attention's names in ``state`` (``"model.layers.0.self_attn."``);
            names outside it are ignored, unknown names inside it are errors.

    Returns:
        ``{our name: tensor}`` for ``MultiHeadLatentAttention(config).load_state_dict``.

    Raises:
        TypeError: ``state`` not a mapping, ``config`` not an :class:`MLAConfig`, ``prefix`` not a str.
        ValueError: missing, unexpected, wrongly shaped or non-floating weights, all of them named.

    Example:
        >>> config = MLAConfig(8, 2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2)
        >>> theirs = {"q_proj.weight": torch.zeros(8, 8), "kv_a_proj_with_mqa.weight": torch.zeros(6, 8),
        ...           "kv_a_layernorm.weight": torch.ones(4), "kv_b_proj.weight": torch.zeros(8, 4),
        ...           "o_proj.weight": torch.zeros(8, 4)}
        >>> sorted(from_hugging_face_weights(theirs, config))[:3]
        ['key_rope.weight', 'key_up.weight', 'kv_down.weight']
        >>> from_hugging_face_weights({**theirs, "o_proj.weight": torch.zeros(8, 5)}, config)
        Traceback (most recent call last):
        ...
        ValueError: from_hugging_face_weights: ... wrong shape(s): o_proj.weight [8, 5] (expected [8, 4])
    """
    where = "from_hugging_face_weights"
    if not isinstance(state, Mapping):
        raise TypeError(f"{where}: state must be a mapping of names to tensors, got {type(state).__name__}")
    if not isinstance(config, MLAConfig):
        raise TypeError(f"{where}: config must be an MLAConfig, got {type(config).__name__}")
    if not isinstance(prefix, str):
        raise TypeError(f"{where}: prefix must be a str, got {type(prefix).__name__}")
    inside = {name: value for name, value in state.items() if name.startswith(prefix)}
    shapes = {prefix + name: shape for name, shape in hugging_face_shapes(config).items()}
    check_weights(inside, shapes, source="state", model="this MLAConfig", caller=where)
    ours = {name[len(prefix):]: value for name, value in inside.items()}

    c, heads = config, config.num_heads
    weights: dict[str, torch.Tensor] = {}
    if c.q_lora_rank is None:
        query = ours["q_proj.weight"]
    else:
        query = ours["q_b_proj.weight"]
        weights["query_down.weight"] = ours["q_a_proj.weight"]
        if c.attention_bias:
            weights["query_down.bias"] = ours["q_a_proj.bias"]
        weights["query_norm.weight"] = ours["q_a_layernorm.weight"]
    per_head = query.reshape(heads, c.qk_nope_head_dim + c.qk_rope_head_dim, -1)          # [H, d_h + d_R, d_in]
    weights["query_up.weight"] = per_head[:, : c.qk_nope_head_dim].reshape(-1, query.shape[1])
    weights["query_rope.weight"] = per_head[:, c.qk_nope_head_dim:].reshape(-1, query.shape[1])
    down = ours["kv_a_proj_with_mqa.weight"]                                                  # [d_c + d_R, E]
    weights["kv_down.weight"], weights["key_rope.weight"] = down[: c.kv_lora_rank], down[c.kv_lora_rank:]
    if c.attention_bias:
        bias = ours["kv_a_proj_with_mqa.bias"]
        weights["kv_down.bias"], weights["key_rope.bias"] = bias[: c.kv_lora_rank], bias[c.kv_lora_rank:]
    weights["kv_norm.weight"] = ours["kv_a_layernorm.weight"]
    up = ours["kv_b_proj.weight"].reshape(heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
    weights["key_up.weight"] = up[:, : c.qk_nope_head_dim].reshape(-1, c.kv_lora_rank)      # [H·d_h, d_c]
    weights["value_up.weight"] = up[:, c.qk_nope_head_dim:].reshape(-1, c.kv_lora_rank)     # [H·d_v, d_c]
    weights["out_proj.weight"] = ours["o_proj.weight"]
    if c.attention_bias:
        weights["out_proj.bias"] = ours["o_proj.bias"]
    return {name: tensor.clone() for name, tensor in weights.items()}
