"""Taps that count what the distributed algorithms do, from outside: nothing in their loops calls a counter.

For a ``with`` block each tap wraps functions the algorithms look up by module attribute, and restores them
after (taps nest). :func:`count_traffic` wraps the communication helpers
(:func:`~attn_course.distributed.wiretap.tap_process_group` counts the same bytes at ``torch.distributed``);
:func:`count_ring_work` wraps ring attention's forward and backward steps (``attend_to_block``,
``block_gradients``) and reads the chunk pairs each is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from unittest import mock

import torch
import torch.distributed as dist

from attn_course.distributed import communication, ring

__all__ = ["RingWork", "Traffic", "count_ring_work", "count_traffic"]


@dataclasses.dataclass
class Traffic:
    """``bytes_sent``: the payload bytes this rank handed the communication helpers for other ranks."""

    bytes_sent: int = 0


@contextlib.contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Count the bytes this rank's algorithms hand to the communication helpers inside the block (backward too).

    A ring pass sends every tensor it is given (nothing with one rank); an all-to-all of ``x`` over
    ``P`` ranks sends ``(P - 1) / P`` of ``x``, keeping its own part.

    Example:
        >>> with count_traffic() as traffic:
        ...     pass                                   # no communication
        >>> traffic.bytes_sent
        0
    """
    traffic = Traffic()

    def passing(original):
        def pass_around_ring(tensors, **options):
            if dist.get_world_size(options.get("group")) > 1:              # a ring of one sends nothing
                traffic.bytes_sent += sum(t.numel() * t.element_size() for t in tensors)
            return original(tensors, **options)
        return pass_around_ring

    def exchanging(original):
        def all_to_all(x, *, group=None, **options):
            world_size = dist.get_world_size(group)
            traffic.bytes_sent += x.numel() * x.element_size() // world_size * (world_size - 1)   # keeps its part
            return original(x, group=group, **options)
        return all_to_all

    with mock.patch.multiple(communication, pass_around_ring=passing(communication.pass_around_ring),
                             all_to_all=exchanging(communication.all_to_all)):
        yield traffic


@dataclasses.dataclass
class RingWork:
    """The (query chunk, key chunk) pairs this rank handled inside a :func:`count_ring_work` block.

    Attributes:
        forward: pairs whose attention the forward pass computed (masked or not).
        backward: pairs whose gradients the backward pass computed (the same pairs again).
        masked: of the forward pairs, those on the causal diagonal that needed a mask.
        skipped: forward pairs left out because the causal mask hides all of them.
        forward_scores_by_step: per forward step, in order (``P`` per call), the score elements this rank
            computed, ``rows × cols`` summed over its computed pairs, per (batch, head); a masked tile
            counts whole (it is computed whole, then masked).
        forward_seconds_by_step: for the same steps, the seconds spent computing and merging its tiles.
    """

    forward: int = 0
    backward: int = 0
    masked: int = 0
    skipped: int = 0
    forward_scores_by_step: list[int] = dataclasses.field(default_factory=list)
    forward_seconds_by_step: list[float] = dataclasses.field(default_factory=list)


def _clock(device: torch.device) -> float:
    """Seconds now, once the device has finished its work (a GPU runs kernels asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@contextlib.contextmanager
def count_ring_work() -> Iterator[RingWork]:
    """Count the chunk pairs ring attention computes on this rank inside the block (backward too); time its steps.

    Example:
        >>> with count_ring_work() as work:
        ...     pass                                   # no ring attention here
        >>> work
        RingWork(forward=0, backward=0, masked=0, skipped=0, forward_scores_by_step=[], forward_seconds_by_step=[])
    """
    work = RingWork()

    def forward_step(original):
        def attend_to_block(q, k, v, pairs, *args):             # a generator: the ring merges what it yields
            computed = [pair for pair in pairs if not pair.hidden]
            work.forward += len(computed)
            work.masked += sum(pair.mask is not None for pair in computed)
            work.skipped += len(pairs) - len(computed)
            started = _clock(q.device)
            yield from original(q, k, v, pairs, *args)           # the tiles, and the merges between them
            work.forward_seconds_by_step.append(_clock(q.device) - started)
            work.forward_scores_by_step.append(sum((p.rows.stop - p.rows.start) * (p.cols.stop - p.cols.start)
                                                   for p in computed))                # rows × cols per tile
        return attend_to_block

    def backward_step(original):
        def block_gradients(q, k, v, pairs, *args):
            work.backward += sum(not pair.hidden for pair in pairs)
            return original(q, k, v, pairs, *args)
        return block_gradients

    with mock.patch.multiple(ring, attend_to_block=forward_step(ring.attend_to_block),
                             block_gradients=backward_step(ring.block_gradients)):
        yield work
