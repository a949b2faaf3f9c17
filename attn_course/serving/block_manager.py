"""The paged KV cache's bookkeeping: which block of the cache holds which tokens of which request.

PagedAttention (Kwon et al., 2023) keeps the keys and values of every request in fixed-size blocks of one
shared pool, as an operating system pages memory. A request holds a *block table*, the list of its blocks
in order; it grows by one block at a time, so no request reserves room for the longest answer it might
give, and a finished request's blocks go straight back to the *free list*. The token at position ``p``
lives in block ``table[p // block_size]``, at offset ``p % block_size`` in it: slot
``table[p // block_size] * block_size + p % block_size`` of the pool seen as one long row of slots.

Prefix caching (vLLM's hashed blocks): a full block is named by a hash of its tokens and of every token
before it (each block's hash takes in the previous block's, a chain), so a request that begins with the
same system prompt as an earlier one finds those blocks already computed and shares them, each sharer
holding a reference. A block is named only once the engine says its keys and values are in the cache
(:meth:`BlockManager.cache_full_blocks`). A block whose last reference goes back is free again but keeps
its contents and its name: a later request with the same prefix revives it, until the pool hands it out
for something else (the least recently freed first). A hit never covers a prompt's last token: the model
must run on at least that token to predict the next one.

The tensors live elsewhere (the model runner's cache, ``[num_blocks, block_size, H_kv, d]`` per layer);
this module only decides where tokens go.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from collections.abc import Hashable, Sequence

from attn_course import _validate

__all__ = ["Block", "BlockManager", "prefix_hash"]


def prefix_hash(previous: bytes | None, tokens: Sequence[int]) -> bytes:
    """The name of a full block: SHA-256 of the previous block's name and this block's tokens.

    Two blocks get the same name only if they hold the same tokens after the same prefix (SHA-256: no
    collision is known), so a block found by name holds exactly the keys and values a request would compute.

    Example:
        >>> first = prefix_hash(None, [5, 6])
        >>> prefix_hash(first, [7, 8]) == prefix_hash(prefix_hash(None, [5, 6]), [7, 8])
        True
        >>> prefix_hash(None, [7, 8]) == prefix_hash(first, [7, 8])     # the same tokens after another prefix
        False
    """
    digest = hashlib.sha256(previous or b"")
    digest.update(b"".join(int(token).to_bytes(8, "little", signed=True) for token in tokens))
    return digest.digest()


@dataclasses.dataclass
class Block:
    """One block of the pool: how many block tables hold it, and its name once it is full and cached."""

    block_id: int
    ref_count: int = 0
    name: bytes | None = None


class BlockManager:
    """A pool of ``num_blocks`` blocks of ``block_size`` tokens each, handed out to sequences.

    A sequence is any hashable id (the engine's request number). Its life: :meth:`allocate` with its
    prompt (after :meth:`can_allocate`), :meth:`cache_full_blocks` after each forward pass,
    :meth:`grow` before each new token (after :meth:`can_grow`), :meth:`free` when it finishes or is
    preempted.

    Args:
        num_blocks: blocks in the pool.
        block_size: tokens per block.
        prefix_caching: share full blocks between sequences with the same prefix.

    Raises:
        TypeError/ValueError: ``num_blocks`` or ``block_size`` not a positive int, ``prefix_caching`` not a bool.

    Example:
        >>> manager = BlockManager(num_blocks=8, block_size=4)
        >>> manager.allocate("a", [1, 2, 3, 4, 5, 6])         # 6 tokens: 2 blocks, none cached yet
        0
        >>> manager.block_table("a"), manager.slot("a", 5)
        ([0, 1], 5)
        >>> manager.cache_full_blocks("a", [1, 2, 3, 4, 5, 6])  # its prefill ran: block 0 is full, and named
        >>> manager.allocate("b", [1, 2, 3, 4, 9])            # the same first 4 tokens: block 0 is shared
        4
        >>> manager.block_table("b"), manager.num_free_blocks
        ([0, 2], 5)
    """

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True) -> None:
        where = "BlockManager"
        self.num_blocks = _validate.integer(where, "num_blocks", num_blocks, minimum=1)
        self.block_size = _validate.integer(where, "block_size", block_size, minimum=1)
        self.prefix_caching = _validate.boolean(where, "prefix_caching", prefix_caching)
        self.blocks = [Block(block_id) for block_id in range(num_blocks)]
        # Free blocks, the least recently freed first: a freed block keeps its name as long as possible.
        self._free: collections.OrderedDict[int, None] = collections.OrderedDict.fromkeys(range(num_blocks))
        self._named: dict[bytes, int] = {}                       # block name -> block id
        self._tables: dict[Hashable, list[int]] = {}
        self._names: dict[Hashable, list[bytes]] = {}            # the names of a sequence's first full blocks
        #: Prompt tokens looked up, and found cached, over the pool's life (the prefix-cache hit rate).
        self.prompt_tokens, self.cached_tokens = 0, 0

    # --- what is free ------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds (cached or not)."""
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ⌈num_tokens / block_size⌉."""
        num_tokens = _validate.integer("BlockManager.blocks_for", "num_tokens", num_tokens, minimum=0)
        return -(-num_tokens // self.block_size)

    def _cached_prefix(self, tokens: Sequence[int]) -> list[int]:
        """The ids of the cached blocks that hold ``tokens``' first full blocks, but never its last token."""
        found, name = [], None
        if not self.prefix_caching:
            return found
        for start in range(0, (len(tokens) - 1) // self.block_size * self.block_size, self.block_size):
            name = prefix_hash(name, tokens[start:start + self.block_size])
            block_id = self._named.get(name)
            if block_id is None:
                break
            found.append(block_id)
        return found

    def can_allocate(self, tokens: Sequence[int]) -> bool:
        """Whether the free blocks can hold ``tokens``, counting the blocks already cached.

        A cached block that another sequence holds costs nothing; a cached block that is free must be
        taken off the free list like any other.
        """
        tokens = _validate.integer_sequence("BlockManager.can_allocate", "tokens", tokens, minimum=0)
        return self._fits(tokens, self._cached_prefix(tokens))

    def _fits(self, tokens: list[int], cached: list[int]) -> bool:
        revived = sum(self.blocks[block_id].ref_count == 0 for block_id in cached)
        return self.blocks_for(len(tokens)) - len(cached) + revived <= self.num_free_blocks

    # --- a sequence's life ---------------------------------------------------------------------

    def allocate(self, sequence: Hashable, tokens: Sequence[int]) -> int:
        """Give ``sequence`` the blocks for ``tokens``, its prompt; return how many of them are cached.

        The cached tokens (a multiple of ``block_size``, fewer than ``len(tokens)``) need not be computed
        again: their keys and values are in the blocks the sequence now shares.

        Raises:
            ValueError: ``tokens`` empty, or ``sequence`` already holds blocks.
            RuntimeError: too few free blocks (call :meth:`can_allocate` first).
        """
        where = "BlockManager.allocate"
        tokens = _validate.integer_sequence(where, "tokens", tokens, minimum=0, nonempty=True)
        if sequence in self._tables:
            raise ValueError(f"{where}: sequence {sequence!r} already holds blocks {self._tables[sequence]}")
        cached = self._cached_prefix(tokens)
        if not self._fits(tokens, cached):
            raise RuntimeError(f"{where}: {self.blocks_for(len(tokens))} blocks needed for {len(tokens)} tokens, "
                               f"{self.num_free_blocks} free; call can_allocate first")
        for block_id in cached:
            self._hold(block_id)
        table = cached + [self._take_free() for _ in range(self.blocks_for(len(tokens)) - len(cached))]
        self._tables[sequence] = table
        self._names[sequence] = [self.blocks[block_id].name for block_id in cached]
        self.prompt_tokens += len(tokens)
        self.cached_tokens += len(cached) * self.block_size
        return len(cached) * self.block_size

    def can_grow(self, sequence: Hashable, num_tokens: int) -> bool:
        """Whether ``sequence`` can hold ``num_tokens`` tokens in all with the free blocks."""
        table = self.block_table(sequence)
        return self.blocks_for(num_tokens) - len(table) <= self.num_free_blocks

    def grow(self, sequence: Hashable, num_tokens: int) -> None:
        """Give ``sequence`` the blocks to hold ``num_tokens`` tokens in all (decoding: one more block
        when the newest token starts one).

        Raises:
            RuntimeError: too few free blocks (call :meth:`can_grow` first).
        """
        table = self.block_table(sequence)
        missing = self.blocks_for(num_tokens) - len(table)
        if missing > self.num_free_blocks:
            raise RuntimeError(f"BlockManager.grow: sequence {sequence!r} needs {missing} more blocks for "
                               f"{num_tokens} tokens, {self.num_free_blocks} free; call can_grow first")
        table += [self._take_free() for _ in range(missing)]

    def cache_full_blocks(self, sequence: Hashable, computed: Sequence[int]) -> None:
        """Name the blocks of ``sequence`` that ``computed`` fills: ``computed`` is every token of the
        sequence whose keys and values are now in the cache, in order. Later prompts with this prefix share them."""
        table, names = self.block_table(sequence), self._names[sequence]
        computed = _validate.sequence("BlockManager.cache_full_blocks", "computed", computed, of="ints")
        if not self.prefix_caching:
            return
        for index in range(len(names), min(len(computed) // self.block_size, len(table))):
            start = index * self.block_size
            tokens = _validate.integer_sequence("BlockManager.cache_full_blocks", f"computed[{start}:]",
                                                computed[start:start + self.block_size], minimum=0)
            name = prefix_hash(names[-1] if names else None, tokens)
            names.append(name)
            block = self.blocks[table[index]]
            if name not in self._named and block.name is None:
                block.name = name
                self._named[name] = block.block_id

    def free(self, sequence: Hashable) -> None:
        """Give back every block of ``sequence`` (finished, or preempted to be computed again later)."""
        for block_id in reversed(self.block_table(sequence)):      # its last blocks are evicted first
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        del self._tables[sequence], self._names[sequence]

    # --- where tokens are ---------------------------------------------------------------------

    def block_table(self, sequence: Hashable) -> list[int]:
        """The ids of ``sequence``'s blocks, in order.

        Raises:
            KeyError: ``sequence`` holds no blocks.
        """
        if sequence not in self._tables:
            raise KeyError(f"BlockManager: sequence {sequence!r} holds no blocks")
        return self._tables[sequence]

    def slot(self, sequence: Hashable, position: int) -> int:
        """Where the token at ``position`` of ``sequence`` lives, counting the pool's slots in one row.

        Raises:
            ValueError: ``position`` beyond the sequence's blocks.
        """
        table = self.block_table(sequence)
        position = _validate.integer("BlockManager.slot", "position", position, minimum=0)
        if position >= len(table) * self.block_size:
            raise ValueError(f"BlockManager.slot: position {position} is beyond sequence {sequence!r}'s "
                             f"{len(table)} blocks of {self.block_size}")
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def slots(self, sequence: Hashable, stop: int) -> list[int]:
        """:meth:`slot` of each of ``sequence``'s positions ``0 .. stop - 1``, in order.

        Raises:
            ValueError: ``stop`` beyond the sequence's blocks.
        """
        table = self.block_table(sequence)
        stop = _validate.integer("BlockManager.slots", "stop", stop, minimum=0)
        if stop > len(table) * self.block_size:
            raise ValueError(f"BlockManager.slots: stop {stop} is beyond sequence {sequence!r}'s "
                             f"{len(table)} blocks of {self.block_size}")
        return [block * self.block_size + offset for block in table for offset in range(self.block_size)][:stop]

    # --- the free list ------------------------------------------------------------------------

    def _hold(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]                             # a cached block revived
        block.ref_count += 1

    def _take_free(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.name is not None:                               # evicted: its contents will be overwritten
            del self._named[block.name]
            block.name = None
        block.ref_count = 1
        return block_id
