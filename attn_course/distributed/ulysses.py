"""DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509): sequence parallelism by swapping heads and tokens.

Every rank holds ``N / P`` tokens of the sequence, with all ``H`` heads (the contiguous layout).
Attention needs every token, but each head is independent of the others. So Ulysses trades
one split for the other:

1. **all-to-all** q, k and v: from ``[B, H, N/P, d]`` (all heads, a slice of the tokens) to
   ``[B, H/P, N, d]`` (all tokens, a slice of the heads);
2. **ordinary attention** on those ``H / P`` heads over the full sequence (here the course's
   :func:`~attn_course.core.attention.self_attention`, with the causal mask over all ``N``
   positions; any attention kernel would do, FlashAttention included);
3. **all-to-all** the output back to ``[B, H, N/P, d]``.

The backward pass is the same three steps in reverse: the gradient of an all-to-all is the
inverse all-to-all (:class:`AllToAll`), so a training step costs four all-to-alls forward
(q, k, v, out) and four backward (d out, then dq, dk, dv).

**Communication per rank.** Each all-to-all of a shard of ``S = B · H · (N/P) · d`` elements
sends ``(P - 1) / P`` of it (a rank keeps the part that stays with it), so a forward pass
sends ``4 · (P - 1)/P · S`` elements per rank (:func:`ulysses_bytes`) and a forward plus
backward ``8 · (P - 1)/P · S``. Ring attention passes K and V around the whole ring:
``2 · (P - 1) · S`` forward, ``P / 2`` times more than Ulysses' 4 · (P - 1)/P · S once
``P > 2`` (equal at ``P = 2``). Per rank and layer that is ``4 · (P - 1)/P · (N/P) · h``
elements for one sequence (``h = H · d``), just under the paper's ``4Nh/P`` "per link" (its
analysis: an all-to-all of an aggregate message ``M`` over ``P`` GPUs moves ``M / P`` per link,
and q, k, v plus the output make ``M = 4Nh``). Hence the claim of the paper's abstract:
"DeepSpeed-Ulysses maintains constant communication volume when sequence length and compute
devices are increased proportionally" (the blog post in microsoft/DeepSpeed:
"this communication volume is constant when both N and P are increased proportionally"). Ring's
``2 (P - 1) · (N/P) · h`` instead grows with ``P`` when ``N / P`` is fixed.

**When ring wins instead.**

- *Heads limit P*: each rank needs a whole head, so ``P`` must divide ``H`` (this function
  refuses otherwise), and with grouped-query attention the K/V heads are what is scattered:
  ``P <= H_kv`` (8 for Llama-3-70B) unless K and V are copied, which costs memory and bytes.
  Ring attention has no such limit: ``P`` is bounded only by ``N``.
- *Overlap*: ring's transfers run while the rank computes on the block it holds, so they cost
  nothing once a block's attention takes longer than its transfer. An all-to-all sits on the
  critical path: attention cannot start before it ends.
- *Memory*: after the first all-to-all a rank holds ``H / P`` heads of the full sequence, and
  ordinary attention materialises ``[B, H/P, N, N]`` scores (``N²/P`` per rank; a
  FlashAttention kernel would hold ``N/P``-sized tiles instead). Ring's score blocks are
  ``[B, H, N/P, N/P]``: per-rank memory stays fixed when ``N / P`` is.
- *Topology*: an all-to-all wants every pair of ranks well connected (NVSwitch inside a node);
  a ring needs only neighbours. Practical systems combine them (Ulysses inside a node, ring
  across nodes: "USP", Fang and Zhao 2024).

Ulysses needs no zig-zag layout: every rank computes the full causal triangle of its heads, so
the causal work is balanced by construction.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.distributed import communication

__all__ = ["AllToAll", "sequence_to_heads", "heads_to_sequence", "ulysses_attention", "ulysses_bytes"]

# The dimensions of a [B, H, N, d] tensor that the all-to-alls cut and join.
_HEADS, _TOKENS = 1, 2


class AllToAll(torch.autograd.Function):
    """:func:`~attn_course.distributed.communication.all_to_all` with a gradient.

    An all-to-all only moves elements (a permutation across ranks), so its gradient is the
    inverse move: the all-to-all with ``scatter_dim`` and ``gather_dim`` exchanged.

    Example (on every rank of a group of ``P``; not run as a doctest, which has no group)::

            y = AllToAll.apply(x, 1, 2, None)      # x [B, H, N/P, d] -> y [B, H/P, N, d]
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
        ctx.scatter_dim, ctx.gather_dim, ctx.group = scatter_dim, gather_dim, group
        return communication.all_to_all(x, scatter_dim=scatter_dim, gather_dim=gather_dim, group=group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # The inverse all-to-all: cut where forward joined, join where it cut.
        grad_x = communication.all_to_all(grad.contiguous(), scatter_dim=ctx.gather_dim,
                                          gather_dim=ctx.scatter_dim, group=ctx.group)
        return grad_x, None, None, None


def sequence_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """``[B, H, N/P, d]`` (this rank's tokens, every head) to ``[B, H/P, N, d]`` (every token, this rank's heads).

    Rank ``r`` receives heads ``r · H/P .. (r+1) · H/P - 1`` of every rank's tokens, joined in
    rank order: the full sequence in the contiguous layout. Differentiable.

    Args:
        x: ``[B, H, N/P, d]``, ``H`` divisible by ``P``.
        group: the process group (default: the whole world).

    Returns:
        ``[B, H/P, N, d]``.
    """
    return AllToAll.apply(x, _HEADS, _TOKENS, group)


def heads_to_sequence(x: torch.Tensor, group=None) -> torch.Tensor:
    """The inverse of :func:`sequence_to_heads`: ``[B, H/P, N, d]`` back to ``[B, H, N/P, d]``. Differentiable.

    Args:
        x: ``[B, H/P, N, d]``, ``N`` divisible by ``P``.
        group: the process group (default: the whole world).

    Returns:
        ``[B, H, N/P, d]``: this rank's tokens, every head.
    """
    return AllToAll.apply(x, _TOKENS, _HEADS, group)


def _world_size(where: str, group) -> int:
    if not dist.is_initialized():
        raise RuntimeError(f"{where}: no process group: run inside attn_course.distributed.launch, or call "
                           f"torch.distributed.init_process_group first (torchrun does)")
    return dist.get_world_size(group)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                      group=None) -> torch.Tensor:
    """Self-attention over a sequence split across ranks, DeepSpeed-Ulysses style.

    Called on every rank of the group with that rank's shard (contiguous layout: rank ``r``
    holds tokens ``r · N/P .. (r+1) · N/P - 1``, as :func:`~attn_course.distributed.layout.shard`
    cuts them). Returns this rank's rows of ``self_attention(q_full, k_full, v_full)``.
    Differentiable: gradients flow back to each rank's own shards through the inverse
    all-to-alls.

    Args:
        q, k, v: this rank's shard, ``[B, H, N/P, d]`` each (``v`` may have another ``d_v``);
            the same shapes on every rank.
        causal: mask future positions of the full sequence (query ``i`` sees keys ``j <= i``).
        group: the process group (default: the whole world).

    Returns:
        ``[B, H, N/P, d_v]``: the attention output of this rank's tokens.

    Raises:
        TypeError, ValueError: inputs that are not floating ``[B, H, N/P, d]`` tensors of one
            dtype and device with matching shapes, ``causal`` not a bool, or ``H`` not divisible
            by ``P`` (each rank needs whole heads).
        RuntimeError: no process group.

    Example (on each of ``P`` ranks, inside :func:`~attn_course.distributed.launch.launch`; not run
    as a doctest, which has no group)::

            q_local = shard(q, rank, P)                                  # [B, H, N/P, d]
            out_local = ulysses_attention(q_local, k_local, v_local, causal=True)
    """
    where = "ulysses_attention"
    _validate.attention_inputs(where, q, k, v, causal=causal)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"{where}: self-attention over one sequence: q and k must hold the same N/P tokens, got "
                         f"q {_validate.shape_str(q)}, k {_validate.shape_str(k)}")
    world_size = _world_size(where, group)
    heads = q.shape[1]
    if heads % world_size:
        raise ValueError(f"{where}: the number of heads H={heads} must be divisible by the number of ranks "
                         f"P={world_size}: Ulysses gives each rank H/P whole heads (use P <= H, a divisor of H, "
                         f"or ring attention, which has no such limit)")
    # 1. all-to-all: this rank's tokens of every head -> every token of this rank's heads.
    q_heads = sequence_to_heads(q, group)                       # [B, H/P, N, d]
    k_heads = sequence_to_heads(k, group)                       # [B, H/P, N, d]
    v_heads = sequence_to_heads(v, group)                       # [B, H/P, N, d_v]
    # 2. ordinary attention on whole heads, over the full sequence.
    n = q_heads.shape[2]
    mask = causal_mask(n, device=q.device) if causal else None  # [N, N]
    out_heads, _ = self_attention(q_heads, k_heads, v_heads, mask)   # [B, H/P, N, d_v]
    # 3. all-to-all back: every token of this rank's heads -> this rank's tokens of every head.
    return heads_to_sequence(out_heads, group)                  # [B, H, N/P, d_v]


