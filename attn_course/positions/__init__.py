"""Where a token is (chapters 05 and 09): rotary embeddings with their long-context scalings, and ALiBi.

- :mod:`~attn_course.positions.rope`: :class:`RotaryEmbedding`;
- :mod:`~attn_course.positions.rope_scaling`: its scalings (linear, NTK, YaRN, Llama 3);
- :mod:`~attn_course.positions.alibi`: ALiBi's per-head slopes and distance bias.
"""
