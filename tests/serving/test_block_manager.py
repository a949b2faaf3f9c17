"""The paged cache's bookkeeping against a simulated pool of slots.

The reference is the property a paged cache exists for: reading a sequence's slots, through its block
table, gives back exactly the tokens it computed, in order, whatever other sequences came, shared
prefixes, went and were evicted meanwhile. Each test writes a token id where the engine would write its
keys and values, and reads them back.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_course.serving import BlockManager, prefix_hash


class SimulatedPool:
    """The slots of the cache, each holding the token whose keys and values were written there."""

    def __init__(self, manager: BlockManager) -> None:
        self.manager = manager
        self.slots: list[int | None] = [None] * (manager.num_blocks * manager.block_size)
        self.tokens: dict[int, list[int]] = {}          # each live sequence's tokens
        self.computed: dict[int, int] = {}              # how many of them are in the pool

    def admit(self, sequence: int, prompt: list[int]) -> int:
        cached = self.manager.allocate(sequence, prompt)
        self.tokens[sequence], self.computed[sequence] = list(prompt), cached
        return cached

    def compute(self, sequence: int, upto: int) -> None:
        """A forward pass over the sequence's tokens ``computed .. upto``: their keys and values written."""
        for position in range(self.computed[sequence], upto):
            self.slots[self.manager.slot(sequence, position)] = self.tokens[sequence][position]
        self.computed[sequence] = upto
        self.manager.cache_full_blocks(sequence, self.tokens[sequence][:upto])

    def decode(self, sequence: int, token: int) -> None:
        self.tokens[sequence].append(token)
        self.manager.grow(sequence, len(self.tokens[sequence]))

    def finish(self, sequence: int) -> None:
        self.manager.free(sequence)
        del self.tokens[sequence], self.computed[sequence]

    def check(self) -> None:
        manager = self.manager
        for sequence, tokens in self.tokens.items():
            read = [self.slots[manager.slot(sequence, position)] for position in range(self.computed[sequence])]
            assert read == tokens[:self.computed[sequence]], sequence
        holders = {}
        for sequence in self.tokens:
            for block_id in manager.block_table(sequence):
                holders[block_id] = holders.get(block_id, 0) + 1
        assert [block.ref_count for block in manager.blocks] == [holders.get(b, 0) for b in range(manager.num_blocks)]
        assert manager.num_free_blocks == sum(count == 0 for count in (holders.get(b, 0)
                                                                       for b in range(manager.num_blocks)))


def test_the_docstring_walkthrough_in_slots():
    manager = BlockManager(num_blocks=8, block_size=4)
    pool = SimulatedPool(manager)
    assert pool.admit(0, [1, 2, 3, 4, 5, 6]) == 0
    assert [manager.slot(0, p) for p in range(6)] == [0, 1, 2, 3, 4, 5]
    pool.compute(0, 6)
    assert pool.admit(1, [1, 2, 3, 4, 9]) == 4                  # block 0 shared, its 4 tokens not recomputed
    assert manager.block_table(1)[0] == manager.block_table(0)[0]
    assert manager.blocks[manager.block_table(0)[0]].ref_count == 2
    pool.compute(1, 5)
    pool.check()


def test_slots_at_block_edges():
    manager = BlockManager(num_blocks=6, block_size=4)
    manager.allocate("x", list(range(9)))                     # 9 tokens: 3 blocks
    table = manager.block_table("x")
    assert [manager.slot("x", p) for p in (3, 4, 8)] == [table[0] * 4 + 3, table[1] * 4, table[2] * 4]
    with pytest.raises(ValueError, match="position 12 is beyond sequence 'x'"):
        manager.slot("x", 12)
    assert manager.slots("x", 9) == [manager.slot("x", p) for p in range(9)]
    with pytest.raises(ValueError, match="stop 13 is beyond sequence 'x'"):
        manager.slots("x", 13)


def test_a_hit_never_covers_the_last_prompt_token():
    manager = BlockManager(num_blocks=8, block_size=4)
    pool = SimulatedPool(manager)
    pool.admit(0, [1, 2, 3, 4, 5, 6, 7, 8])
    pool.compute(0, 8)
    # The same 8 tokens: its second block holds the last token, which must be computed to predict the next.
    assert pool.admit(1, [1, 2, 3, 4, 5, 6, 7, 8]) == 4
    assert pool.admit(2, [1, 2, 3, 4]) == 0
    assert (manager.prompt_tokens, manager.cached_tokens) == (20, 4)


