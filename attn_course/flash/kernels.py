"""FlashAttention in Triton: the forward kernel, and flash-decoding's two kernels.

Each program instance (one "block" of a GPU grid) owns one tile of rows of one
(batch, head) pair and streams over the other side's tiles, keeping everything it
accumulates in registers/SRAM. Nothing N × N is ever written to global memory (HBM).

The backward kernels are in :mod:`attn_course.flash.kernels_backward`. Conventions shared by
all of them:

* Tensors are addressed through their strides, so non-contiguous inputs work.
* Scores are kept in base 2: ``s₂ = (q · k) · scale · log₂e`` so that ``exp`` becomes
  the cheaper ``exp2``; ``exp2(s₂ - m₂) = exp(s - m)``. The factor is computed once per
  program. The forward and decoding kernels here multiply it into each float32 score tile and
  subtract the row maximum after: the product feeds both the maximum and the subtraction, so
  each score costs two float32 operations (the sm_90 PTX of the causal forward at d = 64: 273
  multiplies, 72 subtractions and 72 FMAs for 136 exponentials, against the TMA kernel's 153,
  8 and 136, the accumulator's rescaling included in both). The TMA forward
  (:mod:`attn_course.flash.kernels_tma`, Hopper's path) folds the factor in after the maximum,
  as Triton's tutorial does, ``m₂ = max(q · k) · scale·log₂e`` (the scale is positive) and
  ``exp2(q·k · scale·log₂e - m₂)``: one FMA per score (``tests/flash/test_flash_tma.py``
  counts them in its sm_90 PTX). The backward's recomputation ``exp2(q·k · scale·log₂e - LSE₂)``
  is one FMA too. Pre-scaling Q or K instead would round ``q · scale`` to float16 once more:
  measured here, that doubles the float16 LSE error and breaks the FlashAttention error rule,
  for no saving.
* ``LSE`` holds each query row's log-sum-exp, ``[B·H, N_q]`` in float32: natural log from the
  forward (what users see), base 2 into the backward (the launcher converts it once), so the
  backward recomputes ``P = exp2(s₂ - LSE₂)`` without storing it and without a per-tile ``log₂e``.
* Grouped-query attention: ``K``, ``V`` have ``H_kv = H / G`` heads; query head ``h`` reads
  key/value head ``h // G`` through the pointer arithmetic, without copying. The dK/dV kernel
  loops over the ``G`` query heads of its group and sums their contributions.
* Causal is bottom-right aligned: the queries are the last ``N_q`` positions, so query ``i``
  sees key ``j`` iff ``j <= i + (N_k - N_q)`` (``N_q <= N_k``; equal lengths give ``j <= i``).
* Masks only where needed: each loop runs in stages, as in Triton's fused-attention tutorial.
  Tiles that every row sees in full (strictly below the diagonal, and not the partial last
  tile) run with no mask at all; only the diagonal band and the partial last tile are masked.
* Each kernel spells out its parameters (a kernel takes tensors and numbers, no structures), so
  the signatures, strides first, repeat from kernel to kernel.
* Every offset is computed in int64: positions are widened (``.to(tl.int64)``) before they meet a
  stride. A position times a row stride passes 2**31 elements in a packed ``[B, N, 3, H, d]`` QKV
  view past about 174k tokens, or in a cache of millions of keys, and so does a row *inside* a tile
  once the row stride times the tile's height passes 2**31; int32 would wrap.
* Grids are one-dimensional where they span batch and heads: program ``p`` runs tile ``p % T`` of
  batch·head ``p // T`` (``T`` tiles per head), tile fastest, as a ``(T, B·H)`` grid would order them.
  CUDA allows 2**31 - 1 programs along a grid's x axis but only 65,535 along y and z, and ``B·H``
  (or ``B·H_kv``) passes that: ``B = 2048`` sequences of 32 heads. The launcher builds the grid
  (:func:`~attn_course.flash.launch.program_grid`).
* Causal forward programs take their query tiles in reverse order: program 0 of each head runs
  the last query tile, which sees the most keys, so the heaviest programs start first and the
  light ones fill the GPU's last wave.

The launchers load this file through :func:`~attn_course.flash.triton_mode.define_kernels`,
which defines its kernels compiled for a GPU or, without one, for Triton's interpreter.
"""

import triton
import triton.language as tl

from attn_course.flash import configs

# Globals used inside kernels must be compile-time constants.
LOG2_E = tl.constexpr(1.4426950408889634)   # log2(e): exp(x) == exp2(x * LOG2_E)
LN_2 = tl.constexpr(0.6931471805599453)     # ln(2):   log(x) == log2(x) * LN_2
# Flash-decoding splits the keys at multiples of this many keys, whatever the key tile
# (64 or 128, both divide it): the splits, and so the partial buffers, do not depend on the
# configuration the autotuner picks.
DECODE_SPLIT_ALIGN = tl.constexpr(configs.DECODE_SPLIT_ALIGN)