def ulysses_bytes(batch: int, heads: int, n: int, head_dim: int, world_size: int, *, element_size: int = 4,
                  backward: bool = False) -> int:
    """Bytes one rank sends in :func:`ulysses_attention`: four all-to-alls of ``(P - 1)/P`` of a shard.

    ``4 · (P - 1) · B · H · (N/P) · d · element_size / P`` forward; twice that with
    ``backward`` (the gradients of out, q, k and v travel back the same way). Exact: every
    rank sends the same.

    Args:
        batch, heads, n, head_dim: ``B``, ``H``, the full ``N`` and ``d`` (``d_v = d``).
        world_size: ``P``; ``H`` and ``N`` divisible by it.
        element_size: bytes per element (4 for float32).
        backward: count the backward pass too.

    Returns:
        Bytes sent per rank.

    Raises:
        TypeError, ValueError: sizes that are not positive ints, ``H`` or ``N`` not divisible by ``P``.

    Example:
        >>> ulysses_bytes(1, 4, 64, 16, 4)          # 4 · 3/4 of a [1, 4, 16, 16] float32 shard
        12288
    """
    where = "ulysses_bytes"
    batch, heads, n, head_dim, world_size, element_size = (
        _validate.integer(where, name, value, minimum=1) for name, value in (
            ("batch", batch), ("heads", heads), ("n", n), ("head_dim", head_dim), ("world_size", world_size),
            ("element_size", element_size)))
    _validate.boolean(where, "backward", backward)
    for name, value in (("heads", heads), ("n", n)):
        if value % world_size:
            raise ValueError(f"{where}: {name}={value} must be divisible by world_size={world_size}")
    shard_bytes = batch * heads * (n // world_size) * head_dim * element_size
    passes = 2 if backward else 1
    return passes * 4 * (world_size - 1) * shard_bytes // world_size
