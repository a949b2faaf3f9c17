"""FlashAttention in Triton: the two backward kernels, dK/dV and dQ.

Their conventions are the forward's (:mod:`attn_course.flash.kernels`): strides for every
tensor, scores in base 2, the log-sum-exp ``LSE`` (base 2 here: the launcher converts it once)
so that ``P = exp2(s₂ - LSE₂)`` is recomputed tile by tile without being stored, grouped-query
heads read in place, bottom-right causal masks, and masks only on the tiles that need them.
The gradient of the softmax needs one more number per query row, ``Δ = rowsum(dO ∘ O)``,
which a third, small kernel (:func:`attention_backward_delta_kernel`) computes before the two
run, together with the log-sum-exp in base 2.

The launchers load this file through :func:`~attn_course.flash.triton_mode.define_kernels`.
"""

import triton
import triton.language as tl

from attn_course.flash.kernels import LOG2_E, batch_and_kv_head, key_stages


@triton.jit
def dkdv_query_tiles(dk, dv, k, v, q_group, do_group, LSE, Delta, dQ, stats_group,
                      stride_qh, stride_qn, stride_qd, stride_doh, stride_don, stride_dod,
                      keys, dims, n_q, num_kv_groups, causal_offset, scale, scale_log2, row_begin, row_end,
                      BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                      ATOMIC_DQ: tl.constexpr):
    """dK, dV contributions of query tiles ``row_begin .. row_end`` of every query head of the group.

    One loop runs over (query head, query tile) pairs, head-major, rather than a loop over the
    group's heads around a loop over tiles: with a run-time group count (``G > 1``) the nested
    loops took the sm_90 build to 255 registers and spilled up to 496 bytes per thread at
    d = 64, where the single loop needs 231 registers and spills nothing (``python -m
    gpu_tools.aot --spills``). The ``q_group``/``do_group`` pointers and ``stats_group``
    offset are those of the group's first query head; head ``g`` of the group is ``g`` head strides on.

    Keys past ``N_k`` need no mask here: they are zero rows of ``k``/``v`` whose own (unstored)
    rows of dK/dV are the only ones they touch (and add zero to dQ). ``MASKED`` tiles check query
    bounds and causality. ``ATOMIC_DQ``: also add this tile's ``scale · dS K`` into the float32
    ``dQ`` with atomic adds (a fifth matrix product, in place of the dQ kernel's three).
    """
    tiles = tl.cdiv(tl.maximum(row_end - row_begin, 0), BLOCK_M)               # per query head
    for step in range(0, num_kv_groups * tiles):
        member = step // tiles
        first_row = row_begin + (step - member * tiles) * BLOCK_M
        rows = first_row + tl.arange(0, BLOCK_M)                              # [BLOCK_M]
        member = member.to(tl.int64)
        wide_rows = rows.to(tl.int64)             # int64, as every offset: row × stride can pass 2**31
        q_pointers = q_group + member * stride_qh + wide_rows[None, :] * stride_qn + dims[:, None] * stride_qd
        do_pointers = do_group + member * stride_doh + wide_rows[:, None] * stride_don + dims[None, :] * stride_dod
        stats = stats_group + member * n_q + rows                                 # [BLOCK_M]
        if MASKED:
            q_t = tl.load(q_pointers, mask=rows[None, :] < n_q, other=0.0)    # [d, BLOCK_M]
            do = tl.load(do_pointers, mask=rows[:, None] < n_q, other=0.0)    # [BLOCK_M, d]
            lse = tl.load(LSE + stats, mask=rows < n_q, other=0.0)            # base 2
            delta = tl.load(Delta + stats, mask=rows < n_q, other=0.0)
        else:
            q_t = tl.load(q_pointers)
            do = tl.load(do_pointers)
            lse = tl.load(LSE + stats)
            delta = tl.load(Delta + stats)
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
        if ATOMIC_DQ:
            # Other key tiles add into the same rows at the same time, in no fixed order: float32
            # sums in a varying order, so dQ may differ in its last bits from run to run. Relaxed:
            # nothing is read back before the kernel ends, so the adds need no ordering with other
            # memory operations (FlashAttention's reductions are relaxed too; Triton's default,
            # "acq_rel", fences each one).
            dq = tl.dot(tl.trans(ds_t.to(k.dtype)), k) * scale                 # [BLOCK_M, d]
            tl.atomic_add(dQ + stats[:, None] * dims.shape[0] + dims[None, :], dq, mask=rows[:, None] < n_q,
                          sem="relaxed")
    return dk, dv


