"""A key/value cache for decoding one token at a time.

When a language model generates token ``t``, the keys and values of tokens ``0..t-1``
are the same as at the previous step: only the newest token's must be computed. The
cache keeps them.

Memory layout: one tensor for keys and one for values, each
``[B, H_kv, capacity, d]``, where ``H_kv`` is the number of key/value heads (fewer than
the query heads with grouped-query attention). The first ``length`` positions along
dimension 2 are filled. When an append would overflow, the capacity doubles (a new
buffer, one copy), like a Python list, so appending ``N`` tokens one by one costs
``O(N)`` copies in total. Pass ``max_length`` to allocate once and never copy.

Bytes held: ``2 · B · H_kv · capacity · d · bytes_per_element``, the reason multi-query
and grouped-query attention (small ``H_kv``) matter for long contexts.
"""

from __future__ import annotations

import torch

from attn_course import _validate

__all__ = ["KVCache"]


class KVCache:
    """Growing storage of past keys and values, ``[B, H_kv, N, d]`` each.

    Args:
        max_length: optional capacity to allocate at the first append; it grows
            (doubling) only if exceeded.

    Example:
        >>> cache = KVCache()
        >>> keys, values = cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
        >>> keys, values = cache.append(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
        >>> len(cache), keys.shape
        (4, torch.Size([1, 2, 4, 4]))
    """

    #: How :class:`~attn_course.core.multihead.MultiHeadAttention` applies RoPE with this cache. ``False``
    #: (here): it rotates the new keys by their positions in the text before :meth:`append`, so the
    #: cache holds rotated keys. ``True`` (:class:`~attn_course.variants.attention_sinks.SinkKVCache`): the
    #: cache holds keys before the rotation and numbers the tokens it holds itself; the attention asks
    #: it for those positions (``cache_positions(N_new)``, queries and keys) and rotates the new
    #: queries, and the keys that :meth:`append` returns, by them.
    positions_in_cache: bool = False

    def __init__(self, max_length: int | None = None) -> None:
        self.max_length = (
            None if max_length is None else _validate.integer("KVCache", "max_length", max_length, minimum=1)
        )
        self._keys: torch.Tensor | None = None       # [B, H_kv, capacity, d_k]
        self._values: torch.Tensor | None = None     # [B, H_kv, capacity, d_v]
        self.length = 0

    def __len__(self) -> int:
        return self.length

    @property
    def capacity(self) -> int:
        return 0 if self._keys is None else self._keys.shape[2]

    @property
    def memory_bytes(self) -> int:
        """Bytes allocated for keys and values (capacity, not just the filled part)."""
        if self._keys is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (self._keys, self._values))

    @property
    def keys(self) -> torch.Tensor:
        """The cached keys, ``[B, H_kv, length, d_k]`` (a view, no copy)."""
        self._require_filled("keys")
        return self._keys[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        """The cached values, ``[B, H_kv, length, d_v]`` (a view, no copy)."""
        self._require_filled("values")
        return self._values[:, :, : self.length]

    def attended_length(self, new_tokens: int) -> int:
        """How many keys :meth:`append` will return after ``new_tokens`` more: ``len(self) + new_tokens``.

        ``len(cache)`` counts every token appended (the position of the next one); this counts
        the keys the new queries see. Here they agree; a cache that forgets (the rolling cache of
        :mod:`attn_course.variants.sliding_window`) returns fewer keys than it has seen, and
        :class:`~attn_course.core.multihead.MultiHeadAttention` sizes masks by this number.

        Args:
            new_tokens: ``N_new``, the tokens about to be appended.

        Returns:
            ``N_k``, the length of the keys and values that append will return.

        Raises:
            TypeError, ValueError: ``new_tokens`` not an int ``>= 0``.

        Example:
            >>> cache = KVCache()
            >>> _ = cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
            >>> cache.attended_length(1)
            4
        """
        return self.length + _validate.integer("KVCache.attended_length", "new_tokens", new_tokens, minimum=0)

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the keys/values of new tokens; return all cached keys and values.

        Args:
            keys: ``[B, H_kv, N_new, d_k]``.
            values: ``[B, H_kv, N_new, d_v]``.

        Returns:
            ``(keys, values)`` of every cached token, ``[B, H_kv, length, d]``.

        Raises:
            TypeError, ValueError: inputs that are not 4-D floating tensors of one dtype and
                device, or that do not match what the cache already holds.
        """
        where = "KVCache.append"
        _validate.four_d(where, layout="[B, H_kv, N_new, d]", keys=keys, values=values)
        if keys.shape[:3] != values.shape[:3]:
            raise ValueError(
                f"{where}: keys and values must be [B, H_kv, N_new, d] with the same B, H_kv and "
                f"N_new, got keys {_validate.shape_str(keys)} and values {_validate.shape_str(values)}"
            )
        if self._keys is not None:
            expected = (self._keys.shape[:2], self._keys.shape[3], self._values.shape[3])
            got = (keys.shape[:2], keys.shape[3], values.shape[3])
            if got != expected or keys.dtype != self._keys.dtype or keys.device != self._keys.device:
                raise ValueError(
                    f"{where}: new keys {_validate.shape_str(keys)} / values {_validate.shape_str(values)} "
                    f"({keys.dtype}) do not match the cache's [B, H_kv, ·, d] = "
                    f"{_validate.shape_str(self._keys)} / {_validate.shape_str(self._values)} "
                    f"({self._keys.dtype})"
                )
        needed = self.length + keys.shape[2]
        if needed > self.capacity:
            self._grow(needed, keys, values)
        self._keys[:, :, self.length : needed] = keys
        self._values[:, :, self.length : needed] = values
        self.length = needed
        return self.keys, self.values

    def reset(self) -> None:
        """Forget every cached token (keeps nothing allocated)."""
        self._keys = self._values = None
        self.length = 0

    def _grow(self, needed: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        capacity = max(needed, 2 * self.capacity, self.max_length or 0)
        batch, heads = keys.shape[:2]
        new_keys = keys.new_empty(batch, heads, capacity, keys.shape[3])
        new_values = values.new_empty(batch, heads, capacity, values.shape[3])
        if self.length:
            new_keys[:, :, : self.length] = self.keys
            new_values[:, :, : self.length] = self.values
        self._keys, self._values = new_keys, new_values

    def _require_filled(self, name: str) -> None:
        if self._keys is None:
            raise ValueError(f"KVCache.{name}: the cache is empty; append keys and values first")
