"""Whole models built from the course's blocks.

- :mod:`~attn_course.models.training`: the training loops' shared parts (AdamW with a warm-up, a clipped step,
  the best weights kept) and chapter 04's loop;
- :mod:`~attn_course.models.two_relations`: chapter 03's one-layer model of two relations, its data and training;
- :mod:`~attn_course.models.tiny_language_model`: chapter 04's character-level decoder;
- :mod:`~attn_course.models.position_model`: that decoder with each position scheme, learned, RoPE, ALiBi or
  none (chapters 05 and 09);
- :mod:`~attn_course.models.attention_only`: chapter 11's attention-only transformer (no MLP), with hook points
  and per-head weight accessors for reading its circuits (:mod:`attn_course.circuits`);
- :mod:`~attn_course.models.bert`: BERT, loading real pretrained weights (chapter 08);
- :mod:`~attn_course.models.llama`: a Llama/Mistral/Qwen3 decoder, loading Hugging Face checkpoints (chapter 09);
- :mod:`~attn_course.models.gemma3`: Gemma 3's text model, built on chapter 12's decoder attention, loading Hugging
  Face checkpoints;
- :mod:`~attn_course.models.decoder_attention`: the attention layer of 2025–26's open decoders (chapter 12): GQA,
  QK-norm, RoPE, a window, learned sinks, an output gate;
- :mod:`~attn_course.models.loading`: :func:`load_pretrained`, a Hugging Face decoder folder into the course's
  model of its ``model_type`` (``llama``, ``mistral``, ``qwen3``, ``gemma3_text``, ``gemma3``);
- :mod:`~attn_course.models.hugging_face`: what loading those checkpoints shares (safetensors, our names to
  theirs checked one by one, ``config.json`` and its rotary settings), and DeepSeek-V2's latent attention.
"""

from attn_course.models.loading import load_pretrained

__all__ = ["load_pretrained"]
