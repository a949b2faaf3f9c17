"""DeepSeek-V3.2's attention (``DeepseekV32Attention``) read into the course's
:class:`~attn_course.variants.sparse_attention.SparseLatentAttention`: the latent attention's weights as for
DeepSeek-V2/V3 (:mod:`~attn_course.models.hugging_face.latent_attention`), the indexer's beside them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from attn_course.models.hugging_face.checkpoint import check_weights
from attn_course.models.hugging_face.latent_attention import from_hugging_face_weights, mla_config_from_hugging_face
from attn_course.variants.sparse_attention import IndexerConfig, SparseLatentAttention

__all__ = ["SPARSE_ATTENTIONS", "sparse_attention_from_hugging_face"]

#: The sparse attentions :func:`~attn_course.models.hugging_face.layers.convert_layer` reads.
SPARSE_ATTENTIONS = ("DeepseekV32Attention",)
#: Hugging Face's indexer names -> the course's.
INDEXER_NAMES = {"wq_b.weight": "query_up.weight", "wk.weight": "key_proj.weight", "k_norm.weight": "key_norm.weight",
                 "k_norm.bias": "key_norm.bias", "weights_proj.weight": "head_weights.weight"}


def sparse_attention_from_hugging_face(hf_module: nn.Module, values: Mapping[str, Any],
                                       where: str = "convert_layer") -> SparseLatentAttention:
    """A :class:`SparseLatentAttention` holding ``hf_module``'s weights, every name and shape checked first."""
    latent = mla_config_from_hugging_face(values)
    missing = [name for name in ("index_n_heads", "index_head_dim", "index_topk") if values.get(name) is None]
    if missing:
        raise ValueError(f"{where}: the config lacks {', '.join(missing)}, which DeepSeek-V3.2's indexer needs")
    indexer = IndexerConfig(latent.hidden_size, latent.q_lora_rank, values["index_n_heads"], values["index_head_dim"],
                            latent.qk_rope_head_dim, values["index_topk"], rope_base=latent.rope_base,
                            rope_scaling=latent.rope_scaling)
    state = hf_module.state_dict()
    attention = {name: value for name, value in state.items() if not name.startswith("indexer.")}
    theirs = {name.removeprefix("indexer."): value for name, value in state.items() if name.startswith("indexer.")}
    d = indexer.head_dim
    check_weights(theirs, {"wq_b.weight": (indexer.num_heads * d, indexer.query_input),
                           "wk.weight": (d, latent.hidden_size), "k_norm.weight": (d,), "k_norm.bias": (d,),
                           "weights_proj.weight": (indexer.num_heads, latent.hidden_size)},
                  source=f"the {type(hf_module).__name__}'s indexer", model="the config", caller=where)
    layer = SparseLatentAttention(latent, indexer)
    some = state["o_proj.weight"]
    layer.to(device=some.device, dtype=some.dtype)
    layer.attention.load_state_dict(from_hugging_face_weights(attention, latent))
    layer.indexer.load_state_dict({INDEXER_NAMES[name]: torch.as_tensor(value) for name, value in theirs.items()})
    return layer.eval()
