"""Ring attention (Liu, Zaharia and Abbeel 2023, arXiv 2310.01889): exact attention over a sequence
split across ``P`` ranks, each holding ``N / P`` tokens, by passing key/value blocks around a ring.

Every rank keeps its queries and, in ``P`` steps, sees every rank's keys and values once:

    step s:  hold the K/V block of rank (r - s) mod P
             start passing it on to rank r + 1          (it travels while we compute)
             attend this rank's queries to the block    (FlashAttention tiles, each with its LSE)
             merge into the running output by LSE       (chapter 06's merge)
             receive rank (r - s - 1)'s block from rank r - 1

No rank ever holds more than two K/V blocks, so the memory per rank is ``O(N / P)`` and the
sequence length grows with the number of ranks. The answer is exact, not approximate: merging
partial attentions over disjoint key sets by their log-sum-exps
(:func:`~attn_course.flash.tiled.merge_attention_outputs`) gives attention over the union.

With a causal mask, a query chunk and a key chunk are either fully visible (every key before
every query: no mask), fully masked (every key after every query: skipped, no compute) or on the
diagonal (the mask ``key position <= query position``): :func:`chunk_pairs`. The contiguous layout
leaves rank 0 with one pair to compute and rank ``P - 1`` with ``P``; the zig-zag layout (rank ``r``
holds chunks ``r`` and ``2P - 1 - r``) gives every rank ``2P + 1`` chunk pairs; the striped layout
(rank ``r`` holds tokens ``r, r + P, ...``; Brandon et al. 2023, arXiv 2311.09431) puts every step's
one pair on the diagonal, about half visible, so every rank computes ``P`` masked pairs and skips none
(:func:`~attn_course.distributed.ring_work.ring_work`).

The backward pass circulates K/V once more and recomputes each tile's weights from the saved
log-sum-exp (FlashAttention's backward, :func:`block_gradients`); the dK/dV accumulators travel with
the block they belong to and arrive home with one last hop (:class:`RingAttentionFunction`).

Nothing here counts: :mod:`attn_course.measure.distributed.taps` wraps the two steps,
:func:`attend_to_block` and :func:`block_gradients`, and the communication helpers from outside.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import torch
import torch.distributed as dist

from attn_course import _validate
from attn_course.distributed import communication
from attn_course.distributed.layout import check_layout, check_shards, chunk_count, shard, token_positions
from attn_course.flash.tiled import merge_attention_outputs

__all__ = ["ring_attention", "RingAttentionFunction", "ring_attention_on_rank", "accumulation_dtype",
           "ChunkPair", "chunk_pairs", "attend_to_block", "block_gradients"]


# --- one step of the ring: this rank's query chunks against the K/V block it holds -------------------

@dataclasses.dataclass(frozen=True)
class ChunkPair:
    """One (query chunk, key chunk) pair of a ring step: where the chunks sit in the shards, and their mask."""

    rows: slice                      # the query chunk, within this rank's shard
    cols: slice                      # the key chunk, within the K/V block held
    mask: torch.Tensor | None        # [rows, cols] bool, True = may attend; None = every key visible
    hidden: bool = False             # every key after every query: nothing to compute


def chunk_pairs(rank: int, source: int, world_size: int, n_local: int, layout: str, causal: bool,
                device: torch.device) -> list[ChunkPair]:
    """Every (query chunk, key chunk) pair of the step at which ``rank`` holds the K/V block of rank ``source``.

    Positions come from :func:`~attn_course.distributed.layout.token_positions`: a key chunk after every
    query of a query chunk is ``hidden`` (skipped), one before every query needs no mask, the rest (the
    diagonal) get ``key position <= query position``. With the striped layout each rank has one chunk, its
    whole shard, and (for ``N / P >= 2``) every pair is on the diagonal.
    """
    n = n_local * world_size
    length = n // chunk_count(world_size, layout)                            # tokens per chunk
    spans = [slice(start, start + length) for start in range(0, n_local, length)]
    query_pos = token_positions(rank, world_size, n, layout).to(device)       # [n_local]
    key_pos = token_positions(source, world_size, n, layout).to(device)       # [n_local]
    pairs = []
    for rows in spans:
        for cols in spans:
            q_pos, k_pos = query_pos[rows], key_pos[cols]
            if not causal or k_pos.max() <= q_pos.min():            # every key visible: no mask
                pairs.append(ChunkPair(rows, cols, None))
            elif k_pos.min() > q_pos.max():                          # every key in the future: skip
                pairs.append(ChunkPair(rows, cols, None, hidden=True))
            else:                                                    # the diagonal: mask the future
                pairs.append(ChunkPair(rows, cols, k_pos[None, :] <= q_pos[:, None]))
    return pairs


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype ring attention computes its tiles and running sums in, for inputs of ``dtype``.

    float32 for bfloat16 and float16 inputs (FlashAttention's kernels keep scores, the
    softmax's statistics and every accumulator in float32 whatever the input, and so do
    production ring implementations: rounding each of ``P`` merges to 8 bits of mantissa would
    add ``P`` roundings to every output), the input's dtype otherwise (float32, float64).

    Example:
        >>> accumulation_dtype(torch.bfloat16), accumulation_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"accumulation_dtype: dtype must be a floating torch.dtype, got {dtype!r}")
    return torch.promote_types(dtype, torch.float32)


def _repeat_heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, H_kv, n, d]`` to ``[B, H_kv · groups, n, d]``, each K/V head once per query head that reads it
    (no copy when there is nothing to repeat)."""
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     scale: float, acc: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of a query chunk over one key chunk and its log-sum-exp (one FlashAttention tile),
    computed in ``acc`` (as a GPU kernel multiplies half-precision tiles into float32 accumulators).
    ``k`` and ``v`` may have fewer heads than ``q`` (grouped-query attention: query head ``h`` reads K/V
    head ``h // G``); they are repeated here, on the tile, so only the ``H_kv`` heads travel."""
    groups = q.shape[1] // k.shape[1]                                         # query heads per K/V head
    q, k, v = q.to(acc), _repeat_heads(k.to(acc), groups), _repeat_heads(v.to(acc), groups)   # [B, H, cols, d]
    scores = q @ k.transpose(-2, -1) * scale                                  # [B, H, rows, cols]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                                     # [B, H, rows]
    safe_lse = lse.masked_fill(lse == float("-inf"), 0.0)                     # a row that sees nothing
    weights = torch.exp(scores - safe_lse.unsqueeze(-1))                      # [B, H, rows, cols]
    return weights @ v, lse                                                   # [B, H, rows, d_v]


def attend_to_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pairs: list[ChunkPair], scale: float,
                    acc: torch.dtype) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
    """One forward step: attend this rank's query chunks to the K/V block held, tile by tile, in ``acc``
    (:func:`accumulation_dtype`); hidden pairs are skipped.

    Yields:
        ``(rows, out [B, H, rows, d_v], lse [B, H, rows])`` for each computed pair: the query chunk's rows
        of the shard and its attention over the key chunk, for the ring to merge.
    """
    for pair in pairs:
        if not pair.hidden:
            yield pair.rows, *_block_attention(q[:, :, pair.rows], k[:, :, pair.cols], v[:, :, pair.cols], pair.mask,
                                          scale, acc)


