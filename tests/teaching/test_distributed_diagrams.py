"""Chapter 10's diagrams against the layouts' own arithmetic: the ring's schedule and the causal work grid."""

from __future__ import annotations

import pytest
import torch

from attn_course.distributed.layout import token_positions
from attn_course.teaching.distributed_diagrams import causal_pair_grid, ring_schedule


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_every_rank_meets_every_block_once_and_receives_from_its_left_neighbour(world_size):
    schedule = ring_schedule(world_size)                                # [step, rank]
    assert all(sorted(schedule[:, r].tolist()) == list(range(world_size)) for r in range(world_size))
    assert schedule[0].tolist() == list(range(world_size))               # step 0: its own block
    for step in range(1, world_size):                                   # what r holds, r - 1 held a step before
        assert schedule[step].tolist() == schedule[step - 1].roll(1).tolist()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_causal_grid_rows_belong_to_the_ranks_holding_those_query_chunks(world_size):
    for layout in ("contiguous", "zigzag"):
        grid = causal_pair_grid(world_size, layout)
        chunks = grid.shape[0]
        n = 4 * chunks                                                  # 4 tokens per chunk
        assert torch.equal(grid == -1, torch.triu(torch.ones(chunks, chunks, dtype=torch.bool), 1))
        for rank in range(world_size):
            held = sorted({int(p) // 4 for p in token_positions(rank, world_size, n, layout)})
            assert sorted({i for i in range(chunks) if (grid[i] == rank).any()}) == held


def test_contiguous_work_grows_with_the_rank_and_zigzag_is_balanced():
    for world_size in (2, 3, 4):
        contiguous = causal_pair_grid(world_size, "contiguous")
        zigzag = causal_pair_grid(world_size, "zigzag")
        assert [int((contiguous == r).sum()) for r in range(world_size)] == list(range(1, world_size + 1))
        assert [int((zigzag == r).sum()) for r in range(world_size)] == [2 * world_size + 1] * world_size


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_striped_grid_row_r_is_rank_r_and_no_stripe_pair_is_hidden_whole(world_size):
    grid = causal_pair_grid(world_size, "striped")
    n = 4 * world_size                                                  # 4 tokens per rank
    for rank in range(world_size):
        queries = token_positions(rank, world_size, n, "striped")
        for source in range(world_size):
            keys = token_positions(source, world_size, n, "striped")
            assert bool((keys[None, :] <= queries[:, None]).any())      # some key visible: computed, by rank
            assert int(grid[rank, source]) == rank


def test_diagram_arguments_are_checked():
    with pytest.raises(ValueError, match="world_size"):
        ring_schedule(0)
    with pytest.raises(ValueError, match="layout must be one of"):
        causal_pair_grid(2, "strided")
