"""A Llama-style decoder built from the course's own blocks, and a loader for Hugging Face checkpoints.

    x = embedding[input_ids]                                      # [B, N, E]
    x = x + Attention(RMSNorm(x))    # grouped-query, causal, RoPE (half split), no biases
    x = x + SwiGLU(RMSNorm(x))       # ... for each of the L blocks
    logits = lm_head(RMSNorm(x))                                  # [B, N, V]

:func:`load_pretrained` reads a folder in the Hugging Face layout (``config.json``,
``model.safetensors``) without touching the network and agrees with ``transformers``'
``LlamaForCausalLM`` within 1e-5 in float32 (``tests/models/test_llama.py``): hidden states, logits,
left-padded batches and greedy decoding with a KV cache. A Mistral folder loads into the same
classes with ``config.sliding_window`` set: every block then masks to the window, and generation
keeps a :class:`~attn_course.variants.sliding_window.RollingKVCache` per block; it agrees with
``MistralForCausalLM`` within 1e-5 (``tests/variants/test_sliding_window.py``).

One idea per module; every name below can be imported from ``attn_course.models.llama`` itself:

- ``config``: :class:`LlamaConfig`, the sizes (Hugging Face's ``config.json``);
- ``feed_forward``: :class:`SwiGLU`;
- ``model``: :class:`LlamaDecoderBlock`, :class:`LlamaModel`, :class:`LlamaForCausalLM` (with greedy
  :meth:`~LlamaForCausalLM.generate`), :func:`positions_from_attention_mask`;
- ``loading``: :func:`load_pretrained`.

Also importable from here, though they live elsewhere: :class:`RMSNorm` (:mod:`attn_course.core.norms`),
and from :mod:`attn_course.models.hugging_face`, :func:`rope_from_hugging_face` (the rotary settings as
:mod:`attn_course.positions.rope` objects) and :func:`hugging_face_name` / :func:`match_llama` (our
parameter names to Hugging Face's, checked one by one).
"""

from attn_course.core.norms import RMSNorm
from attn_course.models.hugging_face.config import ROPE_TYPES, rope_from_hugging_face
from attn_course.models.hugging_face.llama import LAYER_NAMES, TOP_NAMES, hugging_face_name, match_llama
from attn_course.models.llama.config import LlamaConfig
from attn_course.models.llama.feed_forward import SwiGLU
from attn_course.models.llama.loading import load_pretrained
from attn_course.models.llama.model import (
    CausalLMOutput,
    GreedyOutput,
    LlamaDecoderBlock,
    LlamaForCausalLM,
    LlamaModel,
    LlamaOutput,
    positions_from_attention_mask,
    rotary_embedding,
)

__all__ = [
    "LlamaConfig",
    "ROPE_TYPES",
    "rope_from_hugging_face",
    "RMSNorm",
    "SwiGLU",
    "LlamaDecoderBlock",
    "LlamaModel",
    "LlamaForCausalLM",
    "LlamaOutput",
    "CausalLMOutput",
    "GreedyOutput",
    "positions_from_attention_mask",
    "rotary_embedding",
    "LAYER_NAMES",
    "TOP_NAMES",
    "hugging_face_name",
    "match_llama",
    "load_pretrained",
]
