"""Hugging Face Llama, Mistral and Qwen3 checkpoints: our parameter names to theirs (:data:`NAMES`), and tied heads.

Mistral's weights have Llama's names and shapes; Qwen3's add each layer's ``self_attn.q_norm`` and
``self_attn.k_norm`` (ours: the norm inside ``attention.q_proj`` and ``attention.k_proj``) and, with
``attention_bias``, the projections' biases. A bare ``LlamaModel`` checkpoint has no ``model.``
prefix; old checkpoints store ``rotary_emb.inv_freq`` buffers (not read: the frequencies come from the
config); with tied embeddings Hugging Face leaves ``lm_head.weight`` out.

Example:
    >>> hugging_face_name("model.blocks.3.feed_forward.gate.weight")
    'model.layers.3.mlp.gate_proj.weight'
    >>> hugging_face_name("model.final_norm.weight")
    'model.norm.weight'
    >>> hugging_face_name("model.blocks.0.attention.k_proj.norm.weight")              # Qwen3's QK-norm
    'model.layers.0.self_attn.k_norm.weight'
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from attn_course import _validate
from attn_course.models.hugging_face.checkpoint import NameMap, match_hugging_face

__all__ = ["NAMES", "hugging_face_name", "match_llama"]

#: Our parameter names to Hugging Face's (biases only on the attention's projections, Qwen3's ``attention_bias``):
#: outside the blocks, then each decoder block's modules, for
#: :func:`~attn_course.models.hugging_face.checkpoint.match_hugging_face`.
NAMES = NameMap(
    "LlamaForCausalLM",
    top={"model.embedding": "model.embed_tokens", "model.final_norm": "model.norm", "lm_head": "lm_head"},
    layer={"attention_norm": "input_layernorm", "attention.q_proj": "self_attn.q_proj",
           "attention.k_proj": "self_attn.k_proj", "attention.v_proj": "self_attn.v_proj",
           "attention.out_proj": "self_attn.o_proj", "attention.q_proj.norm": "self_attn.q_norm",
           "attention.k_proj.norm": "self_attn.k_norm", "feed_forward_norm": "post_attention_layernorm",
           "feed_forward.gate": "mlp.gate_proj", "feed_forward.up": "mlp.up_proj",
           "feed_forward.down": "mlp.down_proj"},
    ours_layers="model.blocks", theirs_layers="model.layers", parameters=("weight", "bias"))

#: ``hugging_face_name(name)``: the Hugging Face name of a ``LlamaForCausalLM`` parameter (example above).
hugging_face_name = NAMES.hugging_face_name


def match_llama(
    stored: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    *,
    tied: bool,
    source: str,
    caller: str = "match_llama",
) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face Llama, Mistral or Qwen3 checkpoint's tensors to our names, checking every name and shape.

    Accepted beside the exact names: a bare ``LlamaModel`` checkpoint (names without the
    ``model.`` prefix), the ``rotary_emb.inv_freq`` buffers that old checkpoints stored (ignored:
    the frequencies come from the config), and with tied embeddings an ``lm_head.weight`` equal to
    the embedding matrix (Hugging Face leaves it out; equal, it says nothing new).

    Args:
        stored, expected, source, caller: as in
            :func:`~attn_course.models.hugging_face.checkpoint.match_hugging_face`; ``expected`` is
            ``LlamaForCausalLM.state_dict()``.
        tied: whether the config ties the LM head to the embedding (then ``lm_head.weight`` is not read).

    Returns:
        ``{our name: stored tensor}``, every parameter but ``lm_head.weight`` when tied.

    Raises:
        TypeError: ``tied`` not a bool.
        ValueError: what :func:`~attn_course.models.hugging_face.checkpoint.check_weights` finds, and an
            ``lm_head.weight`` that differs from the embedding of a tied model; all of them listed.

    Example:
        >>> expected = {"model.final_norm.weight": torch.ones(4)}
        >>> match_llama({"model.norm.weight": torch.zeros(4)}, expected, tied=False, source="file")
        {'model.final_norm.weight': tensor([0., 0., 0., 0.])}
    """
    tied = _validate.boolean(caller, "tied", tied)
    if not any(name.startswith("model.") for name in stored) and "embed_tokens.weight" in stored:
        stored = {f"model.{name}": tensor for name, tensor in stored.items()}   # a bare LlamaModel
    stored = {name: tensor for name, tensor in stored.items() if not name.endswith("rotary_emb.inv_freq")}
    problems = []
    if tied:
        expected = {ours: tensor for ours, tensor in expected.items() if ours != "lm_head.weight"}
        if "lm_head.weight" in stored:
            embedding = stored.get("model.embed_tokens.weight")
            if embedding is None or not torch.equal(stored["lm_head.weight"], embedding):
                problems.append("tie_word_embeddings is true but lm_head.weight differs from "
                                "model.embed_tokens.weight")
            stored = {name: tensor for name, tensor in stored.items() if name != "lm_head.weight"}
    return match_hugging_face(stored, expected, NAMES, source=source, model="this LlamaForCausalLM",
                              problems=problems, caller=caller)
