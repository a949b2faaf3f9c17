"""How much work ring attention does on each rank: predicted (:func:`ring_work`) and counted
(:func:`count_ring_work`), the counts kept per forward step for the ring's critical path.

:mod:`~attn_course.distributed.ring` reports what it computes through :func:`record_pairs` and
:func:`record_step`, which add to every enclosing :func:`count_ring_work` block of this process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator

import torch

from attn_course import _validate
from attn_course.distributed.layout import LAYOUTS

__all__ = ["RingWork", "count_ring_work", "counting", "record_pairs", "record_step", "ring_work", "step_clock"]

_active: list[RingWork] = []          # the counters of the enclosing count_ring_work blocks (this process)


# --- counting the work ------------------------------------------------------------------------------

@dataclasses.dataclass
class RingWork:
    """The (query chunk, key chunk) pairs this rank handled inside a :func:`count_ring_work` block.

    Attributes:
        forward: pairs whose attention the forward pass computed (masked or not).
        backward: pairs whose gradients the backward pass computed (the same pairs again).
        masked: of the forward pairs, those on the causal diagonal that needed a mask.
        skipped: forward pairs left out because the causal mask hides all of them.
        forward_scores_by_step: one entry per forward ring step, in the order the steps ran (``P``
            per call): the score elements this rank computed at that step, ``rows × cols`` summed
            over its computed pairs, per (batch, head). A masked pair counts whole: the tile is
            computed whole and the mask applied to it.
        forward_seconds_by_step: for the same steps, the wall-clock seconds this rank spent
            computing and merging its tiles (the transfer it waits for is not in it).
    """

    forward: int = 0
    backward: int = 0
    masked: int = 0
    skipped: int = 0
    forward_scores_by_step: list[int] = dataclasses.field(default_factory=list)
    forward_seconds_by_step: list[float] = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def count_ring_work() -> Iterator[RingWork]:
    """Count the chunk pairs :func:`ring_attention` computes on this rank inside the block.

    Blocks may nest; each counts everything inside it; a backward run inside the block counts too.

    Example:
        >>> with count_ring_work() as work:
        ...     pass                                   # no ring attention here
        >>> work
        RingWork(forward=0, backward=0, masked=0, skipped=0, forward_scores_by_step=[], forward_seconds_by_step=[])
    """
    work = RingWork()
    _active.append(work)
    try:
        yield work
    finally:
        _active.remove(work)


def counting() -> bool:
    """Whether a :func:`count_ring_work` block is open in this process (then the ring times its steps)."""
    return bool(_active)


def record_pairs(**amounts: int) -> None:
    """Add ``amounts`` (``forward``, ``backward``, ``masked``, ``skipped`` pairs) to every open count."""
    for work in _active:
        for name, amount in amounts.items():
            setattr(work, name, getattr(work, name) + amount)


def record_step(scores: int, seconds: float) -> None:
    """Note one forward step: the score elements its computed pairs held and the seconds they took."""
    for work in _active:
        work.forward_scores_by_step.append(scores)
        work.forward_seconds_by_step.append(seconds)


def step_clock(device: torch.device) -> float:
    """Seconds now, once the device has finished what it was given (a GPU runs kernels asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def ring_work(world_size: int, layout: str = "contiguous", causal: bool = False) -> list[int]:
    """How many (query chunk, key chunk) pairs each rank computes in one ring-attention forward.

    A pair is one chunk of this rank's queries against one chunk of a K/V block: the whole shard
    with the contiguous and striped layouts (one chunk of ``N / P`` tokens), each of the two
    ``N / 2P`` chunks with the zig-zag layout (a zig-zag pair is a quarter of a contiguous one).
    Without a mask every rank computes every pair: ``P`` (contiguous, striped) or ``4P``
    (zig-zag). With a causal mask, pairs whose keys all follow their queries are skipped:

    - contiguous: rank ``r`` sees blocks ``0 .. r``: ``r + 1`` pairs, from 1 on rank 0 to ``P`` on
      rank ``P - 1``. Counted in scores (a diagonal pair is about half a full one), rank ``P - 1``
      does ``2P - 1`` times rank 0's work, and every rank waits for it;
    - zig-zag: its early chunk ``r`` sees the early chunks ``0 .. r`` (``r + 1``), its late chunk
      ``2P - 1 - r`` sees every early chunk (``P``) and the late chunks ``2P - 1 - s`` for
      ``s >= r`` (``P - r``): ``2P + 1`` on every rank;
    - striped: ``P`` on every rank, all masked, none skipped. Rank ``r`` holds queries
      ``r + iP`` and, at a step where it holds rank ``t``'s block, keys ``t + jP``
      (``i, j < L = N / P``): key ``j`` is visible to query ``i`` when ``j <= i`` if ``t <= r``
      (the lower triangle with its diagonal, ``L (L + 1) / 2`` scores) and when ``j < i`` if
      ``t > r`` (the strict lower triangle, ``L (L - 1) / 2``). Every rank does about half of
      each block at every step: balanced (rank ``r`` sees ``P · L (L - 1) / 2 + (r + 1) · L``
      scores in all). With one token per rank (``N = P``) the striped layout is the contiguous
      one, and so are its pairs.

    Args:
        world_size: ``P >= 1``.
        layout: ``"contiguous"``, ``"zigzag"`` or ``"striped"``.
        causal: with the causal mask.

    Returns:
        ``[pairs of rank 0, ..., pairs of rank P - 1]``.

    Raises:
        TypeError, ValueError: ``world_size`` not an int ``>= 1``, an unknown layout, ``causal`` not a bool.

    Example:
        >>> ring_work(4, "contiguous", causal=True), ring_work(4, "zigzag", causal=True)
        ([1, 2, 3, 4], [9, 9, 9, 9])
        >>> ring_work(4, "striped", causal=True)
        [4, 4, 4, 4]
    """
    where = "ring_work"
    world_size = _validate.integer(where, "world_size", world_size, minimum=1)
    if layout not in LAYOUTS:
        raise ValueError(f"{where}: layout must be one of {LAYOUTS}, got {layout!r}")
    causal = _validate.boolean(where, "causal", causal)
    if not causal:
        return [4 * world_size if layout == "zigzag" else world_size] * world_size
    if layout == "contiguous":
        return [rank + 1 for rank in range(world_size)]
    if layout == "striped":
        return [world_size] * world_size                        # every step's one pair on the diagonal
    return [2 * world_size + 1] * world_size
