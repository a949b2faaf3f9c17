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

**With grouped-query attention** (``H_kv < H`` K/V heads) both send fewer bytes, but not equally:
the ring passes only K and V, ``2 (P - 1) · S_kv`` with ``S_kv = B · H_kv · (N/P) · d``, while
Ulysses still moves q and the output at all ``H`` heads, ``(P - 1)/P · (2 S + 2 S_kv)``. The
ratio ring/Ulysses is ``P · H_kv / (H + H_kv)``: ``P / 5`` for Llama 3 (32 query heads, 8 K/V
heads), so the ring sends *less* than Ulysses for ``P < 5``. Ulysses also needs ``P`` to divide
``H_kv`` (each rank gets whole K/V heads; this function refuses otherwise).

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

Ulysses needs no zig-zag or striped layout: every rank computes the full causal triangle of its
heads, so the causal work is balanced by construction.
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.distributed import communication
from attn_course.distributed.layout import check_shards

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


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                      group=None) -> torch.Tensor:
    """Self-attention over a sequence split across ranks, DeepSpeed-Ulysses style.

    Called on every rank of the group with that rank's shard (contiguous layout: rank ``r``
    holds tokens ``r · N/P .. (r+1) · N/P - 1``, as :func:`~attn_course.distributed.layout.shard`
    cuts them). Returns this rank's rows of ``self_attention(q_full, k_full, v_full)``.
    Differentiable: gradients flow back to each rank's own shards through the inverse
    all-to-alls.

    Args:
        q: this rank's shard of the queries, ``[B, H, N/P, d]``; the same shapes on every rank.
        k, v: this rank's shards of the keys and values, ``[B, H_kv, N/P, d]`` and ``[B, H_kv, N/P, d_v]``:
            ``H_kv = H`` or, for grouped-query attention, a divisor of it (query head ``h`` reads K/V
            head ``h // (H / H_kv)``); only the ``H_kv`` heads are sent.
        causal: mask future positions of the full sequence (query ``i`` sees keys ``j <= i``).
        group: the process group (default: the whole world).

    Returns:
        ``[B, H, N/P, d_v]``: the attention output of this rank's tokens.

    Raises:
        TypeError, ValueError: inputs that are not floating 4-D tensors of one dtype and device
            with matching shapes, ``causal`` not a bool, ``H`` not divisible by ``H_kv``, or ``H_kv``
            not divisible by ``P`` (each rank needs whole K/V heads).
        RuntimeError: no process group.

    Example (on each of ``P`` ranks, inside :func:`~attn_course.distributed.launch.launch`; not run
    as a doctest, which has no group)::

            q_local = shard(q, rank, P)                                  # [B, H, N/P, d]
            out_local = ulysses_attention(q_local, k_local, v_local, causal=True)
    """
    where = "ulysses_attention"
    check_shards(where, q, k, v)
    causal = _validate.boolean(where, "causal", causal)
    heads, kv_heads = q.shape[1], k.shape[1]
    world_size = communication.group_size(where, group)
    if kv_heads % world_size:
        h = "H_kv" if kv_heads < heads else "H"
        raise ValueError(f"{where}: the number of {'K/V heads' if kv_heads < heads else 'heads'} {h}={kv_heads} must "
                         f"be divisible by the number of ranks P={world_size}: Ulysses gives each rank {h}/P whole "
                         f"heads (use P <= {h}, a divisor of {h}, or ring attention, which has no such limit)")
    # 1. all-to-all: this rank's tokens of every head -> every token of this rank's heads.
    #    Only the H_kv K/V heads travel: rank r gets query heads r·H/P .. and K/V heads r·H_kv/P ..,
    #    which are exactly the K/V heads its query heads read (query head h reads K/V head h // G).
    q_heads = sequence_to_heads(q, group)                       # [B, H/P, N, d]
    k_heads = sequence_to_heads(k, group)                       # [B, H_kv/P, N, d]
    v_heads = sequence_to_heads(v, group)                       # [B, H_kv/P, N, d_v]
    groups = heads // kv_heads
    k_heads, v_heads = (t.repeat_interleave(groups, dim=1) for t in (k_heads, v_heads))   # [B, H/P, N, ·]
    # 2. ordinary attention on whole heads, over the full sequence.
    n = q_heads.shape[2]
    mask = causal_mask(n, device=q.device) if causal else None  # [N, N]
    out_heads, _ = self_attention(q_heads, k_heads, v_heads, mask)   # [B, H/P, N, d_v]
    # 3. all-to-all back: every token of this rank's heads -> this rank's tokens of every head.
    return heads_to_sequence(out_heads, group)                  # [B, H, N/P, d_v]


def ulysses_bytes(batch: int, heads: int, n: int, head_dim: int, world_size: int, *, element_size: int = 4,
                  backward: bool = False, kv_heads: int | None = None) -> int:
    """Bytes one rank sends in :func:`ulysses_attention`: four all-to-alls of ``(P - 1)/P`` of a shard.

    ``(P - 1)/P · (2 · S_q + 2 · S_kv) · element_size`` forward, with ``S_q = B · H · (N/P) · d``
    (q and the output) and ``S_kv = B · H_kv · (N/P) · d`` (k and v; ``S_kv = S_q`` without
    grouped-query attention: ``4 · (P - 1)/P · S_q``); twice that with ``backward`` (the gradients of
    out, q, k and v travel back the same way, in the input's dtype). Exact: every rank sends the same.

    Args:
        batch, heads, n, head_dim: ``B``, ``H``, the full ``N`` and ``d`` (``d_v = d``).
        world_size: ``P``; ``H_kv`` and ``N`` divisible by it.
        element_size: bytes per element (4 for float32).
        backward: count the backward pass too.
        kv_heads: ``H_kv``, the K/V heads (a divisor of ``H``); None for ``H``.

    Returns:
        Bytes sent per rank.

    Raises:
        TypeError, ValueError: sizes that are not positive ints, ``H`` not divisible by ``H_kv``,
            ``H_kv`` or ``N`` not divisible by ``P``.

    Example:
        >>> ulysses_bytes(1, 4, 64, 16, 4)          # 4 · 3/4 of a [1, 4, 16, 16] float32 shard
        12288
        >>> ulysses_bytes(1, 32, 64, 16, 4, kv_heads=8)    # 3/4 · (2 · 32 + 2 · 8) heads of 16 tokens · 16
        61440
    """
    where = "ulysses_bytes"
    batch, heads, n, head_dim, world_size, element_size = (
        _validate.integer(where, name, value, minimum=1) for name, value in (
            ("batch", batch), ("heads", heads), ("n", n), ("head_dim", head_dim), ("world_size", world_size),
            ("element_size", element_size)))
    _validate.boolean(where, "backward", backward)
    kv_name = "heads" if kv_heads is None else "kv_heads"
    kv_heads = heads if kv_heads is None else _validate.integer(where, "kv_heads", kv_heads, minimum=1)
    if heads % kv_heads:
        raise ValueError(f"{where}: heads={heads} must be divisible by kv_heads={kv_heads}")
    for name, value in ((kv_name, kv_heads), ("n", n)):
        if value % world_size:
            raise ValueError(f"{where}: {name}={value} must be divisible by world_size={world_size}")
    token_bytes = batch * (n // world_size) * head_dim * element_size             # one head of a shard
    passes = 2 if backward else 1
    return passes * (world_size - 1) * (2 * heads + 2 * kv_heads) * token_bytes // world_size
