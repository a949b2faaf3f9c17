"""The paged KV cache's tensors, and each layer's view of them for one forward pass.

:class:`KVPool` holds every layer's keys and values as one row of slots, ``[num_slots, H_kv, d]``, where
slot ``block * block_size + offset`` is offset ``offset`` of block ``block``
(:meth:`~attn_course.serving.block_manager.BlockManager.slot` says which slot a token has). A forward
pass over a batch of sequences hands each layer's attention a :class:`PagedKVCache`: it writes the new
tokens' keys and values into their slots and gathers, for each sequence, the keys and values of its
slots in order. It is a :class:`~attn_course.core.kv_cache.KVCache`, so the course's models run on it
unchanged: their attention neither knows nor cares that a sequence's tokens are scattered over blocks.

Gathering copies each sequence's keys into a contiguous tensor before attending (PagedAttention's kernel
reads the blocks in place instead; on a CPU, for these sizes, the copy is cheap beside the model).
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.core.kv_cache import KVCache

__all__ = ["KVPool", "PagedKVCache"]


class KVPool:
    """Every layer's keys and values, slot by slot: ``keys`` and ``values`` are ``[num_layers, num_slots, H_kv, d]``,
    so ``keys[layer]`` is one layer's ``[num_slots, H_kv, d]``.

    The memory is allocated, not cleared: a slot holds whatever was there until a token is written into it,
    and nothing reads a slot before writing it.

    Args:
        num_layers, num_slots, num_kv_heads, head_dim: the sizes (``num_slots = num_blocks * block_size``).
        dtype: the tensors' dtype.

    Raises:
        TypeError, ValueError: a size that is not an int ``>= 1``, a dtype that is not floating.
        RuntimeError: more memory than the machine can give (PyTorch's allocation error).

    Example:
        >>> pool = KVPool(num_layers=2, num_slots=8, num_kv_heads=1, head_dim=4)
        >>> pool.keys[0].shape, pool.memory_bytes
        (torch.Size([8, 1, 4]), 512)
    """

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32) -> None:
        where = "KVPool"
        num_layers, num_slots, num_kv_heads, head_dim = _validate.integers(
            where, minimum=1, num_layers=num_layers, num_slots=num_slots, num_kv_heads=num_kv_heads, head_dim=head_dim)
        dtype = _validate.floating_dtype(where, "dtype", dtype)
        self.keys = torch.empty(num_layers, num_slots, num_kv_heads, head_dim, dtype=dtype)
        self.values = torch.empty(num_layers, num_slots, num_kv_heads, head_dim, dtype=dtype)

    @property
    def memory_bytes(self) -> int:
        """Bytes of every key and value slot."""
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values))


class PagedKVCache(KVCache):
    """Layer ``layer`` of ``pool``, as one forward pass of ``B`` sequences sees it.

    Sequence ``b`` writes its ``N_new`` new tokens into slots ``write_slots[b]`` and attends to the keys and
    values of slots ``read_slots[b]``, which end with the new ones. Shorter sequences pad ``read_slots`` at
    the end with any slot (the caller's attention mask must hide those keys). ``len(cache)`` is
    ``N_k - N_new``, as for a cache that held ``N_k - N_new`` tokens.

    Args:
        pool: the :class:`KVPool`.
        layer: which layer's tensors.
        write_slots: ``[B, N_new]`` integer slots of the new tokens.
        read_slots: ``[B, N_k]`` integer slots each sequence attends to, in position order.

    Raises:
        TypeError, ValueError: slots that are not integer tensors of those shapes (``N_k >= N_new``), or
            outside the pool; a ``layer`` outside the pool's layers.

    Example:
        >>> pool = KVPool(num_layers=1, num_slots=8, num_kv_heads=1, head_dim=2)
        >>> cache = PagedKVCache(pool, 0, write_slots=torch.tensor([[5, 2]]), read_slots=torch.tensor([[5, 2]]))
        >>> keys, _ = cache.append(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2))
        >>> keys.shape, pool.keys[0][[2, 5]].sum().item()
        (torch.Size([1, 1, 2, 2]), 4.0)
    """

    def __init__(self, pool: KVPool, layer: int, write_slots: torch.Tensor, read_slots: torch.Tensor) -> None:
        super().__init__()
        where = "PagedKVCache"
        self.pool = _validate.instance(where, "pool", pool, KVPool)
        self.layer = _validate.integer(where, "layer", layer, minimum=0)
        if layer >= len(pool.keys):
            raise ValueError(f"{where}: layer must be < the pool's {len(pool.keys)} layers, got {layer}")
        for name, slots in (("write_slots", write_slots), ("read_slots", read_slots)):
            _validate.integer_tensor(where, name, slots)
            if slots.dim() != 2:
                raise ValueError(f"{where}: {name} must be [B, N], got shape {_validate.shape_str(slots)}")
            if slots.numel() and (slots.min() < 0 or slots.max() >= pool.keys[0].shape[0]):
                raise ValueError(f"{where}: {name} must lie in 0..{pool.keys[0].shape[0] - 1}, got values from "
                                 f"{int(slots.min())} to {int(slots.max())}")
        if write_slots.shape[0] != read_slots.shape[0] or read_slots.shape[1] < write_slots.shape[1]:
            raise ValueError(f"{where}: write_slots [B, N_new] and read_slots [B, N_k] need one B and N_k >= N_new, "
                             f"got {_validate.shape_str(write_slots)} and {_validate.shape_str(read_slots)}")
        self.write_slots, self.read_slots = write_slots, read_slots
        self.length = read_slots.shape[1] - write_slots.shape[1]

    def _layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        # New entries must have this step's B and the pool's H_kv, d and dtype.
        batch = self.write_slots.shape[0]
        return tuple(tensors[self.layer].new_empty(batch, *tensors[self.layer].shape[1:2], 0,
                                                   tensors[self.layer].shape[2])
                     for tensors in (self.pool.keys, self.pool.values))

    def _store(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new entries into their slots; gather each sequence's slots, ``[B, H_kv, N_k, d]``."""
        if keys.shape[2] != self.write_slots.shape[1]:
            raise ValueError(f"PagedKVCache: {keys.shape[2]} new tokens, but write_slots has "
                             f"{self.write_slots.shape[1]} per sequence")
        pool_keys, pool_values = self.pool.keys[self.layer], self.pool.values[self.layer]   # [S, H_kv, d]
        written, read = self.write_slots.flatten(), self.read_slots.flatten()
        pool_keys.index_copy_(0, written, keys.transpose(1, 2).flatten(0, 1))        # [B * N_new, H_kv, d]
        pool_values.index_copy_(0, written, values.transpose(1, 2).flatten(0, 1))
        shape = (*self.read_slots.shape, *pool_keys.shape[1:])                       # [B, N_k, H_kv, d]
        return (pool_keys.index_select(0, read).view(shape).transpose(1, 2),
                pool_values.index_select(0, read).view(shape).transpose(1, 2))
