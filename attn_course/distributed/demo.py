"""Small functions to run on every rank, for :func:`~attn_course.distributed.launch.launch`'s examples and tests.

A spawned process imports the function it runs by name, so these live in a module rather than
in a notebook cell.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

__all__ = ["rank_and_sum", "fail_on_rank", "hang_on_rank", "exit_on_rank"]


def rank_and_sum(rank: int, world_size: int, x: torch.Tensor) -> tuple[int, float]:
    """``(rank, sum over ranks of (rank + 1) · x.sum())``: one ``all_reduce``, so every rank took part."""
    total = (rank + 1) * x.sum()
    dist.all_reduce(total)
    return rank, float(total)


def fail_on_rank(rank: int, world_size: int, failing: int) -> int:
    """Rank ``failing`` raises a ValueError; the others wait for it in a collective that never completes."""
    if rank == failing:
        raise ValueError(f"rank {rank} was told to fail")
    dist.barrier()
    return rank


def hang_on_rank(rank: int, world_size: int, hanging: int) -> int:
    """Rank ``hanging`` sleeps for an hour; the others return at once."""
    if rank == hanging:
        time.sleep(3600)
    return rank


def exit_on_rank(rank: int, world_size: int, exiting: int) -> int:
    """Rank ``exiting`` ends its process at once with exit code 3, sending nothing back."""
    if rank == exiting:
        os._exit(3)
    dist.barrier()
    return rank
