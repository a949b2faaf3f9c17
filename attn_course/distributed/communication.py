"""The few communication calls the distributed attention algorithms make, each counting the bytes it moves.

Ring attention passes blocks around a ring of ranks; Ulysses swaps the sequence and head
dimensions with an all-to-all. Keeping those calls here, behind two small functions, lets the
algorithms read as their papers' figures ("compute on the block you hold, pass it on, merge"),
and lets :func:`count_traffic` measure what each rank really sends:

    with count_traffic() as traffic:
        out = ring_attention(q, k, v)
    traffic.bytes_sent            # this rank's bytes, to compare with the formulas

:func:`pass_around_ring` starts the transfers and returns at once (``batch_isend_irecv``), so a
rank can compute on the block it holds while the next one travels; :meth:`Transfer.wait`
completes them. :func:`all_to_all` is ``all_to_all_single`` over one dimension of a tensor.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

__all__ = ["Traffic", "count_traffic", "Transfer", "pass_around_ring", "all_to_all"]

_active: list[Traffic] = []          # the counters of the enclosing count_traffic blocks (this process)


@dataclasses.dataclass
class Traffic:
    """What this rank sent and received inside a :func:`count_traffic` block.

    Attributes:
        bytes_sent, bytes_received: payload bytes (``numel · element_size`` of every tensor).
        messages_sent: point-to-point sends, or one per all-to-all peer that receives a non-empty part.
    """

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0


@contextlib.contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Count the bytes this rank sends and receives through this module inside the block.

    Blocks may nest; each counts everything inside it. Backward passes count too when they run
    inside the block (``loss.backward()`` within it).

    Example:
        >>> with count_traffic() as traffic:
        ...     pass                                   # no communication
        >>> traffic.bytes_sent
        0
    """
    traffic = Traffic()
    _active.append(traffic)
    try:
        yield traffic
    finally:
        _active.remove(traffic)


def _count(sent: int, received: int, messages: int) -> None:
    for traffic in _active:
        traffic.bytes_sent += sent
        traffic.bytes_received += received
        traffic.messages_sent += messages


def _bytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _check_group(where: str, group: object) -> tuple[int, int]:
    if not dist.is_initialized():
        raise RuntimeError(f"{where}: no process group: run inside attn_course.distributed.launch, or call "
                           f"torch.distributed.init_process_group first (torchrun does)")
    return dist.get_rank(group), dist.get_world_size(group)


@dataclasses.dataclass
class Transfer:
    """Transfers started by :func:`pass_around_ring`; :meth:`wait` completes them and returns what arrived."""

    requests: list
    received: list[torch.Tensor]

    def wait(self) -> list[torch.Tensor]:
        """Block until every send and receive is done; return the received tensors, in the order sent."""
        for request in self.requests:
            request.wait()
        return self.received


def pass_around_ring(tensors: Sequence[torch.Tensor], *, reverse: bool = False, group=None) -> Transfer:
    """Send ``tensors`` to the next rank of the ring and receive the previous rank's, without waiting.

    Rank ``r`` sends to ``r + 1`` and receives from ``r - 1`` (mod ``P``), or the other way round
    with ``reverse``; every rank must call it with tensors of the same shapes and dtypes. The
    transfers run in the background (``torch.distributed.batch_isend_irecv``): compute on what
    you hold, then call :meth:`Transfer.wait`. The tensors must not be changed until then.

    Args:
        tensors: what to pass on (contiguous copies are sent).
        reverse: pass towards rank ``r - 1`` instead (e.g. gradients going back to their owners).
        group: the process group (default: the whole world).

    Returns:
        A :class:`Transfer` whose :meth:`~Transfer.wait` returns tensors shaped like ``tensors``,
        holding the neighbour's.

    Raises:
        TypeError: ``tensors`` not a non-empty sequence of tensors.
        RuntimeError: no process group.
    """
    where = "pass_around_ring"
    if isinstance(tensors, torch.Tensor) or not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError(f"{where}: tensors must be a non-empty list of tensors, got {type(tensors).__name__}")
    rank, world_size = _check_group(where, group)
    if world_size == 1:                                            # the ring is this rank alone
        return Transfer([], [t.clone() for t in tensors])
    step = -1 if reverse else 1
    send_to, receive_from = (rank + step) % world_size, (rank - step) % world_size   # ranks within the group
    if group is not None:                                                            # P2POp wants global ranks
        send_to, receive_from = dist.get_global_rank(group, send_to), dist.get_global_rank(group, receive_from)
    outgoing = [t.contiguous() for t in tensors]
    received = [torch.empty_like(t) for t in outgoing]
    operations = [dist.P2POp(dist.isend, t, send_to, group) for t in outgoing]
    operations += [dist.P2POp(dist.irecv, t, receive_from, group) for t in received]
    requests = dist.batch_isend_irecv(operations)
    _count(_bytes(outgoing), _bytes(received), len(outgoing))
    return Transfer(requests, received)


def all_to_all(x: torch.Tensor, *, scatter_dim: int, gather_dim: int, group=None) -> torch.Tensor:
    """Cut ``x`` into ``P`` parts along ``scatter_dim``, send part ``j`` to rank ``j``, and join what
    arrives from ranks ``0 .. P - 1`` along ``gather_dim``.

    With ``x [B, H, N/P, d]``, ``scatter_dim=1`` and ``gather_dim=2``, every rank ends with
    ``[B, H/P, N, d]``: all the tokens of its share of the heads (Ulysses' first step); the
    opposite dimensions undo it.

    Args:
        x: this rank's tensor; ``x.shape[scatter_dim]`` divisible by ``P``.
        scatter_dim, gather_dim: the dimension cut and the dimension joined.
        group: the process group (default: the whole world).

    Returns:
        The rearranged tensor (``scatter_dim`` divided by ``P``, ``gather_dim`` multiplied by ``P``).

    Raises:
        TypeError, ValueError: ``x`` not a tensor, dimensions out of range, or ``x.shape[scatter_dim]``
            not divisible by ``P``.
        RuntimeError: no process group.
    """
    where = "all_to_all"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: x must be a tensor, got {type(x).__name__}")
    rank, world_size = _check_group(where, group)
    scatter_dim, gather_dim = (d % x.dim() for d in (scatter_dim, gather_dim))
    if x.shape[scatter_dim] % world_size:
        raise ValueError(f"{where}: x.shape[{scatter_dim}] = {x.shape[scatter_dim]} must be divisible by the "
                         f"{world_size} ranks")
    if world_size == 1:
        return x.clone()
    # all_to_all_single splits dimension 0: move the scattered dimension there, in P parts.
    parts = x.movedim(scatter_dim, 0).contiguous()                        # [S, ...]
    received = torch.empty_like(parts)
    dist.all_to_all_single(received, parts, group=group)
    part = _bytes([parts]) // world_size
    _count(part * (world_size - 1), part * (world_size - 1), world_size - 1)   # a rank keeps its own part
    pieces = received.chunk(world_size, dim=0)                             # piece j came from rank j
    pieces = [piece.movedim(0, scatter_dim) for piece in pieces]
    return torch.cat(pieces, dim=gather_dim)
