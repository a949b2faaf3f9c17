"""The FlashAttention forward kernel again, with Q, K, V and Out moved by tensor descriptors (TMA).

Same algorithm, same results as :func:`~attn_course.flash.kernels.attention_forward_kernel`;
only the way tiles travel between global memory (HBM) and the chip changes. There, each
``tl.load`` builds a ``[rows, d]`` grid of addresses and a bounds mask, and every thread
fetches its own elements. Here, each matrix is described once, a *tensor descriptor*
``(base, shape, strides, block_shape)``, and a tile is asked for by its corner:
``k_desc.load([batch, head, key_start, 0])``. On Hopper GPUs (sm_90: H100, H200) the compiler
turns that into one TMA instruction (``cp.async.bulk.tensor``): a copy engine moves the whole
tile into shared memory while the warps compute, and fills rows outside ``shape`` with zeros, so
the loads need no mask and the stores write no row past the end.

The descriptors are 4-D, over ``[B, heads, N, d]`` with ``[1, 1, rows, d]`` tiles, not over the
flattened ``[B·H·N, d]`` tensor as Triton's fused-attention tutorial does: then a tile that runs
past ``N`` is zero-filled instead of reading the next head's rows, so any ``N`` works and the
inputs may have any (aligned) strides. The descriptors' strides are 64-bit, so no offset wraps.

``HOST_DESCRIPTORS``: the launcher builds the four descriptors on the host once per call
(``triton.tools.tensor_descriptor.TensorDescriptor``) and passes them in place of the pointers
(:func:`~attn_course.flash.tma_attention.attention_forward_tma`); without that class, each
program builds them itself (``tl.make_tensor_descriptor``) in a scratch buffer Triton asks an
allocator for. TMA's rules are the launcher's checks: the last dimension contiguous (stride 1),
the other strides and the base addresses multiples of 16 bytes.

Triton's interpreter runs descriptors too (with the same alignment checks, and zero padding),
so the tests check this kernel on the CPU against float64 as they do the pointer kernel; that
TMA and ``wgmma`` are really used on sm_90 is checked by compiling ahead of time
(``python -m gpu_tools.aot``, apart from the course), which needs no GPU.
"""

import triton
import triton.language as tl

from attn_course.flash.kernels import LN_2, LOG2_E, key_stages


