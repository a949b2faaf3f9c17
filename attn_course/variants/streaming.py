"""Next-token losses of a text streamed one token at a time through a model with KV caches (chapter 09).

:func:`streaming_losses` is how chapter 09 measures a cache that forgets: each token is predicted
from what the caches still hold, a :class:`~attn_course.core.kv_cache.KVCache` (everything), a
:class:`~attn_course.variants.sliding_window.RollingKVCache` (the window) or a
:class:`~attn_course.variants.attention_sinks.SinkKVCache` (sinks and window).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course.core.kv_cache import KVCache

__all__ = ["streaming_losses"]


@torch.no_grad()
def streaming_losses(model: nn.Module, ids: torch.Tensor, caches: list[KVCache]) -> torch.Tensor:
    """Next-token losses of a text fed one token at a time through ``model`` with ``caches``.

    Step ``t`` runs ``model(ids[:, t:t+1], kv_caches=caches)`` and scores token ``t + 1`` with the
    logits it returns, so token ``t + 1`` is predicted from what the caches still hold: every
    earlier token with :class:`~attn_course.core.kv_cache.KVCache` s (the same losses as one forward
    over the whole text), the sinks and the window with
    :class:`~attn_course.variants.attention_sinks.SinkKVCache` s. The model runs in eval mode (restored
    afterwards) and without gradients.

    A :class:`~attn_course.models.llama.LlamaForCausalLM` without a sliding window refuses caches that
    forget keys its attention would read; give it ``config.sliding_window = sinks + window``, which
    masks nothing while decoding one token at a time with a
    :class:`~attn_course.variants.attention_sinks.SinkKVCache` (the cache returns
    exactly ``sinks + window`` keys).

    Args:
        model: takes ``(ids [1, 1], kv_caches=caches)`` and returns logits ``[1, 1, V]``, or an
            object with such ``.logits`` (:class:`~attn_course.models.llama.LlamaForCausalLM`,
            :class:`~attn_course.models.tiny_language_model.TinyLanguageModel`).
        ids: ``[1, N]`` token ids, ``N >= 2``.
        caches: one empty cache per block of ``model``, e.g.
            ``[SinkKVCache(window, sinks) for _ in model.model.blocks]``; they are filled (``N - 1``
            tokens each) and left so.

    Returns:
        ``[N - 1]`` float32: ``-log p(ids[0, t + 1] | what the caches hold)`` for ``t = 0 .. N - 2``.

    Raises:
        TypeError: ``model`` not callable, ``ids`` not an integer tensor, ``caches`` not a list of
            KVCache, or a model output that is neither a tensor nor has ``.logits``.
        ValueError: ``ids`` not ``[1, N]`` with ``N >= 2``, caches that are not empty, or logits that
            are not ``[1, 1, V]``; otherwise as the model's own checks.

    Example:
        >>> from attn_course.models.llama import LlamaConfig, LlamaForCausalLM
        >>> from attn_course.variants.attention_sinks import SinkKVCache
        >>> _ = torch.manual_seed(0)
        >>> config = LlamaConfig(vocab_size=10, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        ...                      num_attention_heads=2, sliding_window=2 + 3)      # sinks + window
        >>> model = LlamaForCausalLM(config)
        >>> caches = [SinkKVCache(window=3, sinks=2) for _ in range(2)]
        >>> losses = streaming_losses(model, torch.randint(10, (1, 20)), caches)
        >>> losses.shape, len(caches[0]), caches[0].held
        (torch.Size([19]), 19, 4)
    """
    where = "streaming_losses"
    if not callable(model):
        raise TypeError(f"{where}: model must be callable (ids, kv_caches=...) -> logits, got {type(model).__name__}")
    ids = _validate.integer_tensor(where, "ids", ids)
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"{where}: ids must be [1, N] with N >= 2, got shape {_validate.shape_str(ids)}")
    if isinstance(caches, KVCache) or not isinstance(caches, (list, tuple)) \
            or not all(isinstance(cache, KVCache) for cache in caches):
        raise TypeError(f"{where}: caches must be a list of KVCache, one per block, got {type(caches).__name__}")
    caches = list(caches)
    if not caches or any(len(cache) for cache in caches):
        raise ValueError(f"{where}: caches must be a non-empty list of empty caches (one per block), got lengths "
                         f"{[len(cache) for cache in caches]}")
    training = getattr(model, "training", False)
    if isinstance(model, nn.Module):
        model.eval()
    try:
        losses = []
        for t in range(ids.shape[1] - 1):
            output = model(ids[:, t:t + 1], kv_caches=caches)
            logits = output if isinstance(output, torch.Tensor) else getattr(output, "logits", None)
            if not isinstance(logits, torch.Tensor):
                raise TypeError(f"{where}: model must return logits [1, 1, V] or an object with .logits, "
                                f"got {type(output).__name__}")
            if logits.dim() != 3 or logits.shape[:2] != (1, 1):
                raise ValueError(f"{where}: model must return logits [1, 1, V] for one token, got shape "
                                 f"{_validate.shape_str(logits)}")
            log_p = F.log_softmax(logits[0, 0].float(), dim=-1)                          # [V]
            losses.append(-log_p[ids[0, t + 1]])
    finally:
        if isinstance(model, nn.Module):
            model.train(training)
    return torch.stack(losses)                                                         # [N - 1]
