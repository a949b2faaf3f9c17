"""FlashAttention in Triton: the forward kernel and the two backward kernels.

Each program instance (one "block" of a GPU grid) owns one tile of rows of one
(batch, head) pair and streams over the other side's tiles, keeping everything it
accumulates in registers/SRAM. Nothing N × N is ever written to global memory (HBM).

Conventions shared by the three kernels:

* Tensors are addressed through their strides, so non-contiguous inputs work.
* Scores are kept in base 2: ``s₂ = (q · k) · scale · log₂e`` so that ``exp`` becomes
  the cheaper ``exp2``; ``exp2(s₂ - m₂) = exp(s - m)``. The factor is computed once per
  program and multiplied into each float32 score tile right before the subtraction, which the
  compiler fuses into one FMA (as Triton's tutorial does). Pre-scaling Q or K instead would
  round ``q · scale`` to float16 once more: measured here, that doubles the float16 LSE error
  and breaks the FlashAttention error rule, for no saving (the FMA costs what the subtraction did).
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

This file is loaded by :mod:`attn_course.flash.triton_attention`, twice if need be: once
compiled for the GPU and once for Triton's interpreter on the CPU.
"""

import triton
import triton.language as tl

# Globals used inside kernels must be compile-time constants.
LOG2_E = tl.constexpr(1.4426950408889634)   # log2(e): exp(x) == exp2(x * LOG2_E)
LN_2 = tl.constexpr(0.6931471805599453)     # ln(2):   log(x) == log2(x) * LN_2
# Flash-decoding splits the keys at multiples of this many keys, whatever the key tile
# (64 or 128, both divide it): the splits, and so the partial buffers, do not depend on the
# configuration the autotuner picks.
DECODE_SPLIT_ALIGN = tl.constexpr(128)


