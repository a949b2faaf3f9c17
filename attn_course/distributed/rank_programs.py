"""Functions that run on every rank under :func:`~attn_course.distributed.launch.launch`, for chapter 10.

A spawned process imports what it runs by name, so the chapter's multi-process experiments live
here rather than in notebook cells. :func:`attention_on_rank` runs ring attention or Ulysses on this
rank's shards of full ``q``, ``k``, ``v`` and returns everything the chapter compares with one
process: the output shard, the gradient shards, the bytes this rank sent (counted twice: by the
communication module, and by a tap on ``torch.distributed``'s own calls) and (ring) the chunk pairs
it computed.
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.distributed.communication import count_traffic
from attn_course.distributed.layout import shard
from attn_course.distributed.ring import count_ring_work, ring_attention
from attn_course.distributed.ulysses import ulysses_attention
from attn_course.distributed.wiretap import tap_process_group

__all__ = ["METHODS", "attention_on_rank"]

METHODS = ("ring", "ulysses")


def attention_on_rank(rank: int, world_size: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      method: str = "ring", causal: bool = False, layout: str = "contiguous",
                      grad_out: torch.Tensor | None = None) -> dict:
    """Cut the full ``q``, ``k``, ``v`` to this rank's shards, attend across the ranks, and report.

    Args:
        rank, world_size: given by the launcher.
        q, k, v: the full tensors, the same on every rank: q ``[B, H, N, d]``, k and v
            ``[B, H_kv, N, d]`` (``H_kv = H``, or a divisor of it for grouped-query attention).
        method: ``"ring"`` (:func:`~attn_course.distributed.ring.ring_attention`) or ``"ulysses"``
            (:func:`~attn_course.distributed.ulysses.ulysses_attention`, contiguous layout only).
        causal: a causal mask over the whole sequence.
        layout: ``"contiguous"``; for ring also ``"zigzag"`` or ``"striped"``.
        grad_out: the full ``[B, H, N, d_v]`` gradient of a loss with respect to the output; when given,
            the backward pass runs too and the gradient shards come back.

    Returns:
        A dict: ``"out"`` (this rank's ``[B, H, N/P, d_v]``), ``"grads"`` (``(dq, dk, dv)`` shards, or None),
        ``"forward_bytes"`` and ``"backward_bytes"`` (sent by this rank, as
        :func:`~attn_course.distributed.communication.count_traffic` counts them),
        ``"forward_wire_bytes"`` and ``"backward_wire_bytes"`` (the same, as
        :func:`~attn_course.distributed.wiretap.tap_process_group` reads them off the tensors handed to
        ``torch.distributed``), ``"other_collectives"`` (names of any other data-moving collective called),
        ``"work"`` (ring: the chunk pairs its forward computed; Ulysses: None).

    Raises:
        ValueError: an unknown method, Ulysses with a layout other than contiguous; otherwise as the two
            algorithms.
    """
    where = "attention_on_rank"
    if method not in METHODS:
        raise ValueError(f"{where}: method must be one of {METHODS}, got {method!r}")
    if method == "ulysses" and layout != "contiguous":
        raise ValueError(f"{where}: Ulysses takes the contiguous layout (its causal work is balanced anyway), "
                         f"got layout={layout!r}")
    causal = _validate.boolean(where, "causal", causal)
    local = [shard(t, rank, world_size, layout).requires_grad_(grad_out is not None) for t in (q, k, v)]
    work = None
    with count_traffic() as forward, tap_process_group() as forward_wire:
        if method == "ring":
            with count_ring_work() as counted:
                out = ring_attention(*local, causal=causal, layout=layout)        # [B, H, N/P, d_v]
            work = counted.forward
        else:
            out = ulysses_attention(*local, causal=causal)
    grads, backward_bytes, backward_wire_bytes, other = None, 0, 0, list(forward_wire.other_calls)
    if grad_out is not None:
        with count_traffic() as backward, tap_process_group() as backward_wire:
            (out * shard(grad_out, rank, world_size, layout)).sum().backward()
        grads, backward_bytes = tuple(t.grad for t in local), backward.bytes_sent
        backward_wire_bytes, other = backward_wire.bytes_sent, other + backward_wire.other_calls
    return {"out": out.detach(), "grads": grads, "forward_bytes": forward.bytes_sent,
            "backward_bytes": backward_bytes, "forward_wire_bytes": forward_wire.bytes_sent,
            "backward_wire_bytes": backward_wire_bytes, "other_collectives": tuple(other), "work": work}
