"""Today's variants of attention (chapter 09), each built on the core.

- :mod:`~attn_course.variants.masks`: sliding-window, attention-sink and document masks;
- :mod:`~attn_course.variants.sliding_window`: :class:`RollingKVCache`, a cache that keeps the last window;
- :mod:`~attn_course.variants.attention_sinks`: :class:`SinkKVCache`, StreamingLLM's sinks plus window;
- :mod:`~attn_course.variants.latent_attention`: DeepSeek-V2's multi-head latent attention;
- :mod:`~attn_course.variants.linear_attention`: kernelised attention, parallel and recurrent;
- :mod:`~attn_course.variants.flex_attention`: the same variants as FlexAttention ``score_mod``/``mask_mod``;
- :mod:`~attn_course.variants.kv_cache_size`: the bytes each design keeps per token;
- :mod:`~attn_course.variants.layout_cache_size`: a whole model's cache by its layout of full, sliding and
  linear-attention layers, and the published configs of four 2025 models.
"""
