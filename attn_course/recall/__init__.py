"""What a state can hold (chapter 13): multi-query associative recall with softmax, linear and delta-rule layers.

- :mod:`~attn_course.recall.tasks`: MQAR batches (Arora et al. 2023, "Zoology"), key–value pairs then queries;
- :mod:`~attn_course.recall.models`: a small model whose layers differ only in their token mixer;
- :mod:`~attn_course.recall.training`: training one on MQAR, its recall accuracy by the number of pairs;
- :mod:`~attn_course.recall.memory`: the bytes each model keeps to decode: a fixed state or a growing cache;
- :mod:`~attn_course.recall.trained`: the cached runs the chapter reads (``tools/train_recall.py``).
"""

from attn_course.recall.memory import DecodingMemory, decoding_memory
from attn_course.recall.models import MIXERS, RecallModel, RecallModelConfig, TokenMixer
from attn_course.recall.tasks import RecallBatch, recall_batch
from attn_course.recall.trained import recall_table, trained_runs
from attn_course.recall.training import MODELS, RunHistory, RunSetup, recall_accuracy, train_recall_model

__all__ = ["DecodingMemory", "decoding_memory", "MIXERS", "RecallModel", "RecallModelConfig", "TokenMixer",
           "RecallBatch", "recall_batch", "recall_table", "trained_runs", "MODELS", "RunHistory", "RunSetup",
           "recall_accuracy", "train_recall_model"]