@triton.jit
def forward_key_tiles(acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       rows, dims, n_k, causal_offset, scale_log2, key_begin, key_end,
                       BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Steps 5-6 over key tiles ``key_begin .. key_end``; ``MASKED`` tiles check bounds and causality."""
    for key_start in range(key_begin, key_end, BLOCK_N):
        keys = key_start + tl.arange(0, BLOCK_N)                              # [BLOCK_N] positions
        # Offsets in int64, as every offset here: key × stride can pass 2**31 elements.
        wide_keys = keys.to(tl.int64)
        # K is loaded transposed, [d, BLOCK_N], so the score tile is one matrix product.
        k_pointers = k_base + wide_keys[None, :] * stride_kn + dims[:, None] * stride_kd
        v_pointers = v_base + wide_keys[:, None] * stride_vn + dims[None, :] * stride_vd
        if MASKED:
            k_t = tl.load(k_pointers, mask=keys[None, :] < n_k, other=0.0)
            v = tl.load(v_pointers, mask=keys[:, None] < n_k, other=0.0)      # [BLOCK_N, d]
        else:   # a full tile that every row sees in full: no mask to build or apply
            k_t = tl.load(k_pointers)
            v = tl.load(v_pointers)
        scores = tl.dot(q, k_t) * scale_log2                                  # [BLOCK_M, BLOCK_N], base 2
        if MASKED:
            visible = keys[None, :] < n_k
            if CAUSAL:
                visible = visible & (keys[None, :] <= rows[:, None] + causal_offset)
            scores = tl.where(visible, scores, float("-inf"))
        # 6. Online softmax: raise the maximum, rescale what we had, add this tile.
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        correction = tl.exp2(row_max - new_max)          # exp(m_old - m_new); 0 on the first tile
        probabilities = tl.exp2(scores - new_max[:, None])                    # [BLOCK_M, BLOCK_N]
        row_sum = row_sum * correction + tl.sum(probabilities, 1)
        # The rescaling acc · correction is separate FP32 work; only the addition of P V folds into
        # the matrix multiply, which accumulates into the tensor it is given.
        acc = tl.dot(probabilities.to(v.dtype), v, acc * correction[:, None])
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def key_stages(query_start, n_q, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Step 4 of :func:`attention_forward_kernel` (written out there, where chapter 07 reads it) for the
    query tile at ``query_start``: ``(causal_offset, unmasked_end, key_end)``, the key tiles every row
    sees ending at ``unmasked_end``, the masked ones at ``key_end``. The dQ kernel and the TMA forward
    walk their key tiles in the same two stages."""
    causal_offset = n_k - n_q
    full_tiles_end = (n_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        unmasked_end = tl.minimum(full_tiles_end, ((query_start + causal_offset + 1) // BLOCK_N) * BLOCK_N)
        key_end = tl.minimum(n_k, query_start + BLOCK_M + causal_offset)
    else:
        unmasked_end = full_tiles_end
        key_end = n_k
    return causal_offset, unmasked_end, key_end


@triton.jit
def batch_and_kv_head(batch_kv_head, num_heads, num_kv_groups):
    """The batch and the key/value head of ``batch_kv_head``, a program's index among the ``B·H_kv``
    (the decode and dK/dV kernels'), in int64: offsets can pass 2**31."""
    num_kv_heads = num_heads // num_kv_groups
    return (batch_kv_head // num_kv_heads).to(tl.int64), (batch_kv_head % num_kv_heads).to(tl.int64)


@triton.jit
def attention_forward_kernel(
    Q, K, V, Out, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    num_heads, num_kv_groups, n_q, n_k, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Grid ``(cdiv(N_q, BLOCK_M) · B·H,)``: one tile of BLOCK_M queries per program."""
    # 1. Which rows are mine: query tile `tile` of head `head` in batch `batch`. The grid is one
    #    line of programs, `num_tiles` per (batch, head), tile fastest (CUDA takes 2**31 - 1
    #    programs along x but only 65,535 along y, fewer than B·H can be). The keys and values
    #    are those of the head's group, `head // num_kv_groups` (grouped-query attention).
    #    Causal: the last query tile sees the most keys, so it is launched first (tile 0 of the
    #    grid takes it): the heaviest programs start first and the light ones fill the tail.
    num_tiles = tl.cdiv(n_q, BLOCK_M)
    tile = tl.program_id(0) % num_tiles
    if CAUSAL:
        tile = num_tiles - 1 - tile
    batch_head = tl.program_id(0) // num_tiles
    batch = (batch_head // num_heads).to(tl.int64)   # int64, as every offset: they can pass 2**31
    head = (batch_head % num_heads).to(tl.int64)
    kv_head = head // num_kv_groups
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)      # [BLOCK_M] query positions
    dims = tl.arange(0, HEAD_DIM).to(tl.int64)         # [HEAD_DIM]
    wide_rows = rows.to(tl.int64)                      # row × stride can pass 2**31 elements
    q_base = Q + batch * stride_qb + head * stride_qh
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    # 2. Load my queries once; they stay on chip for the whole loop.
    q = tl.load(q_base + wide_rows[:, None] * stride_qn + dims[None, :] * stride_qd,
                mask=rows[:, None] < n_q, other=0.0)                          # [BLOCK_M, d]
    scale_log2 = scale * LOG2_E

    # 3. Running statistics of the online softmax, in float32.
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)             # m (base 2)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)                           # l
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)                     # Σ p · v

    # 4. Which key tiles, in two stages. Query i sees key j iff j <= i + causal_offset.
    #    Stage 1: tiles of keys every row of mine sees (below the diagonal, and not the partial
    #    last tile): unmasked. Stage 2: the diagonal band and the partial last tile: masked.
    #    Causal: tiles after the band are all in the future, so the loop stops there.
    causal_offset = n_k - n_q
    full_tiles_end = (n_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        unmasked_end = tl.minimum(full_tiles_end, ((tile * BLOCK_M + causal_offset + 1) // BLOCK_N) * BLOCK_N)
        key_end = tl.minimum(n_k, (tile + 1) * BLOCK_M + causal_offset)
    else:
        unmasked_end = full_tiles_end
        key_end = n_k
    # 5-6. Stream over the key tiles: scores, online softmax, accumulate P V.
    acc, row_max, row_sum = forward_key_tiles(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        rows, dims, n_k, causal_offset, scale_log2, 0, unmasked_end, BLOCK_N=BLOCK_N, MASKED=False, CAUSAL=CAUSAL)
    acc, row_max, row_sum = forward_key_tiles(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        rows, dims, n_k, causal_offset, scale_log2, unmasked_end, key_end,
        BLOCK_N=BLOCK_N, MASKED=True, CAUSAL=CAUSAL)

    # 7. Normalise once, write the output tile and the log-sum-exp for the backward pass.
    out = acc / row_sum[:, None]
    o_base = Out + batch * stride_ob + head * stride_oh
    tl.store(o_base + wide_rows[:, None] * stride_on + dims[None, :] * stride_od,
             out.to(Out.dtype.element_ty), mask=rows[:, None] < n_q)
    lse = (row_max + tl.log2(row_sum)) * LN_2                                  # natural log
    tl.store(LSE + batch_head.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)


@triton.jit
def attention_decode_kernel(
    Q, K, V, PartialOut, PartialLSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    num_heads, num_kv_groups, n_q, n_k, scale, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Flash-decoding, step 1. Grid ``(S · B·H_kv, 1, cdiv(G·N_q, BLOCK_M))``: one split of the keys each.

    With a handful of queries the forward kernel's grid, ``cdiv(N_q, BLOCK_M)·B·H``, is a few
    dozen programs: most of a GPU's ~100 multiprocessors would sit idle while each program
    streams the whole cache. Here the keys are cut into ``S`` splits (``num_splits``) and each
    program attends to one split only. Its rows are the ``G·N_q`` (query head, query) pairs
    of one key/value head, packed together, so a grouped-query cache is read once per group,
    not once per query head. Each program writes its partial, normalised output and its
    partial log-sum-exp (base 2) in float32; :func:`attention_decode_merge_kernel` combines
    the ``S`` partials of each row by the log-sum-exp rule.

    Splits are whole blocks of ``A = DECODE_SPLIT_ALIGN`` (128) keys: split ``s`` covers blocks
    ``s·F // S .. (s+1)·F // S`` of the ``F = N_k // A`` full blocks, and the last split also
    takes the keys after them. The launcher keeps ``S <= max(F, 1)`` and ``N_q <= 16``, so that
    every split starts at or before key ``N_k - N_q``, the last key the first query sees
    (bottom-right causal): no row of any split is empty, and no partial is ``0/0``.
    ``PartialOut`` is contiguous ``[B·H, S, N_q, d]``, ``PartialLSE`` ``[B·H, S, N_q]``.
    """
    split = tl.program_id(0) % num_splits                 # split fastest, then batch · key/value head
    batch, kv_head = batch_and_kv_head(tl.program_id(0) // num_splits, num_heads, num_kv_groups)
    row_chunk = tl.program_id(2)
    # 1. My rows: packed (group member, query) pairs, row r = member · N_q + query.
    packed = row_chunk * BLOCK_M + tl.arange(0, BLOCK_M)                     # [BLOCK_M]
    member = packed // n_q
    query = packed % n_q           # the query's index among the N_q: what the causal rule needs
    valid = packed < num_kv_groups * n_q
    head = kv_head * num_kv_groups + member                                   # [BLOCK_M] query heads, int64
    dims = tl.arange(0, HEAD_DIM).to(tl.int64)                                # int64, as every offset
    q = tl.load(Q + batch * stride_qb + head[:, None] * stride_qh + query.to(tl.int64)[:, None] * stride_qn
                + dims[None, :] * stride_qd, mask=valid[:, None], other=0.0)  # [BLOCK_M, d]
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    scale_log2 = scale * LOG2_E

    # 2. My split of the keys, in whole blocks of DECODE_SPLIT_ALIGN; the last split runs to N_k.
    full_blocks = n_k // DECODE_SPLIT_ALIGN
    key_begin = (split * full_blocks // num_splits) * DECODE_SPLIT_ALIGN
    key_end = ((split + 1) * full_blocks // num_splits) * DECODE_SPLIT_ALIGN
    key_end = tl.where(split == num_splits - 1, n_k, key_end)
    full_tiles = n_k // BLOCK_N

    # 3. The forward kernel's two stages, inside the split: keys every row sees (all of them
    #    without causality; those up to N_k - N_q with it) unmasked, the rest masked.
    causal_offset = n_k - n_q
    unmasked_end = tl.minimum(key_end, full_tiles * BLOCK_N)
    if CAUSAL:
        unmasked_end = tl.minimum(unmasked_end, ((causal_offset + 1) // BLOCK_N) * BLOCK_N)
    unmasked_end = tl.maximum(unmasked_end, key_begin)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, row_max, row_sum = forward_key_tiles(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        query, dims, n_k, causal_offset, scale_log2, key_begin, unmasked_end,
        BLOCK_N=BLOCK_N, MASKED=False, CAUSAL=CAUSAL)
    acc, row_max, row_sum = forward_key_tiles(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        query, dims, n_k, causal_offset, scale_log2, unmasked_end, key_end,
        BLOCK_N=BLOCK_N, MASKED=True, CAUSAL=CAUSAL)

    # 4. This split's partial result: normalised output and log-sum-exp, both in float32.
    batch_head = batch * num_heads + head                                     # [BLOCK_M]
    partial_row = (batch_head * num_splits + split) * n_q + query             # [BLOCK_M]
    tl.store(PartialOut + partial_row[:, None] * HEAD_DIM + dims[None, :], acc / row_sum[:, None],
             mask=valid[:, None])
    tl.store(PartialLSE + partial_row, row_max + tl.log2(row_sum), mask=valid)


@triton.jit
def attention_decode_merge_kernel(
    PartialOut, PartialLSE, Out, LSE,
    stride_ob, stride_oh, stride_on, stride_od,
    num_heads, n_q, num_splits,
    HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
):
    """Flash-decoding, step 2. Grid ``(B·H·N_q,)``: one row (query head, query) each.

    The log-sum-exp rule: with partial outputs ``o_s`` and log-sum-exps ``ℓ_s`` (base 2),
    ``ℓ = log₂ Σ_s 2^ℓ_s`` and ``o = Σ_s 2^(ℓ_s - ℓ) · o_s``, computed from the largest
    ``ℓ_s`` so that no power overflows. ``SPLITS`` is ``num_splits`` rounded up to a power of 2.
    """
    row = tl.program_id(0).to(tl.int64)            # = (batch · H + head) · N_q + query
    batch_head = row // n_q
    query = row % n_q
    splits = tl.arange(0, SPLITS)
    dims = tl.arange(0, HEAD_DIM).to(tl.int64)     # int64, as every offset
    partial_rows = (batch_head * num_splits + splits) * n_q + query           # [SPLITS]
    present = splits < num_splits
    lse_parts = tl.load(PartialLSE + partial_rows, mask=present, other=float("-inf"))
    largest = tl.max(lse_parts, 0)
    weights = tl.exp2(lse_parts - largest)                                    # 0 for absent splits
    total = tl.sum(weights, 0)
    parts = tl.load(PartialOut + partial_rows[:, None] * HEAD_DIM + dims[None, :],
                    mask=present[:, None], other=0.0)                         # [SPLITS, d]
    out = tl.sum(parts * weights[:, None], 0) / total                         # [d]
    batch = batch_head // num_heads
    head = batch_head % num_heads
    tl.store(Out + batch * stride_ob + head * stride_oh + query * stride_on + dims * stride_od,
             out.to(Out.dtype.element_ty))
    tl.store(LSE + row, (largest + tl.log2(total)) * LN_2)                     # natural log
