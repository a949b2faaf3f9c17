"""Whole models built from the course's blocks.

- :mod:`~attn_course.models.tiny_language_model`: chapter 04's character-level decoder, and
  :mod:`~attn_course.models.training`, how it is trained;
- :mod:`~attn_course.models.attention_only`: chapter 11's attention-only transformer (no MLP), with hook points
  and per-head weight accessors for reading its circuits (:mod:`attn_course.circuits`);
- :mod:`~attn_course.models.bert`: BERT, loading real pretrained weights (chapter 08);
- :mod:`~attn_course.models.llama`: a Llama/Mistral decoder, loading Hugging Face checkpoints (chapter 09);
- :mod:`~attn_course.models.hugging_face`: what loading those checkpoints shares (safetensors, our names to
  theirs checked one by one, ``config.json`` and its rotary settings), and DeepSeek-V2's latent attention.
"""
