"""Attention sinks (StreamingLLM): a KV cache of the first tokens and a rolling window, with positions inside the cache.

Xiao et al. (2023, "Efficient streaming language models with attention sinks", arXiv 2309.17453)
saw that language models put large attention weights on the first few tokens whatever they are
("attention sinks"), so a cache that evicts them, the plain rolling window of
:mod:`attn_course.variants.sliding_window`, degrades sharply once the text is longer than the window.
StreamingLLM keeps the first ``sinks`` tokens (the paper uses 4) next to the window of the most
recent ones; memory stays fixed however long the text.

Which keys a query sees is :func:`~attn_course.variants.masks.attention_sink_mask`'s, with the same
``window`` and ``sinks``: the query at text position ``p`` sees key ``j <= p`` when ``j < sinks``
or ``j > p - window`` (the window counts the query itself). So the cache holds the ``sinks`` first
tokens and the last ``window - 1``; with the token being decoded that is ``sinks + window`` keys.
(The authors' ``StartRecentKVCache(start_size, recent_size)`` evicts after each step down to
``start_size + recent_size`` tokens, then the next token is added: ``start_size = sinks`` and
``recent_size = window - 1``.)

Positions, the essential part (§3.2 of the paper): "When determining the relative distance and
adding positional information to tokens, StreamingLLM focuses on positions within the cache rather
than those in the original text ... if the current cache has tokens [0, 1, 2, 3, 6, 7, 8] and is in
the process of decoding the 9th token, the positions assigned are [0, 1, 2, 3, 4, 5, 6, 7], rather
than the positions in the original text, which would be [0, 1, 2, 3, 6, 7, 8, 9]." And: "For
encoding like RoPE, we cache the Keys of tokens prior to introducing the rotary transformation.
Then, we apply position transformation to the keys in the rolling cache at each decoding phase."
(Their ``enable_pos_shift`` attention does so: the query rotated at its in-cache position, the
concatenated cached and new keys at ``0 .. N_k - 1``.) So no query ever sees a distance larger
than ``sinks + window - 1``, the longest a model trained on short texts knows.

Here that is a small protocol between the cache and
:class:`~attn_course.core.multihead.MultiHeadAttention`: :class:`SinkKVCache` has
``positions_in_cache = True`` (``False`` on every other :class:`~attn_course.core.kv_cache.KVCache`);
it holds un-rotated keys, and the attention asks :meth:`SinkKVCache.cache_positions` for the
in-cache positions of the new queries and of the keys :meth:`~SinkKVCache.append` will return,
rotates the queries, appends the un-rotated keys, and rotates the returned keys. Rotating every
held key at every step costs ``O(sinks + window)`` per token, as in the paper.

:func:`streaming_losses` feeds a text one token at a time through a model with such caches and
returns the next-token loss of every token: chapter 08 compares the window alone
(``SinkKVCache(window, sinks=0)``, the same outputs as a
:class:`~attn_course.variants.sliding_window.RollingKVCache`) with sinks and window on a long held-out text.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course.core.kv_cache import KVCache
from attn_course.variants.sliding_window import RollingKVCache

__all__ = ["CachePositions", "SinkKVCache", "streaming_losses"]


class CachePositions(NamedTuple):
    """In-cache RoPE positions for one :meth:`SinkKVCache.append`.

    Attributes:
        queries: ``[N_new]`` positions of the new tokens (their queries).
        keys: ``[N_k]`` positions of the keys and values the append returns, ``0 .. N_k - 1``.
    """

    queries: torch.Tensor
    keys: torch.Tensor


class SinkKVCache(KVCache):
    """A :class:`~attn_course.core.kv_cache.KVCache` that keeps the first ``sinks`` tokens and the last ``window - 1``.

    Usable wherever a ``KVCache`` is (it is one): ``len(cache)`` counts every token appended, and
    :meth:`append` returns the keys and values the new queries attend to, in text order: the
    sinks, then the recent tokens it still holds, then the new ones. Memory is fixed at
    ``sinks + window - 1`` tokens. It holds keys *before* RoPE (``positions_in_cache = True``), so
    :class:`~attn_course.core.multihead.MultiHeadAttention` rotates them by their positions inside the
    cache (:meth:`cache_positions`); without RoPE it is a plain cache that forgets.

    Several tokens may be appended at once: the keys returned then reach further back than the last
    new query sees, and :meth:`window_mask` is the mask that lines them up (as
    :meth:`RollingKVCache.window_mask <attn_course.variants.sliding_window.RollingKVCache.window_mask>`
    does). With RoPE, in-cache positions are the same for every query of one append only while
    nothing is evicted yet, so :meth:`cache_positions` accepts several tokens only as long as
    ``len(cache) + N_new <= sinks + window`` (a prompt into a fresh cache); past that, decode one
    token at a time.

    Args:
        window: ``W``, recent keys each query sees, itself included (``>= 1``), as in
            :func:`~attn_course.variants.masks.attention_sink_mask`.
        sinks: ``S``, first tokens every query also sees (``0 <= S <= W``; 0 is the plain
            rolling window; the paper uses 4).

    Raises:
        TypeError: ``window`` or ``sinks`` not an int.
        ValueError: ``window`` below 1, ``sinks`` below 0 or above ``window``.

    Example:
        >>> cache = SinkKVCache(window=3, sinks=2)
        >>> for position in range(8):
        ...     keys, _ = cache.append(torch.full((1, 1, 1, 1), float(position)), torch.zeros(1, 1, 1, 1))
        >>> keys.flatten().tolist()               # the last token (7) saw the sinks 0, 1 and 5, 6, 7
        [0.0, 1.0, 5.0, 6.0, 7.0]
        >>> len(cache), cache.held, cache.capacity    # 8 seen, 4 held (0, 1, 6, 7): 2 sinks + 2 recent
        (8, 4, 4)
    """

    positions_in_cache = True

    def __init__(self, window: int, sinks: int) -> None:
        super().__init__()
        where = "SinkKVCache"
        self.window = _validate.integer(where, "window", window, minimum=1)
        self.sinks = _validate.integer(where, "sinks", sinks, minimum=0)
        if self.sinks > self.window:
            raise ValueError(f"{where}: sinks must be at most window (as in attention_sink_mask), got "
                             f"sinks={self.sinks}, window={self.window}")
        # Positions 0..S-1 go to a cache that never grows past S; the rest to a ring of W - 1.
        self._sink_part = KVCache(max_length=self.sinks) if self.sinks else None
        self._recent_part = RollingKVCache(self.window)
        self._layout: tuple | None = None     # (B, H_kv, d_k, d_v, dtype, device) of the first append

    def __repr__(self) -> str:
        return f"SinkKVCache(window={self.window}, sinks={self.sinks}, seen={self.length}, held={self.held})"

    @property
    def held(self) -> int:
        """Tokens held now: ``min(len, S) + min(max(len - S, 0), W - 1)``."""
        return min(self.length, self.sinks) + min(max(self.length - self.sinks, 0), self.window - 1)

    @property
    def capacity(self) -> int:
        """Token slots allocated: ``S`` once a token arrived, plus ``W - 1`` once one past the sinks did."""
        parts = (self._sink_part, self._recent_part)
        return sum(part.capacity for part in parts if part is not None)

    @property
    def memory_bytes(self) -> int:
        """Bytes allocated for keys and values: at most ``S + W - 1`` tokens, however many were seen."""
        parts = (self._sink_part, self._recent_part)
        return sum(part.memory_bytes for part in parts if part is not None)

    @property
    def keys(self) -> torch.Tensor:
        """The held keys (before RoPE), sinks first, then the recent ones, ``[B, H_kv, held, d_k]``."""
        self._require_appended("keys")
        return torch.cat([part.keys for part in self._filled_parts()], dim=2)

    @property
    def values(self) -> torch.Tensor:
        """The held values, in the order of :attr:`keys`, ``[B, H_kv, held, d_v]``."""
        self._require_appended("values")
        return torch.cat([part.values for part in self._filled_parts()], dim=2)

    def attended_length(self, new_tokens: int) -> int:
        """How many keys :meth:`append` will return after ``new_tokens`` more: ``held + new_tokens``.

        Args:
            new_tokens: ``N_new``, the tokens about to be appended.

        Returns:
            ``N_k = held + N_new`` (at most ``S + W - 1 + N_new``).

        Raises:
            TypeError, ValueError: ``new_tokens`` not an int ``>= 0``.

        Example:
            >>> cache = SinkKVCache(window=4, sinks=2)
            >>> _ = cache.append(torch.zeros(1, 1, 10, 2), torch.zeros(1, 1, 10, 2))
            >>> len(cache), cache.attended_length(1)      # 2 sinks + 3 recent + the new one
            (10, 6)
        """
        new_tokens = _validate.integer("SinkKVCache.attended_length", "new_tokens", new_tokens, minimum=0)
        return self.held + new_tokens

    def token_positions(self, new_tokens: int, *, device: torch.device | str | None = None) -> torch.Tensor:
        """The positions *in the text* of the keys that the next :meth:`append` of ``new_tokens`` returns.

        Call it before that append. They are the sinks ``0 .. min(len + N_new, S) - 1``, then the
        contiguous run from ``max(S, len - (W - 1))`` up to the newest token ``len + N_new - 1``.

        Args:
            new_tokens: ``N_new >= 0``.
            device: where to create the tensor.

        Returns:
            ``[N_k]`` int64, increasing, ``N_k = attended_length(N_new)``.

        Raises:
            TypeError, ValueError: ``new_tokens`` not an int ``>= 0``.

        Example:
            >>> cache = SinkKVCache(window=4, sinks=4)
            >>> _ = cache.append(torch.zeros(1, 1, 9, 2), torch.zeros(1, 1, 9, 2))   # tokens 0..8
            >>> cache.token_positions(1).tolist()          # the paper's example: decoding token 9
            [0, 1, 2, 3, 6, 7, 8, 9]
        """
        new_tokens = _validate.integer("SinkKVCache.token_positions", "new_tokens", new_tokens, minimum=0)
        end = self.length + new_tokens
        first_recent = min(max(self.sinks, self.length - (self.window - 1)), end)    # none while end <= S
        return torch.cat([torch.arange(min(end, self.sinks), device=device),
                          torch.arange(first_recent, end, device=device)])                # [N_k]

    def cache_positions(self, new_tokens: int, *, device: torch.device | str | None = None) -> CachePositions:
        """RoPE positions inside the cache for the next :meth:`append` of ``new_tokens``: keys ``0 .. N_k - 1``.

        StreamingLLM numbers the keys a query sees by their place in the cache, not in the text:
        the returned keys get ``0 .. N_k - 1`` and the new queries the last ``N_new`` of those.
        :class:`~attn_course.core.multihead.MultiHeadAttention` calls this (``positions_in_cache``);
        call it before the append.

        Several new tokens at once are accepted only while ``len + N_new <= S + W``: then nothing
        has been evicted yet for any of them, in-cache and text positions agree, and the result is
        what one-at-a-time decoding gives. Later, each new query would need its own numbering of
        the sinks (one token earlier in the cache it sits one step closer to them), which one
        rotation of the keys cannot give; decode one token at a time there.

        Args:
            new_tokens: ``N_new >= 1``.
            device: where to create the tensors.

        Returns:
            :class:`CachePositions`: ``queries [N_new]`` = ``N_k - N_new .. N_k - 1`` and
            ``keys [N_k]`` = ``0 .. N_k - 1`` (int64).

        Raises:
            TypeError, ValueError: ``new_tokens`` not an int ``>= 1``; several tokens at once past
                ``len + N_new = S + W``.

        Example:
            >>> cache = SinkKVCache(window=4, sinks=4)
            >>> _ = cache.append(torch.zeros(1, 1, 9, 2), torch.zeros(1, 1, 9, 2))   # tokens 0..8
            >>> positions = cache.cache_positions(1)       # token 9 sees 0, 1, 2, 3, 6, 7, 8, 9
            >>> positions.keys.tolist(), positions.queries.tolist()
            ([0, 1, 2, 3, 4, 5, 6, 7], [7])
        """
        where = "SinkKVCache.cache_positions"
        new_tokens = _validate.integer(where, "new_tokens", new_tokens, minimum=1)
        limit = self.sinks + self.window
        if new_tokens > 1 and self.length + new_tokens > limit:
            raise ValueError(
                f"{where}: new_tokens={new_tokens} at once after {self.length} tokens would evict keys while "
                f"some of the new queries still see them, and each query would need its own in-cache "
                f"positions; with RoPE append several tokens only while len + new_tokens <= sinks + window "
                f"= {limit} (here at most {max(limit - self.length, 1)}), then one at a time"
            )
        n_k = self.held + new_tokens
        keys = torch.arange(n_k, device=device)                                            # [N_k]
        return CachePositions(queries=keys[n_k - new_tokens:], keys=keys)

    def window_mask(self, new_tokens: int, *, device: torch.device | str | None = None) -> torch.Tensor:
        """The attention-sink mask for the keys that the next :meth:`append` of ``new_tokens`` returns.

        Call it before that append. New query ``i`` sits at text position ``p = len + i`` and may
        attend a returned key at text position ``j`` (:meth:`token_positions`) when ``j <= p`` and
        ``j < S`` or ``j > p - W``: the columns of
        :func:`~attn_course.variants.masks.attention_sink_mask` that the cache returns. Decoding one token at
        a time needs no mask (the cache returns exactly what the query sees).

        Args:
            new_tokens: ``N_new >= 1``, the tokens about to be appended (the queries).
            device: where to create the mask.

        Returns:
            ``[N_new, N_k]`` boolean tensor (True = may attend), ``N_k = attended_length(N_new)``.

        Raises:
            TypeError, ValueError: ``new_tokens`` not an int ``>= 1``.

        Example:
            >>> cache = SinkKVCache(window=2, sinks=1)
            >>> _ = cache.append(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))   # holds 0 and 3
            >>> cache.window_mask(2).int()                                          # keys at 0, 3, 4, 5
            tensor([[1, 1, 1, 0],
                    [1, 0, 1, 1]], dtype=torch.int32)
        """
        new_tokens = _validate.integer("SinkKVCache.window_mask", "new_tokens", new_tokens, minimum=1)
        keys = self.token_positions(new_tokens, device=device)[None, :]                   # [1, N_k]
        queries = torch.arange(self.length, self.length + new_tokens, device=device)[:, None]   # [N_new, 1]
        return (keys <= queries) & ((keys < self.sinks) | (keys > queries - self.window))  # [N_new, N_k]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the keys/values of new tokens; return the sinks, the held recent ones and the new ones.

        Args:
            keys: ``[B, H_kv, N_new, d_k]``, *not* rotated (RoPE is applied to what this returns, at
                the positions of :meth:`cache_positions`).
            values: ``[B, H_kv, N_new, d_v]``.

        Returns:
            ``(keys, values)``, ``[B, H_kv, N_k, d]`` with ``N_k = held before + N_new``, in text order
            (the text positions are :meth:`token_positions`, asked before the append).

        Raises:
            TypeError, ValueError: inputs that are not 4-D floating tensors of one dtype and
                device, or that do not match what the cache already holds.

        Example:
            >>> cache = SinkKVCache(window=2, sinks=1)
            >>> keys, _ = cache.append(torch.arange(5.0).view(1, 1, 5, 1), torch.zeros(1, 1, 5, 1))
            >>> keys.flatten().tolist(), cache.keys.flatten().tolist()      # all five back, 0 and 4 kept
            ([0.0, 1.0, 2.0, 3.0, 4.0], [0.0, 4.0])
        """
        self._check_new("SinkKVCache.append", keys, values)
        if keys.shape[2] == 0:                                                              # nothing new
            return (self.keys, self.values) if self.length else (keys, values)
        # The new tokens at positions below S join the sinks; the others go through the ring.
        to_sinks = min(max(self.sinks - self.length, 0), keys.shape[2])
        returned_keys, returned_values = [], []
        if self._sink_part is not None and (to_sinks or len(self._sink_part)):
            if to_sinks:
                sink_keys, sink_values = self._sink_part.append(keys[:, :, :to_sinks], values[:, :, :to_sinks])
            else:
                sink_keys, sink_values = self._sink_part.keys, self._sink_part.values   # [B, H_kv, S, d]
            returned_keys.append(sink_keys)
            returned_values.append(sink_values)
        if keys.shape[2] > to_sinks:
            recent_keys, recent_values = self._recent_part.append(keys[:, :, to_sinks:], values[:, :, to_sinks:])
            returned_keys.append(recent_keys)                                               # [B, H_kv, ·, d_k]
            returned_values.append(recent_values)
        self.length += keys.shape[2]
        return torch.cat(returned_keys, dim=2), torch.cat(returned_values, dim=2)         # [B, H_kv, N_k, d]

    def reset(self) -> None:
        """Forget every token and the count of positions (keeps nothing allocated)."""
        super().reset()
        if self._sink_part is not None:
            self._sink_part.reset()
        self._recent_part.reset()
        self._layout = None

    def _filled_parts(self) -> list[KVCache]:
        parts = []
        if self._sink_part is not None and len(self._sink_part):
            parts.append(self._sink_part)
        if len(self._recent_part):
            parts.append(self._recent_part)
        return parts

    def _check_new(self, where: str, keys: torch.Tensor, values: torch.Tensor) -> None:
        _validate.four_d(where, layout="[B, H_kv, N_new, d]", keys=keys, values=values)
        if keys.shape[:3] != values.shape[:3]:
            raise ValueError(
                f"{where}: keys and values must be [B, H_kv, N_new, d] with the same B, H_kv and "
                f"N_new, got keys {_validate.shape_str(keys)} and values {_validate.shape_str(values)}"
            )
        layout = (*keys.shape[:2], keys.shape[3], values.shape[3], keys.dtype, keys.device)
        if self._layout is None:
            self._layout = layout
        elif layout != self._layout:
            batch, heads, d_k, d_v, dtype, _ = self._layout
            raise ValueError(
                f"{where}: new keys {_validate.shape_str(keys)} / values {_validate.shape_str(values)} "
                f"({keys.dtype}, {keys.device}) do not match the cache's [B, H_kv, ·, d] = "
                f"[{batch}, {heads}, ·, {d_k}] / [{batch}, {heads}, ·, {d_v}] ({dtype}, {self._layout[5]})"
            )

    def _require_appended(self, name: str) -> None:
        if self.length == 0:
            raise ValueError(f"SinkKVCache.{name}: the cache is empty; append keys and values first")


@torch.no_grad()
def streaming_losses(model: nn.Module, ids: torch.Tensor, caches: list[KVCache]) -> torch.Tensor:
    """Next-token losses of a text fed one token at a time through ``model`` with ``caches``.

    Step ``t`` runs ``model(ids[:, t:t+1], kv_caches=caches)`` and scores token ``t + 1`` with the
    logits it returns, so token ``t + 1`` is predicted from what the caches still hold: every
    earlier token with :class:`~attn_course.core.kv_cache.KVCache` s (the same losses as one forward
    over the whole text), the sinks and the window with :class:`SinkKVCache` s. The model runs in
    eval mode (restored afterwards) and without gradients.

    A :class:`~attn_course.models.llama.LlamaForCausalLM` without a sliding window refuses caches that
    forget keys its attention would read; give it ``config.sliding_window = sinks + window``, which
    masks nothing while decoding one token at a time with a :class:`SinkKVCache` (the cache returns
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
