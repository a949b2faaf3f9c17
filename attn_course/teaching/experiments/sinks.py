"""Chapter 09's attention-sink measurement: stream held-out text through caches that forget.

StreamingLLM (Xiao et al. 2023, arXiv 2309.17453) explains attention sinks by where the first token sits in
training: every training sequence has one, visible to every later token, so a model learns to park the attention
it does not need there, and evicting it breaks the model. Chapter 09 tests that on two small RoPE character
models, one trained on random crops and one with a fixed first token before every crop
(``train_position_model(..., first_token=True)``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_course import _validate
from attn_course.core.kv_cache import KVCache
from attn_course.models.position_model import PositionLanguageModel
from attn_course.variants.streaming import streaming_losses

__all__ = ["sink_streaming_losses", "first_token_windows"]


def _check(where: str, model: object, ids: object) -> torch.Tensor:
    if not isinstance(model, PositionLanguageModel):
        raise TypeError(f"{where}: model must be a PositionLanguageModel, got {type(model).__name__}")
    ids = _validate.integer_tensor(where, "ids", ids)
    if ids.dim() != 1:
        raise ValueError(f"{where}: ids must be 1-D [N] character ids, got shape {_validate.shape_str(ids)}")
    return ids


def sink_streaming_losses(model: PositionLanguageModel, ids: torch.Tensor,
                          make_cache: Callable[[], KVCache]) -> torch.Tensor:
    """Losses of ``ids[1:]``, each character predicted from what the caches hold when it comes.

    The text is fed one token at a time (:func:`~attn_course.variants.streaming.streaming_losses`) with a fresh
    ``make_cache()`` per block. A model trained with a first token is given it before ``ids``, as in training,
    and its prediction at the fixed token itself (a guess of ``ids[0]`` from nothing, never scored in training)
    is left out; either way the losses are those of the same characters.

    Args:
        model: a :class:`~attn_course.models.position_model.PositionLanguageModel`.
        ids: ``[N]`` character ids (no first token), ``N >= 2``.
        make_cache: builds one empty cache, e.g. ``lambda: SinkKVCache(window=28, sinks=4)``.

    Returns:
        ``[N - 1]`` float32: ``-log p(ids[t])`` for ``t = 1 .. N - 1``.

    Raises:
        TypeError, ValueError: ``model`` not a PositionLanguageModel, ``ids`` not a 1-D integer tensor of at
            least 2 ids, ``make_cache`` not callable; otherwise as ``streaming_losses``.

    Example:
        >>> from attn_course.models.position_model import PositionConfig
        >>> from attn_course.variants.attention_sinks import SinkKVCache
        >>> model = PositionLanguageModel(PositionConfig(vocab_size=6, position="rope", first_token=True))
        >>> sink_streaming_losses(model, torch.arange(12) % 5, lambda: SinkKVCache(window=4, sinks=1)).shape
        torch.Size([11])
    """
    where = "sink_streaming_losses"
    ids = _check(where, model, ids)
    if len(ids) < 2:
        raise ValueError(f"{where}: ids must hold at least 2 ids (one to predict from, one to predict), got {len(ids)}")
    if not callable(make_cache):
        raise TypeError(f"{where}: make_cache must be callable () -> an empty KVCache, got {type(make_cache).__name__}")
    first = model.config.first_token_id
    streamed = ids if first is None else torch.cat([ids.new_tensor([first]), ids])             # [N] or [N + 1]
    losses = streaming_losses(model, streamed[None], [make_cache() for _ in model.blocks])       # [len - 1]
    return losses if first is None else losses[1:]                                               # [N - 1]


def first_token_windows(model: PositionLanguageModel, ids: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """``[count, length]`` windows as ``model`` was trained on them, cut in turn from the ``[T]`` character
    ``ids``: ``ids[w·length : (w+1)·length]``, or for a model trained with a first token, that token followed by
    the next ``length - 1`` characters, so that position 0 holds what it held in every training window (on
    these the chapter measures how much attention the first key receives).

    Raises:
        TypeError, ValueError: ``model`` not a PositionLanguageModel, ``ids`` not a 1-D integer tensor or too
            short, ``count`` below 1 or ``length`` below 2.

    Example:
        >>> from attn_course.models.position_model import PositionConfig
        >>> model = PositionLanguageModel(PositionConfig(vocab_size=10, position="rope", first_token=True))
        >>> first_token_windows(model, torch.arange(8), count=2, length=3).tolist()    # the first token is 9
        [[9, 0, 1], [9, 2, 3]]
    """
    where = "first_token_windows"
    ids = _check(where, model, ids)
    count = _validate.integer(where, "count", count, minimum=1)
    length = _validate.integer(where, "length", length, minimum=2)
    first = model.config.first_token_id
    characters = length - (first is not None)                                      # per window
    if len(ids) < count * characters:
        raise ValueError(f"{where}: ids hold {len(ids)} characters, fewer than count * {characters} = "
                         f"{count * characters}")
    windows = ids[: count * characters].view(count, characters)                    # [count, characters]
    if first is None:
        return windows
    return torch.cat([windows.new_full((count, 1), first), windows], dim=1)        # [count, length]
