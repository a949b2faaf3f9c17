"""A Llama-style decoder built from the course's own blocks, and a loader for Hugging Face checkpoints.

    x = embedding[input_ids]                                      # [B, N, E]
    x = x + Attention(RMSNorm(x))    # grouped-query, causal, RoPE (half split); Qwen3: QK-norm
    x = x + SwiGLU(RMSNorm(x))       # ... for each of the L blocks
    logits = lm_head(RMSNorm(x))                                  # [B, N, V]

:func:`load_pretrained` reads a folder in the Hugging Face layout (``config.json``,
``model.safetensors``) without touching the network and agrees with ``transformers``'
``LlamaForCausalLM`` within 1e-5 in float32 (``tests/models/test_llama.py``): hidden states, logits,
left-padded batches and greedy decoding with a KV cache. A Mistral folder loads into the same
classes with ``config.sliding_window`` set: every block then masks to the window, and generation
keeps a :class:`~attn_course.variants.sliding_window.RollingKVCache` per block; it agrees with
``MistralForCausalLM`` within 1e-5 (``tests/variants/test_sliding_window.py``). A Qwen3 folder loads
into them too: each head's query and key RMS-normalised before RoPE (``config.qk_norm``), a head size of
its own (``config.head_dim``), optional attention biases, and a window on the layers ``config.layer_types``
marks; it agrees with ``Qwen3ForCausalLM`` (``tests/models/test_loading.py``).

One idea per module; every name below can be imported from ``attn_course.models.llama`` itself:

- ``config``: :class:`LlamaConfig`, the sizes (Hugging Face's ``config.json``), and :data:`MODEL_TYPES`, the
  ``model_type`` values it reads;
- ``feed_forward``: :class:`SwiGLU`;
- ``block``: :class:`LlamaDecoderBlock`, :func:`positions_from_attention_mask`, :func:`rotary_embedding`;
- ``model``: :class:`LlamaModel`, :class:`LlamaForCausalLM` (with greedy :meth:`~LlamaForCausalLM.generate`);
- ``loading``: :func:`load_pretrained`.

The norm is the core's :class:`~attn_course.core.norms.RMSNorm`; the rotary settings of a ``config.json``
(:func:`~attn_course.models.hugging_face.config.rope_from_hugging_face`) and our parameter names to Hugging
Face's (:mod:`attn_course.models.hugging_face.llama`) live with the other checkpoints' in
:mod:`attn_course.models.hugging_face`.
"""

from attn_course.models.llama.block import LlamaDecoderBlock, positions_from_attention_mask, rotary_embedding
from attn_course.models.llama.config import LAYER_TYPES, MODEL_TYPES, LlamaConfig
from attn_course.models.llama.feed_forward import SwiGLU
from attn_course.models.llama.loading import load_pretrained
from attn_course.models.llama.model import CausalLMOutput, GreedyOutput, LlamaForCausalLM, LlamaModel, LlamaOutput

__all__ = ["LlamaConfig", "MODEL_TYPES", "LAYER_TYPES", "SwiGLU", "LlamaDecoderBlock", "positions_from_attention_mask",
           "rotary_embedding", "LlamaModel", "LlamaForCausalLM", "LlamaOutput", "CausalLMOutput", "GreedyOutput",
           "load_pretrained"]
