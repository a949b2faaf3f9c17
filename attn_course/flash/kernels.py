"""FlashAttention in Triton: the forward kernel and the two backward kernels.

Each program instance (one "block" of a GPU grid) owns one tile of rows of one
(batch, head) pair and streams over the other side's tiles, keeping everything it
accumulates in registers/SRAM. Nothing N × N is ever written to global memory (HBM).

Conventions shared by the three kernels:

* Tensors are addressed through their strides, so non-contiguous inputs work.
* Scores are kept in base 2: ``s₂ = (q · k) · scale · log₂e`` so that ``exp`` becomes
  the cheaper ``exp2``; ``exp2(s₂ - m₂) = exp(s - m)``.
* ``LSE`` holds the natural log-sum-exp of each query row, ``[B·H, N_q]`` in float32. The
  forward writes it; the backward uses it to recompute the weights ``P = exp(s - LSE)``
  without storing them.
* Rows past ``N_q`` and keys past ``N_k`` are masked, so any length works; for ``CAUSAL``
  key ``j`` is visible to query ``i`` only when ``j <= i``.

This file is loaded by :mod:`attn_course.flash.triton_attention`, twice if need be: once
compiled for the GPU and once for Triton's interpreter on the CPU.
"""

import triton
import triton.language as tl

# Globals used inside kernels must be compile-time constants.
LOG2_E = tl.constexpr(1.4426950408889634)   # log2(e): exp(x) == exp2(x * LOG2_E)
LN_2 = tl.constexpr(0.6931471805599453)     # ln(2):   log(x) == log2(x) * LN_2


@triton.jit
def attention_forward_kernel(
    Q, K, V, Out, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    num_heads, n_q, n_k, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Grid ``(cdiv(N_q, BLOCK_M), B·H)``: one tile of BLOCK_M queries per program."""
    # 1. Which rows are mine: query tile `tile` of head `head` in batch `batch`.
    tile = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // num_heads).to(tl.int64)   # int64: offsets can pass 2**31
    head = (batch_head % num_heads).to(tl.int64)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)      # [BLOCK_M] query positions
    cols = tl.arange(0, BLOCK_N)                       # [BLOCK_N] key offsets in a tile
    dims = tl.arange(0, HEAD_DIM)                      # [HEAD_DIM]
    q_base = Q + batch * stride_qb + head * stride_qh
    k_base = K + batch * stride_kb + head * stride_kh
    v_base = V + batch * stride_vb + head * stride_vh

    # 2. Load my queries once; they stay on chip for the whole loop.
    q = tl.load(q_base + rows[:, None] * stride_qn + dims[None, :] * stride_qd,
                mask=rows[:, None] < n_q, other=0.0)                          # [BLOCK_M, d]

    # 3. Running statistics of the online softmax, in float32.
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)             # m (base 2)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)                           # l
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)                     # Σ p · v
    scale_log2 = scale * LOG2_E

    # 4. Causal: key tiles that start after my last query are all in the future: skip them.
    if CAUSAL:
        key_end = tl.minimum(n_k, (tile + 1) * BLOCK_M)
    else:
        key_end = n_k
    for key_start in range(0, key_end, BLOCK_N):
        keys = key_start + cols                                               # [BLOCK_N]
        # K is loaded transposed, [d, BLOCK_N], so the score tile is one matrix product.
        k_t = tl.load(k_base + keys[None, :] * stride_kn + dims[:, None] * stride_kd,
                      mask=keys[None, :] < n_k, other=0.0)
        scores = tl.dot(q, k_t) * scale_log2                                  # [BLOCK_M, BLOCK_N]
        visible = keys[None, :] < n_k
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        # 5. Online softmax: raise the maximum, rescale what we had, add this tile.
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        correction = tl.exp2(row_max - new_max)          # exp(m_old - m_new); 0 on the first tile
        probabilities = tl.exp2(scores - new_max[:, None])                    # [BLOCK_M, BLOCK_N]
        row_sum = row_sum * correction + tl.sum(probabilities, 1)
        v = tl.load(v_base + keys[:, None] * stride_vn + dims[None, :] * stride_vd,
                    mask=keys[:, None] < n_k, other=0.0)                      # [BLOCK_N, d]
        acc = acc * correction[:, None] + tl.dot(probabilities.to(v.dtype), v)
        row_max = new_max

    # 6. Normalise once, write the output tile and the log-sum-exp for the backward pass.
    out = acc / row_sum[:, None]
    o_base = Out + batch * stride_ob + head * stride_oh
    tl.store(o_base + rows[:, None] * stride_on + dims[None, :] * stride_od,
             out.to(Out.dtype.element_ty), mask=rows[:, None] < n_q)
    lse = (row_max + tl.log2(row_sum)) * LN_2                                  # natural log
    tl.store(LSE + batch_head.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)


@triton.jit
def attention_backward_dkdv_kernel(
    Q, K, V, dOut, LSE, Delta, dK, dV,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    num_heads, n_q, n_k, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Grid ``(cdiv(N_k, BLOCK_N), B·H)``: dK and dV of one tile of keys per program.

    With ``P = exp(s - LSE)`` recomputed tile by tile and ``Δ = rowsum(dO ∘ O)``:
    ``dV = Pᵀ dO``, ``dP = dO Vᵀ``, ``dS = P ∘ (dP - Δ)``, ``dK = scale · dSᵀ Q``.
    Everything is held transposed (keys along the rows) so that the sums over queries
    are matrix products. ``dK``/``dV`` are contiguous ``[B, H, N_k, d]``.
    """
    tile = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // num_heads).to(tl.int64)
    head = (batch_head % num_heads).to(tl.int64)
    keys = tile * BLOCK_N + tl.arange(0, BLOCK_N)                             # [BLOCK_N]
    rows_in_tile = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q_base = Q + batch * stride_qb + head * stride_qh
    do_base = dOut + batch * stride_dob + head * stride_doh
    stats_base = batch_head.to(tl.int64) * n_q

    k = tl.load(K + batch * stride_kb + head * stride_kh + keys[:, None] * stride_kn + dims[None, :] * stride_kd,
                mask=keys[:, None] < n_k, other=0.0)                          # [BLOCK_N, d]
    v = tl.load(V + batch * stride_vb + head * stride_vh + keys[:, None] * stride_vn + dims[None, :] * stride_vd,
                mask=keys[:, None] < n_k, other=0.0)                          # [BLOCK_N, d]
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    scale_log2 = scale * LOG2_E

    # Causal: queries before my first key cannot see any of my keys.
    if CAUSAL:
        query_start = (tile * BLOCK_N // BLOCK_M) * BLOCK_M
    else:
        query_start = 0
    for row_start in range(query_start, n_q, BLOCK_M):
        rows = row_start + rows_in_tile                                       # [BLOCK_M]
        q_t = tl.load(q_base + rows[None, :] * stride_qn + dims[:, None] * stride_qd,
                      mask=rows[None, :] < n_q, other=0.0)                    # [d, BLOCK_M]
        do = tl.load(do_base + rows[:, None] * stride_don + dims[None, :] * stride_dod,
                     mask=rows[:, None] < n_q, other=0.0)                     # [BLOCK_M, d]
        lse = tl.load(LSE + stats_base + rows, mask=rows < n_q, other=0.0)    # [BLOCK_M]
        delta = tl.load(Delta + stats_base + rows, mask=rows < n_q, other=0.0)
        # Recompute this tile of weights, transposed: p_t[j, i] = P[i, j].
        scores_t = tl.dot(k, q_t) * scale_log2                                # [BLOCK_N, BLOCK_M]
        visible = (keys[:, None] < n_k) & (rows[None, :] < n_q)
        if CAUSAL:
            visible = visible & (keys[:, None] <= rows[None, :])
        p_t = tl.where(visible, tl.exp2(scores_t - lse[None, :] * LOG2_E), 0.0)
        dv += tl.dot(p_t.to(do.dtype), do)                                    # Pᵀ dO
        dp_t = tl.dot(v, tl.trans(do))                                        # (dO Vᵀ)ᵀ
        ds_t = p_t * (dp_t - delta[None, :])                                  # [BLOCK_N, BLOCK_M]
        dk += tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t))                       # dSᵀ Q

    out_offsets = batch_head.to(tl.int64) * n_k * HEAD_DIM + keys[:, None] * HEAD_DIM + dims[None, :]
    tl.store(dK + out_offsets, (dk * scale).to(dK.dtype.element_ty), mask=keys[:, None] < n_k)
    tl.store(dV + out_offsets, dv.to(dV.dtype.element_ty), mask=keys[:, None] < n_k)


