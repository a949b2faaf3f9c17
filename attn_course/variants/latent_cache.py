"""What multi-head latent attention caches per token: the latent ``c_KV`` and the one rotary key ``k_R``.

Multi-head attention caches ``2·H·d_h`` numbers per token and layer; MLA
(:class:`~attn_course.variants.latent_attention.MultiHeadLatentAttention`) caches ``d_c + d_R``, whatever the
number of heads, and rebuilds every head's keys and values from them.
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.core.kv_cache import KVCache

__all__ = ["LatentCache"]


class LatentCache:
    """What MLA keeps per token: the latent ``c_KV [B, N, d_c]`` and the rotary key ``k_R [B, N, d_R]``.

    Nothing per head is stored: that is the point of MLA. The two tensors live in a
    :class:`~attn_course.core.kv_cache.KVCache` as one-"head" keys and values (so they grow the same way,
    doubling), and come back without that head axis.

    Args:
        max_length: optional capacity to allocate at the first append.

    Raises:
        TypeError, ValueError: ``max_length`` not a positive int.

    Example:
        >>> cache = LatentCache()
        >>> latent, rope_key = cache.append(torch.zeros(1, 3, 16), torch.zeros(1, 3, 4))
        >>> latent, rope_key = cache.append(torch.ones(1, 1, 16), torch.ones(1, 1, 4))
        >>> len(cache), latent.shape, rope_key.shape, cache.stored_bytes
        (4, torch.Size([1, 4, 16]), torch.Size([1, 4, 4]), 320)
    """

    def __init__(self, max_length: int | None = None) -> None:
        self._store = KVCache(max_length)            # keys: c_KV [B, 1, ·, d_c]; values: k_R [B, 1, ·, d_R]

    def __len__(self) -> int:
        return len(self._store)

    @property
    def latent(self) -> torch.Tensor:
        """The cached ``c_KV``, ``[B, N, d_c]`` (a view)."""
        return self._store.keys[:, 0]

    @property
    def rope_key(self) -> torch.Tensor:
        """The cached rotated ``k_R``, ``[B, N, d_R]`` (a view)."""
        return self._store.values[:, 0]

    @property
    def stored_bytes(self) -> int:
        """Bytes of what the cache holds now (``length`` tokens): ``B · N · (d_c + d_R) · bytes per element``."""
        if len(self) == 0:
            return 0
        return self.latent.nbytes + self.rope_key.nbytes

    @property
    def memory_bytes(self) -> int:
        """Bytes allocated (the capacity, which may exceed what is filled)."""
        return self._store.memory_bytes

    def append(self, latent: torch.Tensor, rope_key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' latents and rotary keys; return everything cached.

        Args:
            latent: ``c_KV [B, N_new, d_c]``.
            rope_key: ``k_R [B, N_new, d_R]``, already rotated to its position.

        Returns:
            ``(latent [B, N, d_c], rope_key [B, N, d_R])`` of every cached token.

        Raises:
            TypeError, ValueError: inputs that are not 3-D floating tensors with the same ``B`` and
                ``N_new`` on one dtype and device, or that do not match what is already cached.
        """
        where = "LatentCache.append"
        latent = _validate.floating_tensor(where, "latent", latent)
        rope_key = _validate.floating_tensor(where, "rope_key", rope_key)
        if latent.dim() != 3 or rope_key.dim() != 3 or latent.shape[:2] != rope_key.shape[:2]:
            raise ValueError(f"{where}: latent must be [B, N_new, d_c] and rope_key [B, N_new, d_R] with the same "
                             f"B and N_new, got {_validate.shape_str(latent)} and {_validate.shape_str(rope_key)}")
        _validate.same_dtype_and_device(where, latent=latent, rope_key=rope_key)
        self._store.append(latent[:, None], rope_key[:, None])           # [B, 1, N_new, ·]
        return self.latent, self.rope_key

    def reset(self) -> None:
        """Forget every cached token."""
        self._store.reset()
