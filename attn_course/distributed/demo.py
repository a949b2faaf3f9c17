"""Small functions to run on every rank, for :func:`~attn_course.distributed.launch.launch`'s examples and tests.

A spawned process imports the function it runs by name, so these live in a module rather than
in a notebook cell.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

__all__ = ["rank_and_sum", "fail_on_rank", "hang_on_rank", "exit_on_rank", "tapped_exchanges"]


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


def tapped_exchanges(rank: int, world_size: int) -> tuple[dict[int, int], int, list[str]]:
    """Three exchanges under :func:`~attn_course.distributed.wiretap.tap_process_group`; what the tap saw.

    An uneven ``all_to_all_single`` (rank ``j`` gets ``j + 1`` rows of 3 float32 numbers from every
    rank), five bfloat16 numbers sent to the next rank with ``batch_isend_irecv``, and an ``all_reduce``.
    Returns ``(bytes_to, messages, other_calls)``.
    """
    from attn_course.distributed.wiretap import tap_process_group

    rows = [j + 1 for j in range(world_size)]
    with tap_process_group() as tap:
        sent = torch.full((sum(rows), 3), float(rank))
        received = torch.empty(world_size * (rank + 1), 3)
        dist.all_to_all_single(received, sent, [rank + 1] * world_size, rows)
        if world_size > 1:
            outgoing, incoming = torch.ones(5, dtype=torch.bfloat16), torch.empty(5, dtype=torch.bfloat16)
            requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing, (rank + 1) % world_size),
                                               dist.P2POp(dist.irecv, incoming, (rank - 1) % world_size)])
            for request in requests:
                request.wait()
        dist.all_reduce(torch.ones(2))
    return dict(sorted(tap.bytes_to.items())), tap.messages, tap.other_calls