@triton.jit
def forward_key_tiles(acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       rows, dims, n_k, causal_offset, scale_log2, key_begin, key_end,
                       BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Steps 5-6 over key tiles ``key_begin .. key_end``; ``MASKED`` tiles check bounds and causality."""
    for key_start in range(key_begin, key_end, BLOCK_N):
        keys = key_start + tl.arange(0, BLOCK_N)                              # [BLOCK_N]
        # K is loaded transposed, [d, BLOCK_N], so the score tile is one matrix product.
        k_pointers = k_base + keys[None, :] * stride_kn + dims[:, None] * stride_kd
        v_pointers = v_base + keys[:, None] * stride_vn + dims[None, :] * stride_vd
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
        # acc · correction + P V in one instruction: the product accumulates into acc.
        acc = tl.dot(probabilities.to(v.dtype), v, acc * correction[:, None])
        row_max = new_max
    return acc, row_max, row_sum


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
    """Grid ``(cdiv(N_q, BLOCK_M), B·H)``: one tile of BLOCK_M queries per program."""
    # 1. Which rows are mine: query tile `tile` of head `head` in batch `batch`; the keys and
    #    values are those of the head's group, `head // num_kv_groups` (grouped-query attention).
    tile = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // num_heads).to(tl.int64)   # int64: offsets can pass 2**31
    head = (batch_head % num_heads).to(tl.int64)
    kv_head = head // num_kv_groups
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)      # [BLOCK_M] query positions
    dims = tl.arange(0, HEAD_DIM)                      # [HEAD_DIM]
    q_base = Q + batch * stride_qb + head * stride_qh
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    # 2. Load my queries once; they stay on chip for the whole loop.
    q = tl.load(q_base + rows[:, None] * stride_qn + dims[None, :] * stride_qd,
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
    tl.store(o_base + rows[:, None] * stride_on + dims[None, :] * stride_od,
             out.to(Out.dtype.element_ty), mask=rows[:, None] < n_q)
    lse = (row_max + tl.log2(row_sum)) * LN_2                                  # natural log
    tl.store(LSE + batch_head.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)


@triton.jit
def dkdv_query_tiles(dk, dv, k, v, q_base, do_base, LSE, Delta, stats_base,
                      stride_qn, stride_qd, stride_don, stride_dod,
                      keys, dims, n_q, causal_offset, scale_log2, row_begin, row_end,
                      BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """dK, dV contributions of query tiles ``row_begin .. row_end`` of one query head.

    Keys past ``N_k`` need no mask here: they are zero rows of ``k``/``v`` whose own (unstored)
    rows of dK/dV are the only ones they touch. ``MASKED`` tiles check query bounds and causality.
    """
    for row_start in range(row_begin, row_end, BLOCK_M):
        rows = row_start + tl.arange(0, BLOCK_M)                              # [BLOCK_M]
        q_pointers = q_base + rows[None, :] * stride_qn + dims[:, None] * stride_qd
        do_pointers = do_base + rows[:, None] * stride_don + dims[None, :] * stride_dod
        if MASKED:
            q_t = tl.load(q_pointers, mask=rows[None, :] < n_q, other=0.0)    # [d, BLOCK_M]
            do = tl.load(do_pointers, mask=rows[:, None] < n_q, other=0.0)    # [BLOCK_M, d]
            lse = tl.load(LSE + stats_base + rows, mask=rows < n_q, other=0.0)    # base 2
            delta = tl.load(Delta + stats_base + rows, mask=rows < n_q, other=0.0)
        else:
            q_t = tl.load(q_pointers)
            do = tl.load(do_pointers)
            lse = tl.load(LSE + stats_base + rows)
            delta = tl.load(Delta + stats_base + rows)
        # Recompute this tile of weights, transposed: p_t[j, i] = P[i, j]; one FMA, all base 2.
        p_t = tl.exp2(tl.dot(k, q_t) * scale_log2 - lse[None, :])             # [BLOCK_N, BLOCK_M]
        if MASKED:
            visible = rows[None, :] < n_q
            if CAUSAL:
                visible = visible & (keys[:, None] <= rows[None, :] + causal_offset)
            p_t = tl.where(visible, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)                                 # += Pᵀ dO
        dp_t = tl.dot(v, tl.trans(do))                                        # (dO Vᵀ)ᵀ
        ds_t = p_t * (dp_t - delta[None, :])                                  # [BLOCK_N, BLOCK_M]
        dk = tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk)                    # += dSᵀ Q
    return dk, dv


@triton.jit
def attention_backward_dkdv_kernel(
    Q, K, V, dOut, LSE, Delta, dK, dV,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    num_heads, num_kv_groups, n_q, n_k, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Grid ``(cdiv(N_k, BLOCK_N), B·H_kv)``: dK and dV of one tile of keys per program.

    With ``P = exp(s - LSE)`` recomputed tile by tile and ``Δ = rowsum(dO ∘ O)``:
    ``dV = Pᵀ dO``, ``dP = dO Vᵀ``, ``dS = P ∘ (dP - Δ)``, ``dK = scale · dSᵀ Q``.
    Everything is held transposed (keys along the rows) so that the sums over queries
    are matrix products. With grouped-query attention the program loops over the
    ``num_kv_groups`` query heads that share its key/value head and sums over them in
    registers. ``LSE`` is in base 2 here. ``dK``/``dV`` are contiguous ``[B, H_kv, N_k, d]``.
    """
    tile = tl.program_id(0)
    batch_kv_head = tl.program_id(1)
    num_kv_heads = num_heads // num_kv_groups
    batch = (batch_kv_head // num_kv_heads).to(tl.int64)
    kv_head = (batch_kv_head % num_kv_heads).to(tl.int64)
    keys = tile * BLOCK_N + tl.arange(0, BLOCK_N)                             # [BLOCK_N]
    dims = tl.arange(0, HEAD_DIM)

    # My keys and values, loaded once; they stay on chip for all the group's query tiles.
    k = tl.load(K + batch * stride_kb + kv_head * stride_kh + keys[:, None] * stride_kn + dims[None, :] * stride_kd,
                mask=keys[:, None] < n_k, other=0.0)                          # [BLOCK_N, d]
    scale_log2 = scale * LOG2_E
    v = tl.load(V + batch * stride_vb + kv_head * stride_vh + keys[:, None] * stride_vn + dims[None, :] * stride_vd,
                mask=keys[:, None] < n_k, other=0.0)                          # [BLOCK_N, d]
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    # Which query tiles, in three stages (query i sees key j iff j <= i + causal_offset):
    # the diagonal band (masked), the tiles that see all my keys (unmasked), the partial last
    # tile (masked). Causal: queries before the band see none of my keys and are skipped.
    causal_offset = n_k - n_q
    full_tiles_end = (n_q // BLOCK_M) * BLOCK_M
    if CAUSAL:
        band_begin = (tl.maximum(tile * BLOCK_N - causal_offset, 0) // BLOCK_M) * BLOCK_M
        band_end = tl.cdiv(tl.maximum((tile + 1) * BLOCK_N - 1 - causal_offset, 0), BLOCK_M) * BLOCK_M
        band_end = tl.maximum(tl.minimum(band_end, full_tiles_end), band_begin)
    else:
        band_begin = 0
        band_end = 0
    for group_member in range(0, num_kv_groups):
        head = kv_head * num_kv_groups + group_member
        q_base = Q + batch * stride_qb + head * stride_qh
        do_base = dOut + batch * stride_dob + head * stride_doh
        stats_base = (batch * num_heads + head) * n_q
        dk, dv = dkdv_query_tiles(dk, dv, k, v, q_base, do_base, LSE, Delta, stats_base,
                                   stride_qn, stride_qd, stride_don, stride_dod, keys, dims, n_q,
                                   causal_offset, scale_log2,
                                   band_begin, band_end, BLOCK_M=BLOCK_M, MASKED=True, CAUSAL=CAUSAL)
        dk, dv = dkdv_query_tiles(dk, dv, k, v, q_base, do_base, LSE, Delta, stats_base,
                                   stride_qn, stride_qd, stride_don, stride_dod, keys, dims, n_q,
                                   causal_offset, scale_log2,
                                   band_end, full_tiles_end, BLOCK_M=BLOCK_M, MASKED=False, CAUSAL=CAUSAL)
        dk, dv = dkdv_query_tiles(dk, dv, k, v, q_base, do_base, LSE, Delta, stats_base,
                                   stride_qn, stride_qd, stride_don, stride_dod, keys, dims, n_q,
                                   causal_offset, scale_log2,
                                   tl.maximum(full_tiles_end, band_end), n_q,
                                   BLOCK_M=BLOCK_M, MASKED=True, CAUSAL=CAUSAL)

    out_offsets = batch_kv_head.to(tl.int64) * n_k * HEAD_DIM + keys[:, None] * HEAD_DIM + dims[None, :]
    tl.store(dK + out_offsets, (dk * scale).to(dK.dtype.element_ty), mask=keys[:, None] < n_k)
    tl.store(dV + out_offsets, dv.to(dV.dtype.element_ty), mask=keys[:, None] < n_k)


@triton.jit
def dq_key_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                  rows, dims, n_k, causal_offset, scale_log2, key_begin, key_end,
                  BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """dQ contributions of key tiles ``key_begin .. key_end``; ``MASKED`` tiles check bounds and causality."""
    for key_start in range(key_begin, key_end, BLOCK_N):
        keys = key_start + tl.arange(0, BLOCK_N)
        k_pointers = k_base + keys[:, None] * stride_kn + dims[None, :] * stride_kd
        v_pointers = v_base + keys[None, :] * stride_vn + dims[:, None] * stride_vd
        if MASKED:
            k = tl.load(k_pointers, mask=keys[:, None] < n_k, other=0.0)      # [BLOCK_N, d]
            v_t = tl.load(v_pointers, mask=keys[None, :] < n_k, other=0.0)    # [d, BLOCK_N]
        else:
            k = tl.load(k_pointers)
            v_t = tl.load(v_pointers)
        p = tl.exp2(tl.dot(q, tl.trans(k)) * scale_log2 - lse[:, None])      # [BLOCK_M, BLOCK_N], base 2
        if MASKED:
            visible = keys[None, :] < n_k
            if CAUSAL:
                visible = visible & (keys[None, :] <= rows[:, None] + causal_offset)
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, v_t)                                                  # dO Vᵀ
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)                                    # += dS K
    return dq


@triton.jit
def attention_backward_dq_kernel(
    Q, K, V, dOut, LSE, Delta, dQ,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    num_heads, num_kv_groups, n_q, n_k, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Grid ``(cdiv(N_q, BLOCK_M), B·H)``: dQ of one tile of queries per program.

    ``dQ = scale · dS K`` with ``dS = P ∘ (dO Vᵀ - Δ)``. A separate kernel (rather than
    atomic adds from the dK/dV kernel) keeps the result deterministic. ``LSE`` is in base 2.
    ``dQ`` is contiguous ``[B, H, N_q, d]``.
    """
    tile = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // num_heads).to(tl.int64)
    head = (batch_head % num_heads).to(tl.int64)
    kv_head = head // num_kv_groups
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)                             # [BLOCK_M]
    dims = tl.arange(0, HEAD_DIM)
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    stats_base = batch_head.to(tl.int64) * n_q

    q = tl.load(Q + batch * stride_qb + head * stride_qh + rows[:, None] * stride_qn + dims[None, :] * stride_qd,
                mask=rows[:, None] < n_q, other=0.0)                          # [BLOCK_M, d]
    scale_log2 = scale * LOG2_E
    do = tl.load(dOut + batch * stride_dob + head * stride_doh + rows[:, None] * stride_don
                 + dims[None, :] * stride_dod, mask=rows[:, None] < n_q, other=0.0)
    lse = tl.load(LSE + stats_base + rows, mask=rows < n_q, other=0.0)
    delta = tl.load(Delta + stats_base + rows, mask=rows < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # The same two stages as the forward: full tiles below the diagonal unmasked, then the
    # diagonal band and the partial last tile masked. Rows past N_q need no mask in the loop:
    # their dO and Δ are zero, so is their dS, and their rows of dQ are not stored.
    causal_offset = n_k - n_q
    full_tiles_end = (n_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        unmasked_end = tl.minimum(full_tiles_end, ((tile * BLOCK_M + causal_offset + 1) // BLOCK_N) * BLOCK_N)
        key_end = tl.minimum(n_k, (tile + 1) * BLOCK_M + causal_offset)
    else:
        unmasked_end = full_tiles_end
        key_end = n_k
    dq = dq_key_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       rows, dims, n_k, causal_offset, scale_log2, 0, unmasked_end,
                       BLOCK_N=BLOCK_N, MASKED=False, CAUSAL=CAUSAL)
    dq = dq_key_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       rows, dims, n_k, causal_offset, scale_log2, unmasked_end, key_end,
                       BLOCK_N=BLOCK_N, MASKED=True, CAUSAL=CAUSAL)

    out_offsets = batch_head.to(tl.int64) * n_q * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :]
    tl.store(dQ + out_offsets, (dq * scale).to(dQ.dtype.element_ty), mask=rows[:, None] < n_q)


@triton.jit
def attention_decode_kernel(
    Q, K, V, PartialOut, PartialLSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    num_heads, num_kv_groups, n_q, n_k, scale, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Flash-decoding, step 1. Grid ``(S, B·H_kv, cdiv(G·N_q, BLOCK_M))``: one split of the keys each.

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
    split = tl.program_id(0)
    batch_kv_head = tl.program_id(1)
    row_chunk = tl.program_id(2)
    num_kv_heads = num_heads // num_kv_groups
    batch = (batch_kv_head // num_kv_heads).to(tl.int64)
    kv_head = (batch_kv_head % num_kv_heads).to(tl.int64)
    # 1. My rows: packed (group member, query) pairs, row r = member · N_q + query.
    packed = row_chunk * BLOCK_M + tl.arange(0, BLOCK_M)                     # [BLOCK_M]
    member = packed // n_q
    query = packed % n_q           # the query's index among the N_q: what the causal rule needs
    valid = packed < num_kv_groups * n_q
    head = kv_head * num_kv_groups + member                                   # [BLOCK_M] query heads
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + batch * stride_qb + head[:, None] * stride_qh + query[:, None] * stride_qn
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
    dims = tl.arange(0, HEAD_DIM)
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