@triton.jit
def attention_backward_dkdv_kernel(
    Q, K, V, dOut, LSE, Delta, dK, dV, dQ,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    num_heads, num_kv_groups, n_q, n_k, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
):
    """Grid ``(cdiv(N_k, BLOCK_N) · B·H_kv,)``: dK and dV of one tile of keys per program (key tile fastest).

    With ``P = exp(s - LSE)`` recomputed tile by tile and ``Δ = rowsum(dO ∘ O)``:
    ``dV = Pᵀ dO``, ``dP = dO Vᵀ``, ``dS = P ∘ (dP - Δ)``, ``dK = scale · dSᵀ Q``.
    Everything is held transposed (keys along the rows) so that the sums over queries
    are matrix products. With grouped-query attention the program loops over the
    ``num_kv_groups`` query heads that share its key/value head and sums over them in
    registers. ``LSE`` is in base 2 here. ``dK``/``dV`` are contiguous ``[B, H_kv, N_k, d]``.

    ``ATOMIC_DQ`` (FlashAttention-2's way): the program also adds its share of ``dQ = scale · dS K``
    into ``dQ``, contiguous float32 ``[B, H, N_q, d]`` and zero beforehand, by atomic adds; the dQ
    kernel is then not run. Five matrix products per tile instead of seven (4 here, 3 there), but
    the sums' order, and so the last bits of dQ, vary between runs. Otherwise ``dQ`` is unused.
    """
    num_tiles = tl.cdiv(n_k, BLOCK_N)
    tile = tl.program_id(0) % num_tiles
    batch_kv_head = tl.program_id(0) // num_tiles
    batch, kv_head = batch_and_kv_head(batch_kv_head, num_heads, num_kv_groups)
    keys = tile * BLOCK_N + tl.arange(0, BLOCK_N)                             # [BLOCK_N]
    dims = tl.arange(0, HEAD_DIM).to(tl.int64)        # int64, as every offset: they can pass 2**31
    wide_keys = keys.to(tl.int64)

    # My keys and values, loaded once; they stay on chip for all the group's query tiles.
    k = tl.load(K + batch * stride_kb + kv_head * stride_kh + wide_keys[:, None] * stride_kn
                + dims[None, :] * stride_kd, mask=keys[:, None] < n_k, other=0.0)          # [BLOCK_N, d]
    scale_log2 = scale * LOG2_E
    v = tl.load(V + batch * stride_vb + kv_head * stride_vh + wide_keys[:, None] * stride_vn
                + dims[None, :] * stride_vd, mask=keys[:, None] < n_k, other=0.0)          # [BLOCK_N, d]
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
    # The group's first query head; dkdv_query_tiles steps through the others.
    first_head = kv_head * num_kv_groups
    q_group = Q + batch * stride_qb + first_head * stride_qh
    do_group = dOut + batch * stride_dob + first_head * stride_doh
    stats_group = (batch * num_heads + first_head) * n_q
    dk, dv = dkdv_query_tiles(dk, dv, k, v, q_group, do_group, LSE, Delta, dQ, stats_group,
                               stride_qh, stride_qn, stride_qd, stride_doh, stride_don, stride_dod, keys, dims,
                               n_q, num_kv_groups, causal_offset, scale, scale_log2,
                               band_begin, band_end, BLOCK_M=BLOCK_M, MASKED=True, CAUSAL=CAUSAL,
                               ATOMIC_DQ=ATOMIC_DQ)
    dk, dv = dkdv_query_tiles(dk, dv, k, v, q_group, do_group, LSE, Delta, dQ, stats_group,
                               stride_qh, stride_qn, stride_qd, stride_doh, stride_don, stride_dod, keys, dims,
                               n_q, num_kv_groups, causal_offset, scale, scale_log2,
                               band_end, full_tiles_end, BLOCK_M=BLOCK_M, MASKED=False, CAUSAL=CAUSAL,
                               ATOMIC_DQ=ATOMIC_DQ)
    dk, dv = dkdv_query_tiles(dk, dv, k, v, q_group, do_group, LSE, Delta, dQ, stats_group,
                               stride_qh, stride_qn, stride_qd, stride_doh, stride_don, stride_dod, keys, dims,
                               n_q, num_kv_groups, causal_offset, scale, scale_log2,
                               tl.maximum(full_tiles_end, band_end), n_q,
                               BLOCK_M=BLOCK_M, MASKED=True, CAUSAL=CAUSAL,
                               ATOMIC_DQ=ATOMIC_DQ)

    out_offsets = (batch_kv_head.to(tl.int64) * n_k + wide_keys[:, None]) * HEAD_DIM + dims[None, :]
    tl.store(dK + out_offsets, (dk * scale).to(dK.dtype.element_ty), mask=keys[:, None] < n_k)
    tl.store(dV + out_offsets, dv.to(dV.dtype.element_ty), mask=keys[:, None] < n_k)


