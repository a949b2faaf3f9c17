"""Qwen3-Next's linear-attention layer (``Qwen3NextGatedDeltaNet``) read into the course's
:class:`~attn_course.variants.gated_deltanet.GatedDeltaNet`.

Hugging Face fuses the projections by key head: ``in_proj_qkvz`` holds, for each of the ``h_k`` key heads in
turn, its query (``d_k`` rows), its key (``d_k``), then the values and the output gates of the ``r = h_v / h_k``
value heads it serves (``r·d_v`` rows each); ``in_proj_ba`` holds, per key head, the ``r`` rows of ``β`` then
the ``r`` of the decay's input. :func:`gated_deltanet_from_hugging_face` cuts them apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from attn_course.models.hugging_face.checkpoint import check_weights
from attn_course.variants.gated_deltanet import GatedDeltaNet, GatedDeltaNetConfig

__all__ = ["LINEAR_ATTENTIONS", "gated_deltanet_config", "gated_deltanet_from_hugging_face"]

#: The linear-attention classes :func:`~attn_course.models.hugging_face.layers.convert_layer` reads.
LINEAR_ATTENTIONS = ("Qwen3NextGatedDeltaNet",)


def gated_deltanet_config(values: Mapping[str, Any], where: str) -> GatedDeltaNetConfig:
    """The layer's :class:`GatedDeltaNetConfig` from a Qwen3-Next config (``linear_*`` fields)."""
    if values.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: Qwen3-Next's linear layer applies silu after its convolution; the config's "
                         f"hidden_act={values['hidden_act']!r} is not what the course's layer reproduces")
    missing = [name for name in ("hidden_size", "linear_num_key_heads", "linear_num_value_heads",
                                 "linear_key_head_dim", "linear_value_head_dim") if values.get(name) is None]
    if missing:
        raise ValueError(f"{where}: the config lacks {', '.join(missing)}, which a Gated DeltaNet layer needs")
    return GatedDeltaNetConfig(values["hidden_size"], values["linear_num_key_heads"], values["linear_num_value_heads"],
                               values["linear_key_head_dim"], values["linear_value_head_dim"],
                               conv_kernel=values.get("linear_conv_kernel_dim", 4),
                               norm_eps=values.get("rms_norm_eps", 1e-6))


def gated_deltanet_from_hugging_face(hf_module: nn.Module, values: Mapping[str, Any],
                                     where: str = "convert_layer") -> GatedDeltaNet:
    """A :class:`GatedDeltaNet` holding ``hf_module``'s weights, every name and shape checked first."""
    c = gated_deltanet_config(values, where)
    groups, channels = c.num_value_heads // c.num_key_heads, 2 * c.key_dim + c.value_dim
    state = hf_module.state_dict()
    check_weights(state, {"in_proj_qkvz.weight": (2 * c.key_dim + 2 * c.value_dim, c.hidden_size),
                          "in_proj_ba.weight": (2 * c.num_value_heads, c.hidden_size),
                          "conv1d.weight": (channels, 1, c.conv_kernel), "A_log": (c.num_value_heads,),
                          "dt_bias": (c.num_value_heads,), "norm.weight": (c.value_head_dim,),
                          "out_proj.weight": (c.hidden_size, c.value_dim)},
                  source=f"the {type(hf_module).__name__}", model="the config's linear layer", caller=where)
    by_key_head = state["in_proj_qkvz.weight"].unflatten(0, (c.num_key_heads, -1))   # [h_k, 2 d_k + 2 r d_v, E]
    q, k, v, z = by_key_head.split((c.key_head_dim, c.key_head_dim, groups * c.value_head_dim,
                                    groups * c.value_head_dim), dim=1)
    b, a = state["in_proj_ba.weight"].unflatten(0, (c.num_key_heads, -1)).split((groups, groups), dim=1)
    weights = {"q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v, "z_proj.weight": z,
               "b_proj.weight": b, "a_proj.weight": a}
    weights = {name: w.flatten(0, 1) for name, w in weights.items()}
    weights.update({"conv.weight": state["conv1d.weight"], "A_log": state["A_log"], "dt_bias": state["dt_bias"],
                    "norm_weight": state["norm.weight"], "o_proj.weight": state["out_proj.weight"]})
    layer = GatedDeltaNet(c).to(device=state["A_log"].device, dtype=state["out_proj.weight"].dtype)
    layer.load_state_dict({name: torch.as_tensor(w) for name, w in weights.items()})
    return layer.eval()
