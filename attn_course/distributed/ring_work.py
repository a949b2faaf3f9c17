"""How many (query chunk, key chunk) pairs ring attention computes on each rank, predicted from the layout.

:func:`~attn_course.measure.distributed.taps.count_ring_work` counts them while the ring runs, step by step.
"""

from __future__ import annotations

from attn_course import _validate
from attn_course.distributed.layout import check_layout

__all__ = ["ring_work"]


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
    check_layout(where, layout)
    causal = _validate.boolean(where, "causal", causal)
    if not causal:
        return [4 * world_size if layout == "zigzag" else world_size] * world_size
    if layout == "contiguous":
        return [rank + 1 for rank in range(world_size)]
    if layout == "striped":
        return [world_size] * world_size                        # every step's one pair on the diagonal
    return [2 * world_size + 1] * world_size
