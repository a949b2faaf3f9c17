"""Bytes counted where they are handed to ``torch.distributed``, by code that knows no algorithm.

:func:`~attn_course.measure.distributed.taps.count_traffic` counts the tensors the algorithms hand to
the course's two communication helpers. Checking the formulas against that alone would check only the
algorithms' requests. :func:`tap_process_group` is the count one level down: for the length of a
``with`` block it wraps the functions of ``torch.distributed`` that move data and records, for every
destination rank, the bytes of the tensors actually handed to them:

    with tap_process_group() as tap:
        out = ring_attention(q, k, v)
    tap.bytes_to                  # {destination rank: bytes}, read off the tensors given to torch
    tap.other_calls               # any other collective that moved data, by name (expected: none)

``batch_isend_irecv`` counts each ``isend`` operation's tensor; ``all_to_all_single`` counts the rows
of its input going to each other rank, from the split sizes it was given (equal parts when none),
the rows for this rank itself staying put. Collectives the two algorithms never call are recorded by
name in :attr:`Tap.other_calls`, so that a count can also say that nothing else moved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator

import torch
import torch.distributed as dist

__all__ = ["Tap", "tap_process_group"]

# Collectives that move data and that ring attention and Ulysses do not call: recorded by name.
# (``isend`` and ``send`` stay unwrapped: ``P2POp`` accepts only the real ``isend``/``irecv``.)
_OTHER_COLLECTIVES = ("all_to_all", "all_gather", "all_gather_into_tensor", "all_reduce",
                      "broadcast", "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter")


@dataclasses.dataclass
class Tap:
    """What this rank handed to ``torch.distributed`` inside a :func:`tap_process_group` block.

    Attributes:
        bytes_to: bytes per destination rank (global rank numbers), this rank itself excluded.
        messages: point-to-point sends, plus one per all-to-all peer receiving a non-empty part.
        other_calls: names of other data-moving collectives called, in order.
    """

    bytes_to: dict[int, int] = dataclasses.field(default_factory=dict)
    messages: int = 0
    other_calls: list[str] = dataclasses.field(default_factory=list)

    @property
    def bytes_sent(self) -> int:
        """All the bytes sent to other ranks."""
        return sum(self.bytes_to.values())

    def _add(self, peer: int, nbytes: int) -> None:
        if nbytes:
            self.bytes_to[peer] = self.bytes_to.get(peer, 0) + nbytes
            self.messages += 1


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _batch_isend_irecv(original, tap: Tap, p2p_op_list, *args, **kwargs):
    for op in p2p_op_list:
        if getattr(op.op, "__name__", "") == "isend":            # irecv operations receive
            tap._add(op.peer, _nbytes(op.tensor))
    return original(p2p_op_list, *args, **kwargs)


def _all_to_all_single(original, tap: Tap, output, input, output_split_sizes=None, input_split_sizes=None,
                       group=None, *args, **kwargs):
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    rows = input.shape[0] if input.dim() else 1
    splits = list(input_split_sizes) if input_split_sizes else [rows // world_size] * world_size
    row_bytes = _nbytes(input) // rows if rows else 0
    for peer, count in enumerate(splits):
        if peer != rank:
            global_peer = peer if group is None else dist.get_global_rank(group, peer)
            tap._add(global_peer, count * row_bytes)
    return original(output, input, output_split_sizes, input_split_sizes, group, *args, **kwargs)


def _recorded(original, tap: Tap, name: str, *args, **kwargs):
    tap.other_calls.append(name)
    return original(*args, **kwargs)


@contextlib.contextmanager
def tap_process_group() -> Iterator[Tap]:
    """Record, per destination rank, the bytes this process hands to ``torch.distributed`` in the block.

    The wrapped functions are those of the ``torch.distributed`` module, looked up by name when called
    (as :mod:`~attn_course.distributed.communication` calls them); they are restored on leaving the
    block. Taps do not nest: a second one inside the first is refused.

    Raises:
        RuntimeError: a tap is already active in this process.

    Example:
        >>> with tap_process_group() as tap:
        ...     pass                                   # nothing sent
        >>> tap.bytes_sent, tap.other_calls
        (0, [])
    """
    if getattr(dist.batch_isend_irecv, "_attn_course_tap", False):
        raise RuntimeError("tap_process_group: a tap is already active in this process (taps do not nest)")
    tap = Tap()
    wrappers = {"batch_isend_irecv": _batch_isend_irecv, "all_to_all_single": _all_to_all_single}
    originals = {name: getattr(dist, name) for name in (*wrappers, *_OTHER_COLLECTIVES) if hasattr(dist, name)}
    try:
        for name, original in originals.items():
            if name in wrappers:
                wrapped = functools.partial(wrappers[name], original, tap)
            else:
                wrapped = functools.partial(_recorded, original, tap, name)
            wrapped._attn_course_tap = True
            setattr(dist, name, wrapped)
        yield tap
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
