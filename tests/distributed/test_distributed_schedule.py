"""attn_course.distributed.schedule: the ring's schedule and the causal work grid against the layouts' own
arithmetic; the bytes one rank sends and the causal ring's critical path against formulas written out here."""

from __future__ import annotations

import pytest
import torch

from attn_course.distributed.layout import token_positions
from attn_course.distributed.schedule import (
    METHODS,
    causal_pair_grid,
    critical_path_formula,
    formula_bytes,
    ring_schedule,
)

LAYOUTS = ("contiguous", "zigzag", "striped")


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


def test_schedule_arguments_are_checked():
    with pytest.raises(ValueError, match="world_size"):
        ring_schedule(0)
    with pytest.raises(ValueError, match="layout must be one of"):
        causal_pair_grid(2, "strided")


def test_distributed_formulas_by_hand():
    b, h, n, d = 2, 8, 64, 16
    for p in (2, 4, 8):
        shard = b * h * (n // p) * d * 4                                  # one float32 [B, H, N/P, d] shard
        assert formula_bytes("ring", b, h, n, d, p) == 2 * (p - 1) * shard
        assert formula_bytes("ring zigzag", b, h, n, d, p, backward=True) == (
            2 * (p - 1) + 2 * (p - 1) + 2 * p) * shard                     # K, V forward; K, V and dK, dV backward
        assert formula_bytes("ulysses", b, h, n, d, p) * p == 4 * (p - 1) * shard
        assert formula_bytes("ulysses", b, h, n, d, p, backward=True) * p == 8 * (p - 1) * shard
        ratio = formula_bytes("ring", b, h, n, d, p) / formula_bytes("ulysses", b, h, n, d, p)
        assert ratio == p / 2
        assert formula_bytes("ring striped", b, h, n, d, p, backward=True) == (6 * p - 4) * shard
    assert [formula_bytes(m, b, h, n, d, 1, backward=True) for m in METHODS] == [0] * 4
    # N and P grown together: Ulysses' bytes per rank approach a constant, ring's grow with P.
    ulysses = [formula_bytes("ulysses", 1, 8, 16 * p, 16, p) for p in (2, 4, 8)]
    ring = [formula_bytes("ring", 1, 8, 16 * p, 16, p) for p in (2, 4, 8)]
    assert ulysses == [16384, 24576, 28672] and ring == [16384, 49152, 114688]   # shard: 8192 B


def test_distributed_formulas_with_grouped_query_attention_and_half_precision_by_hand():
    b, h, h_kv, n, d = 1, 32, 8, 64, 16                                  # Llama 3's 32 query heads, 8 K/V heads
    for p in (2, 4, 8):
        q_shard, kv_shard = (b * heads * (n // p) * d for heads in (h, h_kv))     # elements
        ring = formula_bytes("ring", b, h, n, d, p, kv_heads=h_kv)
        ulysses = formula_bytes("ulysses", b, h, n, d, p, kv_heads=h_kv)
        assert ring == 2 * (p - 1) * kv_shard * 4
        assert ulysses * p == (p - 1) * (2 * q_shard + 2 * kv_shard) * 4
        assert ring / ulysses == p * h_kv / (h + h_kv) == p / 5         # ring sends less only for P < 5
        # bfloat16: K/V at 2 bytes, the dK/dV sums (2P hops) at float32's 4
        assert formula_bytes("ring", b, h, n, d, p, kv_heads=h_kv, element_size=2, backward=True) == (
            4 * (p - 1) * kv_shard * 2 + 2 * p * kv_shard * 4)
        assert formula_bytes("ulysses", b, h, n, d, p, kv_heads=h_kv, element_size=2,
                                         backward=True) * p == 2 * (p - 1) * (2 * q_shard + 2 * kv_shard) * 2


def test_critical_path_formula_by_hand():
    assert [critical_path_formula(48, 4, layout) for layout in LAYOUTS] == [4 * 12 ** 2, 9 * 6 ** 2,
                                                                                       4 * 12 ** 2]
    assert critical_path_formula(8, 1, "zigzag") == 3 * 4 ** 2       # one rank: 3 of its 4 tiles
    assert critical_path_formula(30, 3, "striped") == 3 * 10 ** 2    # N divisible by P is enough




@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda: formula_bytes("ring zigzag", 1, 2, 6, 4, 2), ValueError,
         r"^formula_bytes: .*N=6 must be divisible by 4 for the zigzag layout"),
        (lambda: formula_bytes("tree", 1, 2, 8, 4, 2), ValueError, r"^formula_bytes: method must be one of"),
        (lambda: formula_bytes("ring", 1, 8, 8, 4, 2, kv_heads=3), ValueError, "heads=8 must be divisible by kv_heads"),
        (lambda: critical_path_formula(10, 4, "contiguous"), ValueError,
         r"^critical_path_formula: the sequence length N=10 must be divisible by 4 for the contiguous layout"),
        (lambda: critical_path_formula(8, 2, "Zigzag"), ValueError, "layout must be one of"),
        (lambda: critical_path_formula(8, True, "zigzag"), TypeError, "world_size must be an int"),
    ],
)
def test_bad_arguments_are_rejected_naming_the_argument(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call()