@triton.jit
def dq_key_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                  rows, dims, n_k, causal_offset, scale_log2, key_begin, key_end,
                  BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """dQ contributions of key tiles ``key_begin .. key_end``; ``MASKED`` tiles check bounds and causality."""
    for key_start in range(key_begin, key_end, BLOCK_N):
        keys = key_start + tl.arange(0, BLOCK_N)
        wide_keys = keys.to(tl.int64)             # int64, as every offset: key × stride can pass 2**31
        k_pointers = k_base + wide_keys[:, None] * stride_kn + dims[None, :] * stride_kd
        v_pointers = v_base + wide_keys[None, :] * stride_vn + dims[:, None] * stride_vd
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
    """Grid ``(cdiv(N_q, BLOCK_M) · B·H,)``: dQ of one tile of queries per program (query tile fastest).

    ``dQ = scale · dS K`` with ``dS = P ∘ (dO Vᵀ - Δ)``. A separate kernel (rather than
    atomic adds from the dK/dV kernel) keeps the result deterministic. ``LSE`` is in base 2.
    ``dQ`` is contiguous ``[B, H, N_q, d]``.
    """
    num_tiles = tl.cdiv(n_q, BLOCK_M)
    tile = tl.program_id(0) % num_tiles
    batch_head = tl.program_id(0) // num_tiles
    batch = (batch_head // num_heads).to(tl.int64)
    head = (batch_head % num_heads).to(tl.int64)
    kv_head = head // num_kv_groups
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)                             # [BLOCK_M]
    dims = tl.arange(0, HEAD_DIM).to(tl.int64)        # int64, as every offset: they can pass 2**31
    wide_rows = rows.to(tl.int64)
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    stats_base = batch_head.to(tl.int64) * n_q

    q = tl.load(Q + batch * stride_qb + head * stride_qh + wide_rows[:, None] * stride_qn
                + dims[None, :] * stride_qd, mask=rows[:, None] < n_q, other=0.0)          # [BLOCK_M, d]
    scale_log2 = scale * LOG2_E
    do = tl.load(dOut + batch * stride_dob + head * stride_doh + wide_rows[:, None] * stride_don
                 + dims[None, :] * stride_dod, mask=rows[:, None] < n_q, other=0.0)
    lse = tl.load(LSE + stats_base + rows, mask=rows < n_q, other=0.0)
    delta = tl.load(Delta + stats_base + rows, mask=rows < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # The same two stages as the forward: full tiles below the diagonal unmasked, then the
    # diagonal band and the partial last tile masked. Rows past N_q need no mask in the loop:
    # their dO and Δ are zero, so is their dS, and their rows of dQ are not stored.
    causal_offset, unmasked_end, key_end = key_stages(tile * BLOCK_M, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    dq = dq_key_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       rows, dims, n_k, causal_offset, scale_log2, 0, unmasked_end,
                       BLOCK_N=BLOCK_N, MASKED=False, CAUSAL=CAUSAL)
    dq = dq_key_tiles(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       rows, dims, n_k, causal_offset, scale_log2, unmasked_end, key_end,
                       BLOCK_N=BLOCK_N, MASKED=True, CAUSAL=CAUSAL)

    out_offsets = (stats_base + wide_rows[:, None]) * HEAD_DIM + dims[None, :]
    tl.store(dQ + out_offsets, (dq * scale).to(dQ.dtype.element_ty), mask=rows[:, None] < n_q)


@triton.jit
def attention_backward_delta_kernel(
    Out, dOut, LSE, Delta, LSE2,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    num_heads, n_q,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Grid ``(cdiv(N_q, BLOCK_M) · B·H,)``: what both backward kernels read per query row.

    ``Δ_i = Σ_d dO_id · O_id`` in float32 (the softmax's gradient needs it: ``Σ_j P_ij dP_ij = Δ_i``),
    and the log-sum-exp in base 2 (``LSE₂ = log2(e) · LSE``, so that the kernels' ``exp2(s₂ - LSE₂)``
    needs no ``log2 e`` per tile). One pass over ``O`` and ``dO`` in their own dtype and strides,
    where PyTorch would write float32 copies of both and their product to memory first.
    ``LSE``, ``Delta``, ``LSE2`` are contiguous float32 ``[B, H, N_q]``.
    """
    num_tiles = tl.cdiv(n_q, BLOCK_M)
    tile = tl.program_id(0) % num_tiles
    batch_head = tl.program_id(0) // num_tiles
    batch = (batch_head // num_heads).to(tl.int64)
    head = (batch_head % num_heads).to(tl.int64)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)                             # [BLOCK_M]
    dims = tl.arange(0, HEAD_DIM).to(tl.int64)        # int64, as every offset (see above)
    wide_rows = rows.to(tl.int64)
    inside = rows < n_q
    o = tl.load(Out + batch * stride_ob + head * stride_oh + wide_rows[:, None] * stride_on
                + dims[None, :] * stride_od, mask=inside[:, None], other=0.0)            # [BLOCK_M, d]
    do = tl.load(dOut + batch * stride_dob + head * stride_doh + wide_rows[:, None] * stride_don
                 + dims[None, :] * stride_dod, mask=inside[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)              # [BLOCK_M]
    stats = batch_head.to(tl.int64) * n_q + rows
    tl.store(Delta + stats, delta, mask=inside)
    tl.store(LSE2 + stats, tl.load(LSE + stats, mask=inside, other=0.0) * LOG2_E, mask=inside)
