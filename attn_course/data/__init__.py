"""What the course's models read: the nursery-rhyme corpora (``*.txt`` beside this file), the
tokenizers, and the bank/river sentence of chapters 01-03.

- :mod:`~attn_course.data.rhymes`: :func:`load_rhymes`, :func:`load_more_rhymes`, :func:`held_out_split`,
  and chapter 08's :func:`load_pretraining_text`, :func:`split_rhymes`;
- :mod:`~attn_course.data.repeated_tokens`: chapter 11's random tokens that repeat (:func:`repeated_random_tokens`,
  :func:`placed_repeats`) and random windows of a character text (:func:`character_windows`);
- :mod:`~attn_course.data.stories`: :func:`story_splits`, chapter 08's little stories, whose blanks other
  words of the sentence decide;
- :mod:`~attn_course.data.tokenizers`: :class:`CharTokenizer`, :class:`WordVocabulary`, :func:`pad_batch`;
- :mod:`~attn_course.data.toy_sentence`: :func:`bank_sentence`, the worked example's embeddings;
- ``small_bert_mlm.safetensors``: chapter 08's small BERT as trained on the stories (weights, vocabulary,
  history), read by :func:`~attn_course.models.bert.load_saved_run`, made by ``tools/train_small_bert.py``;
- ``published_configs/``: the attention fields of four 2025 models' ``config.json`` (Qwen3-8B, Gemma 3 27B,
  gpt-oss-120b, Qwen3-Next-80B-A3B), each with its source in the folder's README, read by
  :func:`~attn_course.variants.layout_cache_size.published_config`.
"""