@triton.jit
def attention_backward_dq_kernel(
    Q, K, V, dOut, LSE, Delta, dQ,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    num_heads, n_q, n_k, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Grid ``(cdiv(N_q, BLOCK_M), B·H)``: dQ of one tile of queries per program.

    ``dQ = scale · dS K`` with ``dS = P ∘ (dO Vᵀ - Δ)``. A separate kernel (rather than
    atomic adds from the dK/dV kernel) keeps the result deterministic.
    ``dQ`` is contiguous ``[B, H, N_q, d]``.
    """
    tile = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // num_heads).to(tl.int64)
    head = (batch_head % num_heads).to(tl.int64)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)                             # [BLOCK_M]
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    k_base = K + batch * stride_kb + head * stride_kh
    v_base = V + batch * stride_vb + head * stride_vh
    stats_base = batch_head.to(tl.int64) * n_q

    q = tl.load(Q + batch * stride_qb + head * stride_qh + rows[:, None] * stride_qn + dims[None, :] * stride_qd,
                mask=rows[:, None] < n_q, other=0.0)                          # [BLOCK_M, d]
    do = tl.load(dOut + batch * stride_dob + head * stride_doh + rows[:, None] * stride_don
                 + dims[None, :] * stride_dod, mask=rows[:, None] < n_q, other=0.0)
    lse = tl.load(LSE + stats_base + rows, mask=rows < n_q, other=0.0)
    delta = tl.load(Delta + stats_base + rows, mask=rows < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    scale_log2 = scale * LOG2_E

    if CAUSAL:
        key_end = tl.minimum(n_k, (tile + 1) * BLOCK_M)
    else:
        key_end = n_k
    for key_start in range(0, key_end, BLOCK_N):
        keys = key_start + cols
        k = tl.load(k_base + keys[:, None] * stride_kn + dims[None, :] * stride_kd,
                    mask=keys[:, None] < n_k, other=0.0)                      # [BLOCK_N, d]
        v_t = tl.load(v_base + keys[None, :] * stride_vn + dims[:, None] * stride_vd,
                      mask=keys[None, :] < n_k, other=0.0)                    # [d, BLOCK_N]
        scores = tl.dot(q, tl.trans(k)) * scale_log2                          # [BLOCK_M, BLOCK_N]
        visible = (keys[None, :] < n_k) & (rows[:, None] < n_q)
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])
        p = tl.where(visible, tl.exp2(scores - lse[:, None] * LOG2_E), 0.0)
        dp = tl.dot(do, v_t)                                                  # dO Vᵀ
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)

    out_offsets = batch_head.to(tl.int64) * n_q * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :]
    tl.store(dQ + out_offsets, (dq * scale).to(dQ.dtype.element_ty), mask=rows[:, None] < n_q)
