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

How :class:`~attn_course.core.multihead.MultiHeadAttention` talks to a cache, whatever its kind:
it sizes its mask by :meth:`KVCache.attended_length`, asks :meth:`KVCache.new_positions` where
the new tokens sit (to rotate their queries with RoPE), and hands :meth:`KVCache.update` the new
keys *before* RoPE with the rotation to apply. This cache rotates each new key once, at its
position, and keeps it so. A cache that numbers positions its own way (the attention sinks of
chapter 09 rotate every held key by its place in the cache) overrides these methods; the
attention does not know which cache it was given.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_course import _validate

__all__ = ["KVCache", "check_new_entries"]


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
    def held(self) -> int:
        """Tokens held now; here every token appended (a cache that forgets holds fewer)."""
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
        """How many keys :meth:`append` will return after ``new_tokens`` more: ``held + new_tokens``.

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
        where = f"{type(self).__name__}.attended_length"
        return self.held + _validate.integer(where, "new_tokens", new_tokens, minimum=0)

    def new_positions(self, new_tokens: int, *, given: torch.Tensor | None = None,
                      device: torch.device | str | None = None) -> torch.Tensor:
        """The RoPE positions of the next ``new_tokens``: ``given``, else ``len(self) .. len(self) + N_new - 1``.

        Args:
            new_tokens: ``N_new >= 1``, the tokens about to be added.
            given: the caller's own positions, ``[N_new]`` or ``[B, N_new]`` (a left-padded batch);
                this cache takes them as they are.
            device: where to create the default.

        Returns:
            ``[N_new]`` (or ``given``'s ``[B, N_new]``) integer positions.

        Raises:
            TypeError, ValueError: ``new_tokens`` not an int ``>= 1``.

        Example:
            >>> cache = KVCache()
            >>> _ = cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
            >>> cache.new_positions(2)
            tensor([3, 4])
        """
        new_tokens = _validate.integer("KVCache.new_positions", "new_tokens", new_tokens, minimum=1)
        if given is not None:
            return given
        return torch.arange(self.length, self.length + new_tokens, device=device)      # new tokens follow the cache

    def update(self, keys: torch.Tensor, values: torch.Tensor, *, positions: torch.Tensor | None = None,
               rotate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens' keys and values; return the keys and values the new queries attend to.

        Args:
            keys: ``[B, H_kv, N_new, d_k]``, before RoPE when ``rotate`` is given.
            values: ``[B, H_kv, N_new, d_v]``.
            positions: the new tokens' positions from :meth:`new_positions` (its default when None).
            rotate: ``rotate(x [B, H_kv, N, d_k], positions) -> x`` rotated (a
                :class:`~attn_course.positions.rope.RotaryEmbedding`), or None without RoPE.

        Returns:
            ``(keys, values)`` of every cached token, ``[B, H_kv, length, d]``, keys rotated.

        Raises:
            TypeError, ValueError: as :meth:`append`, or a ``rotate`` that is not callable.

        Example:
            >>> cache = KVCache()
            >>> keys, _ = cache.update(torch.ones(1, 1, 2, 1), torch.ones(1, 1, 2, 1),
            ...                        rotate=lambda x, positions: x * positions[:, None])   # a stand-in for RoPE
            >>> keys.flatten().tolist()
            [0.0, 1.0]
        """
        self._check_new(f"{type(self).__name__}.update", keys, values, rotate)
        if rotate is not None:
            if positions is None:
                positions = self.new_positions(keys.shape[2], device=keys.device)
            # A key's rotation depends only on its own position: rotated once here, it never needs redoing.
            keys = rotate(keys, positions)                                          # [B, H_kv, N_new, d_k]
        return self._store(keys, values)

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
        self._check_new(f"{type(self).__name__}.append", keys, values)
        return self._store(keys, values)

    def reset(self) -> None:
        """Forget every cached token (keeps nothing allocated)."""
        self._keys = self._values = None
        self.length = 0

    # What a cache of another kind changes: where the entries go (_store) and what they must match (_layout).
    def _check_new(self, where: str, keys: object, values: object, rotate: object = None) -> None:
        """The one check of :meth:`update`'s and :meth:`append`'s inputs."""
        if rotate is not None and not callable(rotate):
            raise TypeError(f"{where}: rotate must be callable (x, positions) -> x, got {type(rotate).__name__}")
        check_new_entries(where, keys, values, like=self._layout())

    def _layout(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Keys and values whose ``B``, ``H_kv``, ``d``, dtype and device new entries must share; None when empty."""
        return None if self._keys is None else (self._keys, self._values)

    def _store(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append checked entries; return the keys and values the new queries attend to."""
        if self._keys is None and keys.shape[2] == 0:
            return keys, values               # no token yet: nothing to allocate (the first one sizes it)
        needed = self.length + keys.shape[2]
        if needed > self.capacity:
            self._grow(needed, keys, values)
        self._keys[:, :, self.length : needed] = keys
        self._values[:, :, self.length : needed] = values
        self.length = needed
        return self.keys, self.values

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


def check_new_entries(where: str, keys: object, values: object, *,
                      like: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Check new keys and values for a cache: ``[B, H_kv, N_new, d]`` each, matching what it holds.

    Args:
        where: the name that error messages start with (the public method that was called).
        keys, values: ``[B, H_kv, N_new, d_k]`` and ``[B, H_kv, N_new, d_v]``.
        like: keys and values the cache already holds (any length along dimension 2), or None.

    Raises:
        TypeError, ValueError: not 4-D floating tensors of one dtype and device, different
            ``B``/``H_kv``/``N_new``, or ``B``, ``H_kv``, ``d``, dtype or device other than ``like``'s.

    Example:
        >>> held = (torch.zeros(1, 2, 0, 4), torch.zeros(1, 2, 0, 4))
        >>> check_new_entries("demo", torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), like=held)
    """
    _validate.four_d(where, layout="[B, H_kv, N_new, d]", keys=keys, values=values)
    if keys.shape[:3] != values.shape[:3]:
        raise ValueError(
            f"{where}: keys and values must be [B, H_kv, N_new, d] with the same B, H_kv and "
            f"N_new, got keys {_validate.shape_str(keys)} and values {_validate.shape_str(values)}"
        )
    if like is None:
        return
    held_keys, held_values = like
    expected = (held_keys.shape[:2], held_keys.shape[3], held_values.shape[3], held_keys.dtype, held_keys.device)
    if (keys.shape[:2], keys.shape[3], values.shape[3], keys.dtype, keys.device) != expected:
        batch, heads = held_keys.shape[:2]
        raise ValueError(
            f"{where}: new keys {_validate.shape_str(keys)} / values {_validate.shape_str(values)} "
            f"({keys.dtype}, {keys.device}) do not match the cache's [B, H_kv, ·, d] = "
            f"[{batch}, {heads}, ·, {held_keys.shape[3]}] / [{batch}, {heads}, ·, {held_values.shape[3]}] "
            f"({held_keys.dtype}, {held_keys.device})"
        )