def block_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pairs: list[ChunkPair], scale: float,
                    grad_out: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor,
                    dq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One backward step: recompute each tile's weights ``P = exp(S - LSE)`` from the saved ``lse`` and
    take its gradients, adding ``dQ`` into ``dq`` (in place). ``q``, ``grad_out``, ``lse``, ``delta`` and
    ``dq`` are in the accumulation dtype; ``k`` and ``v`` the block held, at its ``H_kv`` heads.

    Returns:
        ``(dK, dV)`` of the block from this rank's queries, ``[B, H_kv, N_local, d]``, in ``q``'s dtype.
    """
    groups = q.shape[1] // k.shape[1]                                         # query heads per K/V head
    k, v = _repeat_heads(k.to(q.dtype), groups), _repeat_heads(v.to(q.dtype), groups)   # [B, H, n, d]
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for pair in pairs:
        if pair.hidden:
            continue
        q_tile, k_tile, v_tile = q[:, :, pair.rows], k[:, :, pair.cols], v[:, :, pair.cols]
        scores = q_tile @ k_tile.transpose(-2, -1) * scale                    # [B, H, rows, cols]
        if pair.mask is not None:
            scores = scores.masked_fill(~pair.mask, float("-inf"))
        weights = torch.exp(scores - lse[:, :, pair.rows, None])              # P = exp(S - LSE)
        grad_out_tile = grad_out[:, :, pair.rows]                             # [B, H, rows, d_v]
        dv[:, :, pair.cols] += weights.transpose(-2, -1) @ grad_out_tile                  # dV += Pᵀ dO
        grad_weights = grad_out_tile @ v_tile.transpose(-2, -1)               # dP = dO Vᵀ
        grad_scores = weights * (grad_weights - delta[:, :, pair.rows, None])             # dS = P ∘ (dP - Δ)
        dq[:, :, pair.rows] += scale * (grad_scores @ k_tile)                             # dQ += scale · dS K
        dk[:, :, pair.cols] += scale * (grad_scores.transpose(-2, -1) @ q_tile)          # dK += scale · dSᵀ Q
    if groups > 1:                        # a K/V head's gradient: the sum over the G query heads that read it
        dk, dv = (t.unflatten(1, (-1, groups)).sum(dim=2) for t in (dk, dv))            # [B, H_kv, n, d]
    return dk, dv


# --- the ring: P steps forward, P steps (and one hop) backward -----------------------------------------

def _ring_forward(q, k, v, causal, layout, group, scale):
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    acc = accumulation_dtype(q.dtype)                                         # float32 for bf16/fp16
    out = q.new_zeros((*q.shape[:3], v.shape[-1]), dtype=acc)                 # [B, H, n_local, d_v]
    lse = q.new_full(q.shape[:3], float("-inf"), dtype=acc)                   # [B, H, n_local]
    k_block, v_block = k, v                                                   # step 0: our own block
    for step in range(world_size):
        source = (rank - step) % world_size                                   # whose block we hold
        # 1. Start passing the block we hold to rank r + 1 (the last step has no one left to feed).
        #    K and V travel in the input's dtype: the running sums never leave the rank.
        transfer = (communication.pass_around_ring([k_block, v_block], group=group)
                    if step < world_size - 1 else None)
        # 2. Attend every query chunk to every visible key chunk of the block, while it travels.
        pairs = chunk_pairs(rank, source, world_size, q.shape[2], layout, causal, q.device)
        for rows, block_out, block_lse in attend_to_block(q, k_block, v_block, pairs, scale, acc):
            # 3. Merge into the running output by log-sum-exp (chapter 06's merge), in float32.
            out[:, :, rows], lse[:, :, rows] = merge_attention_outputs(out[:, :, rows], lse[:, :, rows],
                                                                       block_out, block_lse)
        # 4. Receive the previous rank's block: the one to attend to at the next step.
        if transfer is not None:
            k_block, v_block = transfer.wait()
    return out.to(q.dtype), lse                                               # lse stays in float32


def _ring_backward(q, k, v, out, lse, grad_out, causal, layout, group, scale):
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    acc = accumulation_dtype(q.dtype)
    # Δ_i = rowsum(dO ∘ O): the softmax backward's correction, one number per query (in float32).
    delta = (grad_out.to(acc) * out.to(acc)).sum(dim=-1)                      # [B, H, n_local]
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))                 # exp(S - LSE) = 0, not NaN
    q_acc, grad_out = q.to(acc), grad_out.to(acc)                             # the queries never move
    dq = torch.zeros_like(q_acc)                                              # [B, H, n_local, d]
    k_block, v_block = k, v
    grads_transfer = None
    for step in range(world_size):
        source = (rank - step) % world_size
        # 1. Start passing the K/V block on, as in the forward (in the input's dtype).
        kv_transfer = (communication.pass_around_ring([k_block, v_block], group=group)
                       if step < world_size - 1 else None)
        # 2. This rank's queries' share of the block's gradients, in float32 (dQ stays here).
        pairs = chunk_pairs(rank, source, world_size, q.shape[2], layout, causal, q.device)
        dk_block, dv_block = block_gradients(q_acc, k_block, v_block, pairs, scale, grad_out, lse, delta, dq)
        # 3. Add what the ranks before us summed for this block (it followed the block from r - 1),
        #    and pass the sum on with it; after P hops it reaches the block's owner. The sum travels
        #    in float32: rounded to bf16 at every hop it would lose P roundings' worth of bits.
        if grads_transfer is not None:
            dk_before, dv_before = grads_transfer.wait()
            dk_block, dv_block = dk_block + dk_before, dv_block + dv_before
        grads_transfer = communication.pass_around_ring([dk_block, dv_block], group=group)
        # 4. Receive the next K/V block.
        if kv_transfer is not None:
            k_block, v_block = kv_transfer.wait()
    # 5. The last hop brings home our own block's dK, dV, summed over every rank's queries.
    dk, dv = grads_transfer.wait()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# --- the autograd function and the public entry point -------------------------------------------------

class RingAttentionFunction(torch.autograd.Function):
    """Ring attention with a backward pass that circulates K/V again (what :func:`ring_attention` runs).

    ``RingAttentionFunction.apply(q, k, v, causal, layout, group, scale)`` returns this rank's
    output shard. Saved for the backward: ``q``, ``k``, ``v`` (this rank's shards), the output and the
    log-sum-exp (in :func:`accumulation_dtype`, float32 for half precision), ``O(N / P)`` per (batch,
    head); no weights. Scores, weights, Δ and every gradient sum are computed in the accumulation
    dtype, as FlashAttention's kernels do, and cast back to the input's dtype only when returned.

    The backward runs the ring once more: at step ``s`` rank ``r`` holds rank ``(r - s)``'s K/V block
    and a dK/dV accumulator for it, received from rank ``r - 1``; it passes the block on, adds its
    queries' share of the block's gradients (:func:`block_gradients`; dQ stays here) and passes the
    accumulator on, one hop behind the block. One last hop brings each accumulator to its block's
    owner: ``P - 1`` hops of K/V (in the input's dtype) and ``P`` of dK/dV (in the accumulation dtype:
    a sum rounded to bfloat16 at every hop would lose bits at each of ``P`` additions) per rank,
    ``2 (P - 1) · S · e + 2P · S · max(e, 4)`` bytes with ``S = B · H_kv · N_local · d`` (``d_v = d``)
    and ``e`` the input's element size.

    Args (of ``apply``): as :func:`ring_attention`, with ``scale`` a positive float.

    Returns:
        ``out [B, H, N_local, d_v]``, this rank's output shard.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, layout, group, scale):
        with torch.no_grad():
            out, lse = _ring_forward(q, k, v, causal, layout, group, scale)
        ctx.save_for_backward(q, k, v, out, lse)                              # O(N / P), no weights
        ctx.options = (causal, layout, group, scale)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        causal, layout, group, scale = ctx.options
        with torch.no_grad():
            dq, dk, dv = _ring_backward(q, k, v, out, lse, grad_out.contiguous(), causal, layout, group, scale)
        return dq, dk, dv, None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   layout: str = "contiguous", group=None) -> torch.Tensor:
    """Exact attention over a sequence sharded across the ranks of a process group (ring attention).

    Every rank calls it with its own shards, cut with
    :func:`~attn_course.distributed.layout.shard` (q, k and v the same way), and gets its shard
    of the output; :func:`~attn_course.distributed.layout.unshard` of all ranks' outputs equals
    single-process attention on the full tensors. The forward pass takes ``P`` steps, as the module
    docstring draws them: pass the block held on (:func:`~attn_course.distributed.communication.pass_around_ring`,
    so the transfer overlaps the compute), attend to it (:func:`attend_to_block`, the causal mask
    deciding per chunk pair from the chunks' global positions, :func:`chunk_pairs`), merge by log-sum-exp
    (:func:`~attn_course.flash.tiled.merge_attention_outputs`), receive the next block.

    Each rank sends ``2 · (P - 1) · B · H_kv · N_local · d · element size`` bytes in the forward
    (with ``d_v = d``; :func:`~attn_course.measure.distributed.taps.count_traffic` counts them) and
    computes :func:`~attn_course.distributed.ring_work.ring_work` chunk pairs
    (:func:`~attn_course.measure.distributed.taps.count_ring_work` counts them). Differentiable: the
    backward (:class:`RingAttentionFunction`) circulates K/V again, recomputing the weights from
    the saved log-sum-exp, and sends each block's dK/dV home.

    Args:
        q: ``[B, H, N_local, d]``, this rank's queries (``N_local = N / P``).
        k: ``[B, H_kv, N_local, d]``, this rank's keys, cut like ``q``; ``H_kv`` divides ``H``
            (grouped-query attention: query head ``h`` reads K/V head ``h // (H / H_kv)``; only the
            ``H_kv`` heads travel around the ring).
        v: ``[B, H_kv, N_local, d_v]``, this rank's values, cut like ``q``.
        causal: query at position ``i`` sees the keys at positions ``0 .. i`` of the whole sequence.
        layout: how the sequence was cut, one of
            :data:`~attn_course.distributed.layout.LAYOUTS`: ``"contiguous"``, ``"zigzag"``
            (``N_local`` even) or ``"striped"``.
        group: the process group (default: the whole world). Every rank of it must call this
            with shards of one shape and dtype: that is not checked across ranks (it would cost a
            message per call); gloo aborts a mismatched transfer with "Received data size doesn't
            match expected size", which :func:`~attn_course.distributed.launch.launch` reports.

    Returns:
        ``out [B, H, N_local, d_v]``: this rank's shard of the attention output, in q's order.

    Raises:
        TypeError: q, k, v not floating tensors of one dtype, ``causal`` not a bool.
        ValueError: shapes that do not match, ``H`` not divisible by ``H_kv``, an unknown layout, an odd
            ``N_local`` with the zig-zag layout.
        RuntimeError: no process group (run inside :func:`~attn_course.distributed.launch.launch`
            or after ``torch.distributed.init_process_group``).

    Example:
        >>> from attn_course.distributed import launch, unshard
        >>> q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
        >>> shards = launch(ring_attention_on_rank, 2, q, k, v, True, "zigzag")   # 2 processes
        >>> reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> torch.allclose(unshard(shards, "zigzag"), reference, atol=1e-6)
        True
    """
    where = "ring_attention"
    check_shards(where, q, k, v)
    causal = _validate.boolean(where, "causal", causal)
    layout = check_layout(where, layout)
    if layout == "zigzag" and q.shape[2] % 2:
        raise ValueError(f"{where}: the zig-zag layout needs an even N_local (two equal chunks per rank), got q with "
                         f"N_local={q.shape[2]}; pad the sequence to a multiple of 2P")
    communication.group_size(where, group)                                   # a process group must exist
    return RingAttentionFunction.apply(q, k, v, causal, layout, group, 1.0 / math.sqrt(q.shape[-1]))


def ring_attention_on_rank(rank: int, world_size: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           causal: bool = False, layout: str = "contiguous") -> torch.Tensor:
    """Cut the full ``q``, ``k``, ``v`` to this rank's shards and run :func:`ring_attention` on them:
    a function for :func:`~attn_course.distributed.launch.launch` to run on every rank.

    Args:
        rank, world_size: this rank and ``P`` (given by the launcher).
        q, k, v: the full ``[B, H, N, d]`` tensors (``N`` divisible by ``P``, or ``2P`` for zig-zag).
        causal, layout: as in :func:`ring_attention`.

    Returns:
        ``[B, H, N / P, d_v]``, this rank's output shard (``unshard`` the list the launcher returns).

    Raises:
        As :func:`~attn_course.distributed.layout.shard` and :func:`ring_attention`.
    """
    parts = [shard(t, rank, world_size, layout) for t in (q, k, v)]
    return ring_attention(*parts, causal=causal, layout=layout)
