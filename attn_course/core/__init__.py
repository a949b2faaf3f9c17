"""The core of attention (chapters 02-04 and 08): what every later chapter builds on.

- :mod:`~attn_course.core.attention`: :func:`self_attention`, softmax(QKᵀ/√d) V, and its parts;
- :mod:`~attn_course.core.masks`: causal and padding masks, one boolean convention;
- :mod:`~attn_course.core.multihead`: :class:`MultiHeadAttention` (cross-attention, grouped-query heads);
- :mod:`~attn_course.core.backends`: the registry of attentions it can run (eager, SDPA; chapter 07 adds its kernel);
- :mod:`~attn_course.core.kv_cache`: :class:`KVCache`, the keys and values of past tokens, and the protocol
  every cache speaks with the attention (``attended_length``, ``new_positions``, ``update``);
- :mod:`~attn_course.core.transformer`: the encoder and decoder blocks around the attention;
- :mod:`~attn_course.core.norms`: :class:`RMSNorm`, and Gemma's :class:`GemmaRMSNorm` (a weight of ``1 + w``);
- :mod:`~attn_course.core.qk_norm`: :class:`HeadNormLinear`, a projection whose heads are RMS-normalised (QK-norm,
  ``MultiHeadAttention(qk_norm=True)``).

The core imports nothing of the course but its input checks (``attn_course._validate``); later
chapters extend it, it never imports them.
"""