@triton.jit
def forward_key_tile_tma(acc, row_max, row_sum, q, k_desc, v_desc, batch, kv_head, key_start, rows, n_k,
                         causal_offset, scale_log2, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                         MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Steps 5-6 for the key tile at ``key_start``; a ``MASKED`` tile masks scores for bounds and causality."""
    # 5. This tile of keys and values, by TMA. Rows past N_k arrive as zeros: no load mask.
    k = k_desc.load([batch, kv_head, key_start, 0]).reshape([BLOCK_N, HEAD_DIM])     # [BLOCK_N, d]
    v = v_desc.load([batch, kv_head, key_start, 0]).reshape([BLOCK_N, HEAD_DIM])     # [BLOCK_N, d]
    # The transpose is free: the matrix unit reads K from shared memory either way round.
    scores = tl.dot(q, tl.trans(k))                            # [BLOCK_M, BLOCK_N], q·k, not yet scaled
    if MASKED:
        # A zero-filled key scores 0, not -inf: keys past N_k must still be masked out here.
        keys = key_start + tl.arange(0, BLOCK_N)                                      # [BLOCK_N]
        visible = keys[None, :] < n_k
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None] + causal_offset)
        scores = tl.where(visible, scores, float("-inf"))
    # 6. Online softmax, base 2, with the scale folded in after the row maximum (scale > 0, so the
    #    maximum of scaled scores is the scaled maximum): each score then costs one FMA,
    #    s · scale·log₂e - m, before its exp2.
    new_max = tl.maximum(row_max, tl.max(scores, 1) * scale_log2)
    correction = tl.exp2(row_max - new_max)              # exp(m_old - m_new); 0 on the first tile
    probabilities = tl.exp2(scores * scale_log2 - new_max[:, None])                   # [BLOCK_M, BLOCK_N]
    row_sum = row_sum * correction + tl.sum(probabilities, 1)
    # The rescaling acc · correction is separate FP32 work; only the addition of P V folds into
    # the matrix multiply, which accumulates into the tensor it is given.
    acc = tl.dot(probabilities.to(v.dtype), v, acc * correction[:, None])             # [BLOCK_M, d]
    return acc, new_max, row_sum


@triton.jit
def forward_key_tiles_tma(acc, row_max, row_sum, q, k_desc, v_desc, batch, kv_head, rows, n_k, causal_offset,
                          scale_log2, key_begin, key_end, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                          MASKED: tl.constexpr, CAUSAL: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """Steps 5-6 over key tiles ``key_begin .. key_end``.

    ``WARP_SPECIALIZE`` (unmasked tiles only): ``tl.range(..., warp_specialize=True)``, where Triton
    splits the loop between producer warps (the TMA loads) and consumer warps (the matrix products
    and the softmax), as FlashAttention-3 does by hand. Off by default: Triton's issues report
    crashes for two-loop causal kernels like this one (see :mod:`attn_course.flash.tma_attention`).
    The branch is on a constant, so a Triton whose ``tl.range`` lacks the option compiles the other.
    """
    if WARP_SPECIALIZE:
        for key_start in tl.range(key_begin, key_end, BLOCK_N, warp_specialize=True):
            acc, row_max, row_sum = forward_key_tile_tma(
                acc, row_max, row_sum, q, k_desc, v_desc, batch, kv_head, key_start, rows, n_k, causal_offset,
                scale_log2, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, MASKED=MASKED, CAUSAL=CAUSAL)
    else:
        for key_start in range(key_begin, key_end, BLOCK_N):
            acc, row_max, row_sum = forward_key_tile_tma(
                acc, row_max, row_sum, q, k_desc, v_desc, batch, kv_head, key_start, rows, n_k, causal_offset,
                scale_log2, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, MASKED=MASKED, CAUSAL=CAUSAL)
    return acc, row_max, row_sum


@triton.jit
def attention_forward_tma_kernel(
    Q, K, V, Out, LSE,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    num_heads, num_kv_groups, n_q, n_k, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    HOST_DESCRIPTORS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """Grid ``(cdiv(N_q, BLOCK_M) · B·H,)``: one tile of BLOCK_M queries per program, as the pointer kernel's.

    With ``HOST_DESCRIPTORS``, ``Q``, ``K``, ``V``, ``Out`` are tensor descriptors over
    ``[B, heads, N, d]`` with ``[1, 1, BLOCK_M or BLOCK_N, d]`` blocks and the strides are unused;
    otherwise they are pointers and the strides those of
    :func:`~attn_course.flash.kernels.attention_forward_kernel` without the last dimension's,
    which TMA requires to be 1. ``LSE`` is float32 ``[B·H, N_q]``.
    """
    # 1. Which rows are mine: query tile `tile` of head `head` in batch `batch`, from a line of
    #    programs, `num_tiles` per (batch, head), tile fastest; the keys and values are those of
    #    the head's group, `head // num_kv_groups` (grouped-query attention).
    #    Causal: the last query tile sees the most keys, so it is launched first (tile 0 of the
    #    grid takes it): the heaviest programs start first and the light ones fill the tail.
    num_tiles = tl.cdiv(n_q, BLOCK_M)
    tile = tl.program_id(0) % num_tiles
    if CAUSAL:
        tile = num_tiles - 1 - tile
    batch_head = tl.program_id(0) // num_tiles
    batch = batch_head // num_heads
    head = batch_head % num_heads
    kv_head = head // num_kv_groups
    query_start = tile * BLOCK_M
    rows = query_start + tl.arange(0, BLOCK_M)         # [BLOCK_M] query positions

    # Descriptors: the [B, heads, N, d] tensors, read and written one [1, 1, rows, d] tile at a
    # time. Their shape is what TMA checks bounds against, so a tile past N reads zeros and
    # writes nothing.
    if HOST_DESCRIPTORS:
        q_desc, k_desc, v_desc, o_desc = Q, K, V, Out
    else:   # one call per tensor, each with its own eight arguments: a helper would only pass them on
        num_batches = tl.num_programs(0) // (num_tiles * num_heads)
        num_kv_heads = num_heads // num_kv_groups
        q_desc = tl.make_tensor_descriptor(Q, shape=[num_batches, num_heads, n_q, HEAD_DIM],
                                           strides=[stride_qb, stride_qh, stride_qn, 1],
                                           block_shape=[1, 1, BLOCK_M, HEAD_DIM])
        k_desc = tl.make_tensor_descriptor(K, shape=[num_batches, num_kv_heads, n_k, HEAD_DIM],
                                           strides=[stride_kb, stride_kh, stride_kn, 1],
                                           block_shape=[1, 1, BLOCK_N, HEAD_DIM])
        v_desc = tl.make_tensor_descriptor(V, shape=[num_batches, num_kv_heads, n_k, HEAD_DIM],
                                           strides=[stride_vb, stride_vh, stride_vn, 1],
                                           block_shape=[1, 1, BLOCK_N, HEAD_DIM])
        o_desc = tl.make_tensor_descriptor(Out, shape=[num_batches, num_heads, n_q, HEAD_DIM],
                                           strides=[stride_ob, stride_oh, stride_on, 1],
                                           block_shape=[1, 1, BLOCK_M, HEAD_DIM])

    # 2. Load my queries once; they stay on chip for the whole loop. Rows past N_q are zeros.
    q = q_desc.load([batch, head, query_start, 0]).reshape([BLOCK_M, HEAD_DIM])      # [BLOCK_M, d]
    scale_log2 = scale * LOG2_E

    # 3. Running statistics of the online softmax, in float32.
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)             # m (base 2, scaled)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)                           # l
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)                     # Σ p · v

    # 4. Which key tiles, in two stages, exactly as the pointer kernel. Query i sees key j iff
    #    j <= i + causal_offset. Stage 1: tiles of keys every row of mine sees (below the
    #    diagonal, and not the partial last tile): unmasked. Stage 2: the diagonal band and the
    #    partial last tile: masked. Causal: tiles after the band are all in the future.
    causal_offset, unmasked_end, key_end = key_stages(query_start, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    # 5-6. Stream over the key tiles: scores, online softmax, accumulate P V.
    acc, row_max, row_sum = forward_key_tiles_tma(
        acc, row_max, row_sum, q, k_desc, v_desc, batch, kv_head, rows, n_k, causal_offset, scale_log2,
        0, unmasked_end, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, MASKED=False, CAUSAL=CAUSAL,
        WARP_SPECIALIZE=WARP_SPECIALIZE)
    acc, row_max, row_sum = forward_key_tiles_tma(
        acc, row_max, row_sum, q, k_desc, v_desc, batch, kv_head, rows, n_k, causal_offset, scale_log2,
        unmasked_end, key_end, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, MASKED=True, CAUSAL=CAUSAL,
        WARP_SPECIALIZE=False)

    # 7. Normalise once and write the output tile by TMA (rows past N_q are dropped, no mask),
    #    and the log-sum-exp for the backward pass (plain pointers: one float per row).
    out = acc / row_sum[:, None]                                              # [BLOCK_M, d]
    o_desc.store([batch, head, query_start, 0], out.to(o_desc.dtype).reshape([1, 1, BLOCK_M, HEAD_DIM]))
    lse = (row_max + tl.log2(row_sum)) * LN_2                                  # natural log
    tl.store(LSE + batch_head.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)
