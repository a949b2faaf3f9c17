"""attn_course.distributed: the launcher (results, failures, clean-up) and the sequence layouts.

The launcher runs real processes joined in a gloo group on this machine; the layouts are
checked against index arithmetic written out here.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time

import pytest
import torch

from attn_course.distributed import RankFailed, chunk_count, launch, shard, token_positions, unshard
from attn_course.distributed.demo import exit_on_rank, fail_on_rank, hang_on_rank, rank_and_sum


def no_rank_left() -> bool:
    """No rank process is still running (the forkserver, which lives as long as this Python, is not one)."""
    return not [child for child in multiprocessing.active_children() if child.name.startswith("attn_course rank")]


# --- the launcher -----------------------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_rank_runs_and_results_come_back_in_rank_order(world_size):
    results = launch(rank_and_sum, world_size, torch.ones(3))
    expected = 3.0 * sum(rank + 1 for rank in range(world_size))           # one all_reduce over the ranks
    assert results == [(rank, expected) for rank in range(world_size)]
    assert no_rank_left()


def test_tensors_come_back_as_tensors():
    (rank, total), = launch(rank_and_sum, 1, torch.arange(4.0))
    assert (rank, total) == (0, 6.0)


def test_a_rank_that_raises_ends_the_run_with_its_error_and_the_others_are_stopped():
    start = time.monotonic()
    with pytest.raises(ValueError, match="rank 1 was told to fail") as raised:
        launch(fail_on_rank, 3, 1, timeout=60)               # ranks 0 and 2 wait in a barrier forever
    assert time.monotonic() - start < 30
    assert any("rank 1 failed" in note for note in raised.value.__notes__)
    assert no_rank_left()


def test_a_rank_that_dies_silently_is_named():
    with pytest.raises(RankFailed, match="rank 0 exited with code 3"):
        launch(exit_on_rank, 3, 0, timeout=60)
    assert no_rank_left()


def test_a_hanging_rank_ends_at_the_timeout():
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"timeout of 3 s; ranks \[1\]"):
        launch(hang_on_rank, 2, 1, timeout=3)
    assert time.monotonic() - start < 15
    assert no_rank_left()


def test_launches_at_the_same_time_each_meet_on_their_own_port():
    # Parallel test runs (pytest -n) launch at once: each rendezvous holds the port it was given
    # by the OS for its whole run, so no two groups can end up on one port and mix their ranks.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        runs = [pool.submit(launch, rank_and_sum, 2, torch.full((3,), float(i))) for i in range(8)]
        results = [run.result(timeout=120) for run in runs]
    assert results == [[(0, 9.0 * i), (1, 9.0 * i)] for i in range(8)]   # (1 + 2) * 3i: only their own ranks
    assert no_rank_left()


def test_launcher_arguments_are_checked():
    with pytest.raises(ValueError, match="top level of an importable module"):
        launch(lambda rank, world_size: rank, 2)
    with pytest.raises(TypeError, match="fn must be a function"):
        launch("rank_and_sum", 2)
    with pytest.raises(ValueError, match="world_size"):
        launch(rank_and_sum, 0, torch.ones(1))
    with pytest.raises(ValueError, match="backend must be 'gloo' or 'nccl'"):
        launch(rank_and_sum, 1, torch.ones(1), backend="mpi")
    with pytest.raises(ValueError, match="timeout"):
        launch(rank_and_sum, 1, torch.ones(1), timeout=0)


# --- the layouts -----------------------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_contiguous_layout_gives_each_rank_one_block(world_size):
    n = 12 * world_size
    for rank in range(world_size):
        assert token_positions(rank, world_size, n).tolist() == list(range(rank * 12, (rank + 1) * 12))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_zigzag_layout_gives_rank_r_chunks_r_and_2p_minus_1_minus_r(world_size):
    n, chunk = 4 * 2 * world_size, 4
    for rank in range(world_size):
        late = 2 * world_size - 1 - rank
        expected = [*range(rank * chunk, (rank + 1) * chunk), *range(late * chunk, (late + 1) * chunk)]
        assert token_positions(rank, world_size, n, "zigzag").tolist() == expected
    everyone = torch.cat([token_positions(r, world_size, n, "zigzag") for r in range(world_size)])
    assert sorted(everyone.tolist()) == list(range(n))                   # every token on exactly one rank


def test_striped_layout_gives_rank_r_every_pth_token_from_r():
    assert [token_positions(rank, 4, 8, "striped").tolist() for rank in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert token_positions(2, 3, 12, "striped").tolist() == [2, 5, 8, 11]
    assert shard(torch.arange(8), 1, 4, "striped", dim=0).tolist() == [1, 5]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_striped_layout_puts_token_i_on_rank_i_mod_p(world_size):
    n = 6 * world_size
    owner = {int(p): rank for rank in range(world_size) for p in token_positions(rank, world_size, n, "striped")}
    assert owner == {i: i % world_size for i in range(n)}                # every token on exactly one rank


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_unshard_inverts_shard(layout, world_size):
    x = torch.randn(2, 3, 24, 5)                                         # [B, H, N, d]
    parts = [shard(x, rank, world_size, layout) for rank in range(world_size)]
    assert all(part.shape == (2, 3, 24 // world_size, 5) for part in parts)
    assert torch.equal(unshard(parts, layout), x)
    assert torch.equal(shard(x, world_size - 1, world_size, layout)[:, :, 0], x[:, :, int(
        token_positions(world_size - 1, world_size, 24, layout)[0])])


def test_layout_arguments_are_checked():
    assert chunk_count(3, "contiguous") == 3 and chunk_count(3, "zigzag") == 6 and chunk_count(3, "striped") == 3
    with pytest.raises(ValueError, match="N=10 must be divisible by 4 for the zigzag layout over 2 ranks"):
        token_positions(0, 2, 10, "zigzag")
    with pytest.raises(ValueError, match=r"N=10 must be divisible by 4 for the striped layout over 4 ranks \(P equal"):
        shard(torch.zeros(1, 10, 2), 0, 4, "striped", dim=1)
    with pytest.raises(ValueError, match="layout must be one of"):
        chunk_count(2, "zebra")
    with pytest.raises(ValueError, match="N=10 must be divisible by 3"):
        shard(torch.zeros(1, 10, 2), 0, 3, dim=1)
    with pytest.raises(ValueError, match="layout must be one of"):
        token_positions(0, 2, 8, "strided")
    with pytest.raises(ValueError, match="rank must be below world_size=2"):
        token_positions(2, 2, 8)
    with pytest.raises(TypeError, match="shards must be a non-empty list"):
        unshard([])
    with pytest.raises(ValueError, match="every shard must have one shape"):
        unshard([torch.zeros(2, 3), torch.zeros(3, 3)], dim=0)