def test_a_freed_block_keeps_its_prefix_until_the_pool_needs_it():
    manager = BlockManager(num_blocks=3, block_size=2)
    pool = SimulatedPool(manager)
    pool.admit(0, [7, 8, 9])
    pool.compute(0, 3)
    first = manager.block_table(0)[0]
    pool.finish(0)
    assert manager.num_free_blocks == 3
    assert pool.admit(1, [7, 8, 1]) == 2 and manager.block_table(1)[0] == first       # revived
    pool.compute(1, 3)
    pool.finish(1)
    # Three blocks for a prompt that shares nothing: the least recently freed go first, the named one last.
    assert pool.admit(2, [4, 4, 4, 4, 4]) == 0
    assert manager.block_table(2)[-1] == first
    pool.compute(2, 5)
    pool.finish(2)
    assert pool.admit(3, [7, 8, 1]) == 0                       # evicted: computed again
    pool.check()


def test_requests_wait_for_blocks_instead_of_failing_midway():
    manager = BlockManager(num_blocks=4, block_size=4)
    manager.allocate("a", list(range(10)))                    # 3 blocks
    assert not manager.can_allocate(list(range(100, 108)))   # 2 needed, 1 free
    with pytest.raises(RuntimeError, match="2 blocks needed for 8 tokens, 1 free; call can_allocate first"):
        manager.allocate("b", list(range(100, 108)))
    assert manager.can_grow("a", 16) and not manager.can_grow("a", 17)
    with pytest.raises(RuntimeError, match="needs 2 more blocks for 17 tokens, 1 free"):
        manager.grow("a", 17)
    manager.grow("a", 16)
    assert manager.num_free_blocks == 0


def test_prefix_caching_off_shares_nothing():
    manager = BlockManager(num_blocks=8, block_size=2, prefix_caching=False)
    pool = SimulatedPool(manager)
    pool.admit(0, [1, 2, 3, 4, 5])
    pool.compute(0, 5)
    assert pool.admit(1, [1, 2, 3, 4, 5]) == 0
    assert not set(manager.block_table(0)) & set(manager.block_table(1))


def test_the_name_of_a_block_is_its_whole_prefix():
    assert prefix_hash(prefix_hash(None, [1, 2]), [3, 4]) != prefix_hash(prefix_hash(None, [2, 1]), [3, 4])
    assert prefix_hash(None, [1, 2]) != prefix_hash(None, [1, 2, 0])
    assert len(prefix_hash(None, [])) == 32


@pytest.mark.parametrize("call, error, message", [
    (lambda: BlockManager(0, 4), ValueError, "num_blocks must be >= 1, got 0"),
    (lambda: BlockManager(4, 2.0), TypeError, "block_size must be an int, got float"),
    (lambda: BlockManager(4, 2, prefix_caching=1), TypeError, "prefix_caching must be a bool, got int"),
    (lambda: BlockManager(4, 2).allocate("a", []), ValueError, "tokens must not be empty"),
    (lambda: BlockManager(4, 2).allocate("a", [1, -2]), ValueError, r"tokens\[1\] must be >= 0, got -2"),
    (lambda: BlockManager(4, 2).allocate("a", "abc"), TypeError, "tokens must be a sequence of ints, got str"),
    (lambda: BlockManager(4, 2).block_table("nobody"), KeyError, "sequence 'nobody' holds no blocks"),
])
def test_bad_input_is_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_a_sequence_cannot_be_allocated_twice():
    manager = BlockManager(4, 2)
    manager.allocate("a", [1])
    with pytest.raises(ValueError, match=r"sequence 'a' already holds blocks \[0\]"):
        manager.allocate("a", [1])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(4, 24))
def test_every_sequence_reads_back_its_own_tokens_through_its_block_table(seed, block_size, num_blocks):
    """Requests with shared prefixes come, decode, finish and are preempted at random; after every event
    each live sequence's slots hold exactly its computed tokens, and the reference counts are the tables'."""
    rng = random.Random(seed)
    manager = BlockManager(num_blocks, block_size)
    pool = SimulatedPool(manager)
    prefixes = [[rng.randrange(5) for _ in range(rng.randrange(1, 9))] for _ in range(3)]
    next_id = 0
    for _ in range(40):
        event = rng.random()
        if event < 0.35 or not pool.tokens:
            prompt = rng.choice(prefixes)[:] + [rng.randrange(5) for _ in range(rng.randrange(0, 6))]
            if manager.can_allocate(prompt):
                cached = pool.admit(next_id, prompt)
                assert cached % block_size == 0 and cached < len(prompt)
                pool.compute(next_id, rng.randrange(cached + 1, len(prompt) + 1))     # a chunk of the prefill
                next_id += 1
        elif event < 0.8:
            sequence = rng.choice(sorted(pool.tokens))
            if pool.computed[sequence] < len(pool.tokens[sequence]):
                pool.compute(sequence, len(pool.tokens[sequence]))                     # the rest of the prefill
            elif manager.can_grow(sequence, len(pool.tokens[sequence]) + 1):
                pool.decode(sequence, rng.randrange(5))
                pool.compute(sequence, len(pool.tokens[sequence]))
        else:
            pool.finish(rng.choice(sorted(pool.tokens)))                               # finished or preempted
        pool.check()
    assert manager.cached_tokens <= manager.prompt_tokens
