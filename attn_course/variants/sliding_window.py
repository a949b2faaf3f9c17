"""Sliding-window attention with a rolling key/value cache: memory fixed at the window, however long the text.

Under a sliding window of ``W`` (Mistral, Longformer's local attention), query ``i`` sees keys
``j`` with ``i - W < j <= i`` (:func:`~attn_course.variants.masks.sliding_window_mask`): itself and the
``W - 1`` tokens before it. So when decoding, a key older than ``W - 1`` tokens will never be
looked at again, and a cache may forget it. :class:`RollingKVCache` keeps only the last ``W - 1``
keys and values; with the token being decoded that is exactly the ``W`` keys its query sees.
(Hugging Face's ``DynamicSlidingWindowLayer`` keeps the same ``W - 1``.)

Memory layout: a ring of ``W - 1`` slots per tensor, ``[B, H_kv, W - 1, d]``, allocated at the
first append and never grown: the token at position ``p`` lives in slot ``p mod (W - 1)``,
overwriting the one ``W - 1`` positions before it (the "rolling buffer" of the Mistral paper,
Jiang et al. 2023). Bytes held: ``2 · B · H_kv · (W - 1) · d · bytes_per_element``, after ten
tokens or after a million.

How it lines up with positions and masks:

- ``len(cache)`` counts every token ever appended, so it stays the position of the next token
  (RoPE rotates by absolute positions, and the keys in the ring were rotated when they arrived).
- :meth:`RollingKVCache.append` returns the held keys in position order followed by the new
  ones: ``N_k = min(len(cache), W - 1) + N_new`` contiguous positions, the newest last
  (:meth:`~RollingKVCache.attended_length` says how many before the call). A causal mask is
  therefore bottom-right aligned, as :class:`~attn_course.core.multihead.MultiHeadAttention`'s
  ``is_causal`` is, and the window is :meth:`~RollingKVCache.window_mask`, the same
  :func:`~attn_course.variants.masks.sliding_window_mask` over those ``N_k`` keys. Decoding one token at
  a time needs no window mask (the cache returns exactly the window); appending several at once
  does (the last new query would otherwise see more than ``W`` keys).
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.core.kv_cache import KVCache
from attn_course.variants.masks import sliding_window_mask

__all__ = ["RollingKVCache"]


class RollingKVCache(KVCache):
    """A :class:`~attn_course.core.kv_cache.KVCache` that keeps only the last ``window - 1`` tokens.

    Usable wherever a ``KVCache`` is (it is one): ``len(cache)`` is the number of tokens appended
    so far, which is the position of the next one, and :meth:`append` returns the keys and values
    the new queries attend to. Unlike a ``KVCache`` those are not all the tokens seen, only the
    last ``window - 1`` and the new ones; the memory stays at ``window - 1`` tokens.

    Args:
        window: ``W``, how many keys each query sees under the sliding window, itself included
            (``>= 1``; with ``1`` the cache holds nothing and each token sees only itself).

    Raises:
        TypeError: ``window`` not an int.
        ValueError: ``window`` below 1.

    Example:
        >>> cache = RollingKVCache(window=3)
        >>> for _ in range(5):
        ...     keys, values = cache.append(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
        >>> len(cache), keys.shape[2], cache.capacity      # 5 seen, 3 attended to, 2 held
        (5, 3, 2)
    """

    def __init__(self, window: int) -> None:
        super().__init__()
        self.window = _validate.integer("RollingKVCache", "window", window, minimum=1)
        self._ring_keys: torch.Tensor | None = None     # [B, H_kv, W - 1, d_k]
        self._ring_values: torch.Tensor | None = None   # [B, H_kv, W - 1, d_v]

    def __repr__(self) -> str:
        return f"RollingKVCache(window={self.window}, seen={self.length}, held={self.held})"

    @property
    def held(self) -> int:
        """How many tokens the cache holds now: ``min(len(cache), window - 1)``."""
        return min(self.length, self.window - 1)

    @property
    def capacity(self) -> int:
        """Slots allocated: ``window - 1`` after the first append, 0 before."""
        return 0 if self._ring_keys is None else self._ring_keys.shape[2]

    @property
    def memory_bytes(self) -> int:
        """Bytes allocated for keys and values: the ring, ``window - 1`` tokens, however many were seen."""
        if self._ring_keys is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (self._ring_keys, self._ring_values))

    @property
    def keys(self) -> torch.Tensor:
        """The held keys in position order, oldest first, ``[B, H_kv, held, d_k]`` (a copy once the ring wraps)."""
        self._require_appended("keys")
        return self._in_order(self._ring_keys)

    @property
    def values(self) -> torch.Tensor:
        """The held values in position order, oldest first, ``[B, H_kv, held, d_v]``."""
        self._require_appended("values")
        return self._in_order(self._ring_values)

    def window_mask(self, new_tokens: int, *, device: torch.device | str | None = None) -> torch.Tensor:
        """The sliding-window mask for the keys that the next :meth:`append` of ``new_tokens`` returns.

        Call it *before* that append (it depends on what the cache holds now). The returned keys are
        contiguous positions ending with the new tokens, so this is
        ``sliding_window_mask(N_new, N_k, window=window)`` with the queries the last ``N_new`` keys.

        Args:
            new_tokens: ``N_new >= 1``, the tokens about to be appended (the queries).
            device: where to create the mask.

        Returns:
            ``[N_new, N_k]`` boolean tensor (True = may attend), ``N_k = attended_length(N_new)``.

        Raises:
            TypeError, ValueError: ``new_tokens`` not an int ``>= 1``.

        Example:
            >>> cache = RollingKVCache(window=2)
            >>> _ = cache.append(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))   # holds position 4
            >>> cache.window_mask(3).int()                                          # keys at 4, 5, 6, 7
            tensor([[1, 1, 0, 0],
                    [0, 1, 1, 0],
                    [0, 0, 1, 1]], dtype=torch.int32)
        """
        new_tokens = _validate.integer("RollingKVCache.window_mask", "new_tokens", new_tokens, minimum=1)
        return sliding_window_mask(new_tokens, self.held + new_tokens, window=self.window, device=device)

    def _layout(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if self._ring_keys is None else (self._ring_keys, self._ring_values)

    def _store(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the held tokens and the new ones, in position order; keep the last ``window - 1``."""
        if self._ring_keys is None:
            batch, heads = keys.shape[:2]
            slots = self.window - 1
            self._ring_keys = keys.new_empty(batch, heads, slots, keys.shape[3])       # [B, H_kv, W-1, d_k]
            self._ring_values = values.new_empty(batch, heads, slots, values.shape[3])  # [B, H_kv, W-1, d_v]
        attended_keys = torch.cat([self._in_order(self._ring_keys), keys], dim=2)       # [B, H_kv, N_k, d_k]
        attended_values = torch.cat([self._in_order(self._ring_values), values], dim=2)  # [B, H_kv, N_k, d_v]

        # Only the last W - 1 new tokens can be seen again; each overwrites the token W - 1 before it.
        slots, new = self.window - 1, keys.shape[2]
        kept = min(new, slots)
        if kept:
            end = self.length + new
            where_to = torch.arange(end - kept, end, device=keys.device) % slots          # [kept], distinct
            self._ring_keys.index_copy_(2, where_to, keys[:, :, new - kept:])
            self._ring_values.index_copy_(2, where_to, values[:, :, new - kept:])
        self.length += new
        return attended_keys, attended_values

    def reset(self) -> None:
        """Forget every token and the count of positions (keeps nothing allocated)."""
        super().reset()
        self._ring_keys = self._ring_values = None

    def _in_order(self, ring: torch.Tensor) -> torch.Tensor:
        """The ring's held tokens, oldest first: ``[B, H_kv, held, d]``."""
        slots = self.window - 1
        if self.length <= slots:
            return ring[:, :, : self.length]                          # not wrapped yet: slots 0..len-1
        if slots == 0:
            return ring                                               # window 1: nothing is ever held
        start = self.length % slots                                   # the slot of the oldest token
        return torch.cat([ring[:, :, start:], ring[:, :, :start]], dim=2)

    def _require_appended(self, name: str) -> None:
        if self._ring_keys is None:
            raise ValueError(f"RollingKVCache.{name}: the cache is empty; append keys and values first")
