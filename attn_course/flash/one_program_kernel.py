"""The smallest FlashAttention kernel in Triton: one program, one head, all its queries, the keys in tiles.

Chapter 07 reads it before the production kernel (:mod:`attn_course.flash.kernels`), which adds
many programs (a tile of queries and a (batch, head) each), strides, causal stages, grouped-query
heads and the log-sum-exp. It has the signature of the frame of chapter 07's exercises and is
launched by :func:`~attn_course.flash.small_kernel.launch_small_attention`; its ``tau`` is exercise
2's threshold, which this kernel does not use. Importing this module imports Triton: choose the
mode first (:func:`~attn_course.flash.triton_mode.use_interpreter_without_gpu`).
"""

import triton
import triton.language as tl

__all__ = ["one_program_attention_kernel"]


@triton.jit
def one_program_attention_kernel(Q, K, V, Out, M, n_k, scale, tau, N_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
                                 BLOCK_N: tl.constexpr):
    rows = tl.arange(0, N_Q)                                       # every query of the head, in one program
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + rows[:, None] * HEAD_DIM + dims[None, :])      # [N_Q, d], on chip for the whole loop
    m_i = tl.full([N_Q], float("-inf"), tl.float32)                # running maximum, base 2
    l_i = tl.zeros([N_Q], tl.float32)                              # running sum of exponentials
    acc = tl.zeros([N_Q, HEAD_DIM], tl.float32)                    # unnormalised output
    for start in range(0, n_k, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        inside = cols < n_k                                        # the last tile may be partial
        k = tl.load(K + cols[:, None] * HEAD_DIM + dims[None, :], mask=inside[:, None], other=0.0)
        v = tl.load(V + cols[:, None] * HEAD_DIM + dims[None, :], mask=inside[:, None], other=0.0)
        # Scores in base 2, so that exp(x) = exp2(x · log2 e): the GPU's exponential is exp2.
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * (scale * 1.4426950408889634)
        s = tl.where(inside[None, :], s, float("-inf"))            # keys past n_k are not keys
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)                               # rescales what was summed; 0 on the first tile
        p = tl.exp2(s - m_new[:, None])                            # [N_Q, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    tl.store(Out + rows[:, None] * HEAD_DIM + dims[None, :], acc / l_i[:, None])
    tl.store(M + rows, m_i)
