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

Here the cache speaks the protocol of every :class:`~attn_course.core.kv_cache.KVCache` with
:class:`~attn_course.core.multihead.MultiHeadAttention`: :meth:`SinkKVCache.new_positions` gives the
new queries their in-cache positions, and :meth:`SinkKVCache.update` stores the keys un-rotated and
returns every held key rotated, through the rotation it is handed, at ``0 .. N_k - 1``. Rotating
every held key at every step costs ``O(sinks + window)`` per token, as in the paper.

:func:`~attn_course.variants.streaming.streaming_losses` (re-exported here) feeds a text one token
at a time through a model with such caches and returns the next-token loss of every token: chapter
09 compares the window alone (``SinkKVCache(window, sinks=0)``, the same outputs as a
:class:`~attn_course.variants.sliding_window.RollingKVCache`) with sinks and window on a long text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from attn_course import _validate
from attn_course.core.kv_cache import KVCache
from attn_course.variants.sliding_window import RollingKVCache

__all__ = ["CachePositions", "SinkKVCache"]


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
    ``sinks + window - 1`` tokens. It holds keys *before* RoPE and rotates them, at every
    :meth:`update`, by their positions inside the cache (:meth:`cache_positions`); without RoPE it is
    a plain cache that forgets.

    Several tokens may be appended at once: the keys returned then reach further back than the last
    new query sees, and :meth:`window_mask` is the mask that lines them up (as
    :meth:`RollingKVCache.window_mask <attn_course.variants.sliding_window.RollingKVCache.window_mask>`
    does). With RoPE, in-cache positions are the same for every query of one append only while
    nothing is evicted yet, so :meth:`new_positions` accepts several tokens only as long as
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
        self._like: tuple | None = None       # empty [B, H_kv, 0, d] keys/values of the first append

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
        :meth:`new_positions` and :meth:`update` use it; call it before the append.

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

        Args, Returns and Raises are :meth:`RollingKVCache.window_mask
        <attn_course.variants.sliding_window.RollingKVCache.window_mask>`'s.

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

    def new_positions(self, new_tokens: int, *, given: torch.Tensor | None = None,
                      device: torch.device | str | None = None) -> torch.Tensor:
        """The in-cache RoPE positions of the next ``new_tokens`` (their queries): ``N_k - N_new .. N_k - 1``.

        Args:
            new_tokens: ``N_new >= 1``.
            given: the caller's positions; only the default text positions ``len .. len + N_new - 1``
                are accepted (and replaced), so a model that always passes them still works.
            device: where to create the tensor.

        Returns:
            ``[N_new]`` int64, :meth:`cache_positions`'s ``queries``.

        Raises:
            TypeError, ValueError: as :meth:`cache_positions`, or ``given`` other than the default.

        Example:
            >>> cache = SinkKVCache(window=4, sinks=4)
            >>> _ = cache.append(torch.zeros(1, 1, 9, 2), torch.zeros(1, 1, 9, 2))   # tokens 0..8
            >>> cache.new_positions(1, given=torch.tensor([9]))                    # token 9 sits at 7 in the cache
            tensor([7])
        """
        if given is not None:
            default = torch.arange(self.length, self.length + new_tokens, device=given.device)      # [N_new]
            if given.shape[-1:] != default.shape or not bool((given == default).all()):
                raise ValueError(
                    f"SinkKVCache.new_positions: positions cannot be given with {self!r}, which assigns RoPE "
                    f"positions inside the cache; leave positions None (only the default "
                    f"{self.length}..{self.length + new_tokens - 1} is accepted), got {given.tolist()}"
                )
        return self.cache_positions(new_tokens, device=device).queries

    def update(self, keys: torch.Tensor, values: torch.Tensor, *, positions: torch.Tensor | None = None,
               rotate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new keys before RoPE; return every held key rotated at its in-cache position ``0 .. N_k - 1``.

        Args:
            keys: ``[B, H_kv, N_new, d_k]``, *not* rotated.
            values: ``[B, H_kv, N_new, d_v]``.
            positions: the queries' positions from :meth:`new_positions` (checked against them), or None.
            rotate: ``rotate(x, positions) -> x`` (a RoPE module), or None: then this is :meth:`append`.

        Returns:
            ``(keys, values)``, ``[B, H_kv, N_k, d]``, in text order, keys rotated at ``0 .. N_k - 1``.

        Raises:
            TypeError, ValueError: as :meth:`append` and :meth:`cache_positions`; ``positions`` other than
                :meth:`new_positions`'s.

        Example:
            >>> cache = SinkKVCache(window=2, sinks=1)
            >>> _ = cache.append(torch.ones(1, 1, 4, 1), torch.zeros(1, 1, 4, 1))    # holds tokens 0 and 3
            >>> keys, _ = cache.update(torch.ones(1, 1, 1, 1), torch.zeros(1, 1, 1, 1),
            ...                        rotate=lambda x, positions: x * positions[:, None])   # a stand-in for RoPE
            >>> keys.flatten().tolist()                                               # at 0, 1, 2 in the cache
            [0.0, 1.0, 2.0]
        """
        if rotate is None:
            return super().update(keys, values)
        where = "SinkKVCache.update"
        self._check_new(where, keys, values, rotate)
        in_cache = self.cache_positions(keys.shape[2], device=keys.device)      # before the append: [N_new], [N_k]
        if positions is not None and not torch.equal(positions.to(in_cache.queries.device), in_cache.queries):
            raise ValueError(f"{where}: positions must be new_positions()'s {in_cache.queries.tolist()}, "
                             f"got {positions.tolist()}")
        keys, values = self._store(keys, values)                                # [B, H_kv, N_k, d], before RoPE
        return rotate(keys, in_cache.keys), values                              # StreamingLLM: in-cache positions

    def _layout(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self._like

    def _store(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the sinks, the held recent tokens and the new ones, in text order (keys before RoPE)."""
        if self._like is None:                  # empty stand-ins: the layout, however the parts are filled
            self._like = (keys.new_empty(*keys.shape[:2], 0, keys.shape[3]),
                          values.new_empty(*values.shape[:2], 0, values.shape[3]))
        if keys.shape[2] == 0:                                                              # nothing new
            return (self.keys, self.values) if self.length else (keys, values)
        # The new tokens at positions below S join the sinks; the others go through the ring.
        to_sinks = min(max(self.sinks - self.length, 0), keys.shape[2])
        returned_keys, returned_values = [], []
        if self._sink_part is not None and (to_sinks or len(self._sink_part)):
            if to_sinks:
                sink_keys, sink_values = self._sink_part._store(keys[:, :, :to_sinks], values[:, :, :to_sinks])
            else:
                sink_keys, sink_values = self._sink_part.keys, self._sink_part.values   # [B, H_kv, S, d]
            returned_keys.append(sink_keys)
            returned_values.append(sink_values)
        if keys.shape[2] > to_sinks:
            recent_keys, recent_values = self._recent_part._store(keys[:, :, to_sinks:], values[:, :, to_sinks:])
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
        self._like = None

    def _filled_parts(self) -> list[KVCache]:
        parts = []
        if self._sink_part is not None and len(self._sink_part):
            parts.append(self._sink_part)
        if len(self._recent_part):
            parts.append(self._recent_part)
        return parts

    def _require_appended(self, name: str) -> None:
        if self.length == 0:
            raise ValueError(f"SinkKVCache.{name}: the cache is empty; append keys and values first")
