"""Small decoders trained with and without the attention choices of 2025–26's open models (chapter 12).

- :mod:`~attn_course.open_models.small_decoder`: a pre-norm decoder of
  :class:`~attn_course.models.decoder_attention.DecoderAttention` layers, each choice a switch;
- :mod:`~attn_course.open_models.tasks`: its two tasks, characters of nursery rhymes and random tokens
  with a repeat, each sequence after a start token;
- :mod:`~attn_course.open_models.training`: training one, measuring what each choice is said to change;
- :mod:`~attn_course.open_models.trained`: the cached runs the chapter reads (``tools/train_open_models.py``).
"""

from attn_course.open_models.small_decoder import SmallDecoder, SmallDecoderConfig
from attn_course.open_models.tasks import TASKS, start_token_batch
from attn_course.open_models.trained import trained_runs
from attn_course.open_models.training import RunHistory, RunSetup, train_small_decoder

__all__ = ["SmallDecoder", "SmallDecoderConfig", "TASKS", "start_token_batch", "RunSetup", "RunHistory",
           "train_small_decoder", "trained_runs"]
