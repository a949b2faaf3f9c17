"""Whole models built from the course's blocks.

- :mod:`~attn_course.models.tiny_language_model`: chapter 04's character-level decoder, and
  :mod:`~attn_course.models.training`, how it is trained;
- :mod:`~attn_course.models.bert`: BERT, loading real pretrained weights (chapter 07);
- :mod:`~attn_course.models.llama`: a Llama/Mistral decoder, loading Hugging Face checkpoints (chapter 08).
"""
