"""Where a token is (chapters 05 and 08): rotary embeddings with their long-context scalings, and ALiBi.

- :mod:`~attn_course.positions.rope`: :class:`RotaryEmbedding` and the scalings (linear, NTK, YaRN, Llama 3);
- :mod:`~attn_course.positions.alibi`: ALiBi's per-head slopes and distance bias.
"""
