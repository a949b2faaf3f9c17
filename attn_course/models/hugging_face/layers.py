"""One Hugging Face attention layer into the course's module, with its weights: :func:`convert_layer`.

Chapter 12 checks each open model's attention against Hugging Face's own module. What each layer computes is
read from the config, as Hugging Face's model reads it (``transformers`` 5.25, ``modeling_*.py``):

- ``LlamaAttention``: grouped-query attention with RoPE (default, linear, dynamic, YaRN or llama3 scaling);
- ``MistralAttention``: and a window of ``sliding_window`` keys on every layer;
- ``Qwen3Attention``: and RMSNorm on each head's query and key, a window on the layers ``layer_types`` marks;
- ``Gemma3Attention``: Gemma's RMSNorm (``1 + w``) on queries and keys, the scale ``query_pre_attn_scalar ** -0.5``,
  and the RoPE of each layer type (``rope_local_base_freq`` on sliding layers);
- ``GptOssAttention``: a learned sink per head, biases, YaRN, sliding and full layers;
- ``Qwen3NextAttention`` (its softmax layers): Gemma's QK-norm, an output gate, RoPE on the first features only;
- ``DeepseekV2Attention``, ``DeepseekV3Attention``: latent attention, read by
  :mod:`~attn_course.models.hugging_face.latent_attention`.

A layer with ``layer_types[i] == "sliding_attention"`` sees its last ``sliding_window`` keys, itself included.
Qwen3-Next's fused ``q_proj`` gives each head ``[query (d) | gate (d)]``; it is cut into ``q_proj`` and
``gate_proj``. Every other weight keeps its name; every name and shape is checked first, all problems listed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from attn_course import _validate
from attn_course.models.decoder_attention import QK_NORMS, DecoderAttention, DecoderAttentionConfig
from attn_course.models.hugging_face.checkpoint import check_weights
from attn_course.models.hugging_face.config import rope_from_hugging_face, rope_parameters
from attn_course.models.hugging_face.gated_deltanet import LINEAR_ATTENTIONS, gated_deltanet_from_hugging_face
from attn_course.models.hugging_face.latent_attention import from_hugging_face_weights, mla_config_from_hugging_face
from attn_course.models.hugging_face.sparse_attention import SPARSE_ATTENTIONS, sparse_attention_from_hugging_face
from attn_course.variants.gated_deltanet import GatedDeltaNet
from attn_course.variants.latent_attention import MultiHeadLatentAttention
from attn_course.variants.sparse_attention import SparseLatentAttention

__all__ = ["Architecture", "ARCHITECTURES", "LATENT_ATTENTIONS", "READS",
           "decoder_config_from_hugging_face", "convert_layer"]


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What one Hugging Face attention class computes beyond plain grouped-query attention with RoPE.

    Args:
        model: the model's name, for messages.
        qk_norm: a key of :data:`~attn_course.models.decoder_attention.QK_NORMS`.
        window: which layers slide: ``"none"``, ``"every layer"`` (Mistral) or ``"layer types"``.
        sinks, output_gate: learned sinks (gpt-oss), an output gate (Qwen3-Next).
        partial_rotary: whether ``partial_rotary_factor`` below 1 is read (Qwen3-Next) or refused.
        scale_from: ``"head_dim"`` (``d ** -0.5``) or ``"query_pre_attn_scalar"`` (Gemma 3).

    Raises:
        TypeError, ValueError: a field of the wrong kind or an unknown rule.

    Example:
        >>> Architecture("Mistral", window="every layer").window
        'every layer'
    """

    model: str
    qk_norm: str | None = None
    window: str = "none"
    sinks: bool = False
    output_gate: bool = False
    partial_rotary: bool = False
    scale_from: str = "head_dim"

    def __post_init__(self) -> None:
        where = "Architecture"
        if not isinstance(self.model, str):
            raise TypeError(f"{where}: model must be a str, got {type(self.model).__name__}")
        for name, allowed in (("qk_norm", tuple(QK_NORMS)), ("window", ("none", "every layer", "layer types")),
                              ("scale_from", ("head_dim", "query_pre_attn_scalar"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{where}: {name} must be one of {', '.join(map(repr, allowed))}, "
                                 f"got {getattr(self, name)!r}")
        for name in ("sinks", "output_gate", "partial_rotary"):
            _validate.boolean(where, name, getattr(self, name))


#: The attention classes :func:`convert_layer` reads into a :class:`DecoderAttention`, by class name.
ARCHITECTURES = {
    "LlamaAttention": Architecture("Llama"),
    "MistralAttention": Architecture("Mistral", window="every layer"),
    "Qwen3Attention": Architecture("Qwen3", qk_norm="rms", window="layer types"),
    "Gemma3Attention": Architecture("Gemma 3", qk_norm="gemma", window="layer types",
                                    scale_from="query_pre_attn_scalar"),
    "GptOssAttention": Architecture("gpt-oss", window="layer types", sinks=True),
    "Qwen3NextAttention": Architecture("Qwen3-Next", qk_norm="gemma", output_gate=True, partial_rotary=True),
}
#: The latent attentions, read into :class:`~attn_course.variants.latent_attention.MultiHeadLatentAttention`.
LATENT_ATTENTIONS = ("DeepseekV2Attention", "DeepseekV3Attention")

#: Every module class :func:`convert_layer` reads.
READS = (*ARCHITECTURES, *LATENT_ATTENTIONS, *LINEAR_ATTENTIONS, *SPARSE_ATTENTIONS)

_SOFTMAX_LAYER_TYPES = ("full_attention", "sliding_attention")


def decoder_config_from_hugging_face(values: Mapping[str, Any] | Any, module_type: str,
                                     layer_idx: int) -> DecoderAttentionConfig:
    """The :class:`DecoderAttentionConfig` of layer ``layer_idx`` of a Hugging Face model.

    Args:
        values: the parsed ``config.json``, or a ``transformers`` config (Gemma 3: its text config).
        module_type: the attention's class name, a key of :data:`ARCHITECTURES`.
        layer_idx: the layer's index, which picks its entry of ``layer_types`` (window and Gemma 3's RoPE).

    Returns:
        the layer's config.

    Raises:
        TypeError: ``values`` not a mapping or config, ``module_type`` not a str, ``layer_idx`` not an int.
        ValueError: an unknown ``module_type``, a missing field, a layer index outside ``layer_types``, a layer
            type that is no softmax attention, or a setting this module does not reproduce (each named).

    Example:
        >>> values = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        ...           "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
        ...           "rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}}
        >>> [decoder_config_from_hugging_face(values, "GptOssAttention", i).window for i in (0, 1)]
        [8, None]
    """
    where = "decoder_config_from_hugging_face"
    values = _validate.config_mapping(where, "values", values)
    if not isinstance(module_type, str):
        raise TypeError(f"{where}: module_type must be a str (a class name), got {type(module_type).__name__}")
    if module_type not in ARCHITECTURES:
        raise ValueError(f"{where}: module_type={module_type!r} is not one this course reads; it reads "
                         f"{', '.join(ARCHITECTURES)}")
    layer_idx = _validate.integer(where, "layer_idx", layer_idx, minimum=0)
    arch = ARCHITECTURES[module_type]
    missing = [name for name in ("hidden_size", "num_attention_heads") if values.get(name) is None]
    if missing:
        hint = " (for Gemma 3, pass the text config: config.text_config)" if "text_config" in values else ""
        raise ValueError(f"{where}: the config lacks {', '.join(missing)}{hint}")
    heads = values["num_attention_heads"]
    head_dim = values.get("head_dim") or values["hidden_size"] // heads
    layer_type = _layer_type(values, layer_idx, arch, where)
    _refuse_unreproduced(values, arch, where)
    base, scaling, fraction = _rope(values, layer_type, arch, where)
    window = None
    if arch.window == "every layer" or (arch.window == "layer types" and layer_type == "sliding_attention"):
        window = _sliding_window(values)
    scale = None if arch.scale_from == "head_dim" else values["query_pre_attn_scalar"] ** -0.5
    return DecoderAttentionConfig(
        values["hidden_size"], heads, values.get("num_key_value_heads") or heads, head_dim, scale=scale,
        window=window, qk_norm=arch.qk_norm, norm_eps=values.get("rms_norm_eps", 1e-6), sinks=arch.sinks,
        output_gate=arch.output_gate, bias=bool(values.get("attention_bias", False)), rope_base=base,
        rope_scaling=scaling, rotary_fraction=fraction)


def convert_layer(hf_module: nn.Module, config: Mapping[str, Any] | Any
                  ) -> DecoderAttention | MultiHeadLatentAttention | GatedDeltaNet | SparseLatentAttention:
    """The course's module holding a Hugging Face attention layer's weights, computing what it computes.

    ``convert_layer(layer.self_attn, config)(x)`` is ``(output [B, N, E], weights [B, H, N, N])`` of causal
    self-attention over positions ``0 .. N-1`` of ``x [B, N, E]``, as that layer computes it inside the
    model (in evaluation mode: no dropout); for Qwen3-Next's linear layer (``layer.linear_attn``) it is
    ``(output [B, N, E], state [B, h_v, d_k, d_v])``. The module comes in the Hugging Face module's dtype and
    device.

    Args:
        hf_module: a ``transformers`` attention module: a class of :data:`ARCHITECTURES` (into a
            :class:`~attn_course.models.decoder_attention.DecoderAttention`) or of :data:`LATENT_ATTENTIONS`
            (into a :class:`~attn_course.variants.latent_attention.MultiHeadLatentAttention`) or of
            :data:`~attn_course.models.hugging_face.gated_deltanet.LINEAR_ATTENTIONS` (into a
            :class:`~attn_course.variants.gated_deltanet.GatedDeltaNet`) or of
            :data:`~attn_course.models.hugging_face.sparse_attention.SPARSE_ATTENTIONS` (DeepSeek-V3.2, into a
            :class:`~attn_course.variants.sparse_attention.SparseLatentAttention`).
        config: the model's config (Gemma 3: its text config), or the parsed ``config.json``.

    Returns:
        the course's module, its weights copied.

    Raises:
        TypeError: ``hf_module`` not a ``torch.nn.Module``, or ``config`` neither a mapping nor a config.
        ValueError: a module class it does not know (``Qwen3NextSparseMoeBlock``, ...), a setting it does not
            reproduce (``longrope``, Gemma 3's bidirectional attention or ``attn_logit_softcapping``, a module in
            training mode with dropout), or weights whose names or shapes do not fit the config: each named.

    Example:
        >>> from transformers import Qwen3Config
        >>> from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention
        >>> config = Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        >>> ours = convert_layer(Qwen3Attention(config, layer_idx=0), config)
        >>> ours.config.qk_norm, ours.config.num_kv_heads, ours(torch.randn(1, 5, 64))[0].shape
        ('rms', 2, torch.Size([1, 5, 64]))
        >>> convert_layer(torch.nn.Linear(64, 64), config)
        Traceback (most recent call last):
        ...
        ValueError: convert_layer: a Linear is not an attention module this course reads; it reads ...
    """
    where = "convert_layer"
    _validate.instance(where, "hf_module", hf_module, nn.Module)
    values = _validate.config_mapping(where, "config", config)
    module_type = type(hf_module).__name__
    if module_type not in READS:
        raise ValueError(f"{where}: a {module_type} is not an attention module this course reads; it reads "
                         f"{', '.join(READS)}")
    if hf_module.training and values.get("attention_dropout", 0.0):
        raise ValueError(f"{where}: the {module_type} is in training mode with attention_dropout="
                         f"{values['attention_dropout']}; the course's module has no dropout: call .eval() first")
    if module_type in LINEAR_ATTENTIONS:
        return gated_deltanet_from_hugging_face(hf_module, values, where)
    if module_type in SPARSE_ATTENTIONS:
        return sparse_attention_from_hugging_face(hf_module, values, where)
    state = hf_module.state_dict()
    if module_type in LATENT_ATTENTIONS:
        latent = mla_config_from_hugging_face(values)
        weights = from_hugging_face_weights(state, latent)                   # every name and shape checked
        return _loaded(MultiHeadLatentAttention(latent), weights)
    layer_idx = getattr(hf_module, "layer_idx", None)
    if layer_idx is None:
        raise ValueError(f"{where}: the {module_type} has no layer_idx, which picks its layer type")
    attention = decoder_config_from_hugging_face(values, module_type, layer_idx)
    _check_module_agrees(hf_module, attention, where)
    check_weights(state, _hugging_face_shapes(attention), source=f"the {module_type} (layer {layer_idx})",
                  model=f"the config's layer {layer_idx}", caller=where)
    return _loaded(DecoderAttention(attention), _our_weights(state, attention))


def _loaded(module: nn.Module, weights: Mapping[str, torch.Tensor]) -> nn.Module:
    """``module`` in the weights' dtype and device, holding them, in evaluation mode."""
    some = next(iter(weights.values()))
    module.to(device=some.device, dtype=some.dtype).load_state_dict(weights)
    return module.eval()


def _sliding_window(values: Mapping[str, Any]) -> int | None:
    """The window of the sliding layers: ``sliding_window``, unless Qwen3's ``use_sliding_window`` is false."""
    return None if values.get("use_sliding_window") is False else values.get("sliding_window")


def _layer_type(values: Mapping[str, Any], layer_idx: int, arch: Architecture, where: str) -> str | None:
    """``layer_types[layer_idx]`` (None without ``layer_types``), which must be a softmax attention."""
    layer_types = values.get("layer_types")
    if layer_types is None:
        if arch.window == "layer types" and _sliding_window(values) is not None:
            # transformers derives them from other fields (max_window_layers, sliding_window_pattern) as it
            # builds its config object; a config.json without them leaves which layers slide unsaid here.
            raise ValueError(f"{where}: the {arch.model} config has sliding_window={values['sliding_window']} "
                             "but no layer_types saying which layers slide; pass the transformers config object")
        return None
    if layer_idx >= len(layer_types):
        raise ValueError(f"{where}: layer_idx={layer_idx} is outside layer_types ({len(layer_types)} layers)")
    layer_type = layer_types[layer_idx]
    if layer_type not in _SOFTMAX_LAYER_TYPES:
        raise ValueError(f"{where}: layer_types[{layer_idx}]={layer_type!r} is not supported; the course's "
                         f"decoder attention is {' or '.join(map(repr, _SOFTMAX_LAYER_TYPES))}")
    return layer_type


def _refuse_unreproduced(values: Mapping[str, Any], arch: Architecture, where: str) -> None:
    """Settings that would change what the layer computes and that the course's module does not do."""
    if values.get("use_bidirectional_attention"):
        raise ValueError(f"{where}: use_bidirectional_attention=True is not supported ({arch.model}); the "
                         "course's decoder attention is causal")
    if arch.scale_from == "query_pre_attn_scalar" and values.get("attn_logit_softcapping") is not None:
        # transformers 5.25's Gemma3Attention stores it but never passes it to its attention: a capped and an
        # uncapped reading would each disagree with one of the config and Hugging Face, so neither is chosen.
        raise ValueError(f"{where}: attn_logit_softcapping={values['attn_logit_softcapping']!r} is not "
                         f"supported ({arch.model}: Hugging Face's Gemma3Attention does not apply it)")
    if arch.scale_from == "query_pre_attn_scalar" and values.get("query_pre_attn_scalar") is None:
        raise ValueError(f"{where}: the config lacks query_pre_attn_scalar ({arch.model}'s score scale)")


def _rope(values: Mapping[str, Any], layer_type: str | None, arch: Architecture, where: str) -> tuple:
    """``(base, scaling, rotary_fraction)`` of the layer: its layer type's parameters where the config keeps
    one set per type (Gemma 3: ``rope_local_base_freq`` became ``rope_parameters["sliding_attention"]``)."""
    field, parameters, _ = rope_parameters(values, where=where)
    if layer_type is not None and isinstance(parameters.get(layer_type), Mapping):
        parameters = parameters[layer_type]
    fraction = parameters.get("partial_rotary_factor", values.get("partial_rotary_factor", 1.0))
    if fraction != 1.0 and not arch.partial_rotary:
        raise ValueError(f"{where}: partial_rotary_factor={fraction!r} is not supported for {arch.model}, whose "
                         "attention rotates every feature of a head")
    # The fraction is the rotary module's business, not the frequencies': read the rest as a whole-head RoPE.
    whole = {name: value for name, value in parameters.items() if name != "partial_rotary_factor"}
    base, scaling = rope_from_hugging_face({**values, field: whole, "partial_rotary_factor": 1.0},
                                           source=f"the {arch.model} config")
    return base, scaling, fraction


def _check_module_agrees(hf_module: nn.Module, config: DecoderAttentionConfig, where: str) -> None:
    """The module's own head size, scale and window, where it keeps them, must be the config's."""
    expected = {"head_dim": config.head_dim, "scaling": config.softmax_scale}
    if hasattr(hf_module, "sliding_window"):                                  # Qwen3, Gemma 3, gpt-oss
        expected["sliding_window"] = config.window
    for name, value in expected.items():
        theirs = getattr(hf_module, name, value)
        if theirs != value and not (isinstance(value, float) and abs(theirs - value) <= 1e-12 * value):
            raise ValueError(f"{where}: the {type(hf_module).__name__} has {name}={theirs!r} but the config "
                             f"gives {value!r}: was it built from another config?")


def _hugging_face_shapes(c: DecoderAttentionConfig) -> dict[str, tuple[int, ...]]:
    """``{Hugging Face name: shape}`` of the layer's weights."""
    query_rows = c.num_heads * c.head_dim * (2 if c.output_gate else 1)   # Qwen3-Next: query and gate, fused
    rows = {"q_proj": query_rows, "k_proj": c.num_kv_heads * c.head_dim, "v_proj": c.num_kv_heads * c.head_dim}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, out in rows.items():
        shapes[f"{name}.weight"] = (out, c.hidden_size)
        if c.bias:
            shapes[f"{name}.bias"] = (out,)
    shapes["o_proj.weight"] = (c.hidden_size, c.num_heads * c.head_dim)
    if c.bias:
        shapes["o_proj.bias"] = (c.hidden_size,)
    if c.qk_norm is not None:
        shapes["q_norm.weight"] = shapes["k_norm.weight"] = (c.head_dim,)
    if c.sinks:
        shapes["sinks"] = (c.num_heads,)
    return shapes


def _our_weights(state: Mapping[str, torch.Tensor], c: DecoderAttentionConfig) -> dict[str, torch.Tensor]:
    """Hugging Face's weights under the course's names: the same, but Qwen3-Next's ``q_proj`` cut in two."""
    ours = {name: state[name] for name in _hugging_face_shapes(c)}
    for kind in ("q", "k") if c.qk_norm is not None else ():
        ours[f"{kind}_proj.norm.weight"] = ours.pop(f"{kind}_norm.weight")       # the norm inside the projection
    if c.output_gate:
        for kind in ("weight", "bias") if c.bias else ("weight",):
            fused = ours.pop(f"q_proj.{kind}")                                    # [H·2d, E] or [H·2d]
            per_head = fused.reshape(c.num_heads, 2 * c.head_dim, *fused.shape[1:])   # [H, 2d, ...]: [q | gate]
            ours[f"q_proj.{kind}"] = per_head[:, : c.head_dim].reshape(-1, *fused.shape[1:])
            ours[f"gate_proj.{kind}"] = per_head[:, c.head_dim :].reshape(-1, *fused.shape[1:])
    return {name: tensor.detach().clone() for name, tensor in ours.items()}
