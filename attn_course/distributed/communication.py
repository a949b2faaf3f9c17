"""The few communication calls the distributed attention algorithms make.

Ring attention passes blocks around a ring of ranks; Ulysses swaps the sequence and head
dimensions with an all-to-all. Keeping those calls here, behind two small functions, lets the
algorithms read as their papers' figures ("compute on the block you hold, pass it on, merge"),
and lets a measurement watch them from outside
(:func:`~attn_course.measure.distributed.taps.count_traffic` wraps them,
:func:`~attn_course.distributed.wiretap.tap_process_group` the ``torch.distributed`` calls below them).

:func:`pass_around_ring` starts the transfers and returns at once (``batch_isend_irecv``), so a
rank can compute on the block it holds while the next one travels; :meth:`Transfer.wait`
completes them. :func:`all_to_all` is ``all_to_all_single`` over one dimension of a tensor. Both are
steps inside :func:`~attn_course.distributed.ring.ring_attention` and
:func:`~attn_course.distributed.ulysses.ulysses_attention`, which check their inputs and the process
group once (:func:`group_size`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["Transfer", "group_size", "pass_around_ring", "all_to_all"]


def group_size(where: str, group=None) -> int:
    """``P``, the number of ranks in ``group`` (default: the whole world).

    Raises:
        RuntimeError: no process group, naming ``where`` and saying how to get one.
    """
    if not dist.is_initialized():
        raise RuntimeError(f"{where}: no process group: run inside attn_course.distributed.launch, or call "
                           f"torch.distributed.init_process_group first (torchrun does)")
    return dist.get_world_size(group)


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
        group: the process group (default: the whole world), which must exist.

    Returns:
        A :class:`Transfer` whose :meth:`~Transfer.wait` returns tensors shaped like ``tensors``,
        holding the neighbour's.
    """
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
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
    return Transfer(dist.batch_isend_irecv(operations), received)


def all_to_all(x: torch.Tensor, *, scatter_dim: int, gather_dim: int, group=None) -> torch.Tensor:
    """Cut ``x`` into ``P`` parts along ``scatter_dim``, send part ``j`` to rank ``j``, and join what
    arrives from ranks ``0 .. P - 1`` along ``gather_dim``.

    With ``x [B, H, N/P, d]``, ``scatter_dim=1`` and ``gather_dim=2``, every rank ends with
    ``[B, H/P, N, d]``: all the tokens of its share of the heads (Ulysses' first step); the
    opposite dimensions undo it.

    Args:
        x: this rank's tensor; ``x.shape[scatter_dim]`` divisible by ``P``.
        scatter_dim, gather_dim: the dimension cut and the dimension joined (non-negative).
        group: the process group (default: the whole world), which must exist.

    Returns:
        The rearranged tensor (``scatter_dim`` divided by ``P``, ``gather_dim`` multiplied by ``P``).
    """
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return x.clone()
    # all_to_all_single splits dimension 0: move the scattered dimension there, in P parts.
    parts = x.movedim(scatter_dim, 0).contiguous()                        # [S, ...]
    received = torch.empty_like(parts)
    dist.all_to_all_single(received, parts, group=group)
    pieces = received.chunk(world_size, dim=0)                             # piece j came from rank j
    return torch.cat([piece.movedim(0, scatter_dim) for piece in pieces], dim=gather_dim)
