"""Chapter 07's exercise 3 (find the bug): a classmate's one-program Triton kernel for decoding with a
sliding window, bug and all.

Its ``N_Q`` new queries come after ``n_k - N_Q`` cached keys (query ``i`` at position
``p = i + n_k - N_Q``), and each sees its own key and the 23 before it. It has the signature of the
frame of chapter 07's exercises and is launched by
:func:`~attn_course.flash.small_kernel.launch_small_attention`; its ``tau`` is not used. The chapter
lists it (``show_source``) and runs it, and the exercise is to find why some of its rows come out NaN and
to write the corrected kernel in the notebook: kept here as the classmate wrote it, it answers nothing.
Importing this module imports Triton: choose the mode first
(:func:`~attn_course.flash.triton_mode.use_interpreter_without_gpu`).
"""

import triton
import triton.language as tl

__all__ = ["buggy_window_kernel"]


@triton.jit
def buggy_window_kernel(Q, K, V, Out, M, n_k, scale, tau, N_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    rows = tl.arange(0, N_Q)                                       # the N_Q new queries (tau is not used)
    dims = tl.arange(0, HEAD_DIM)
    position = rows + (n_k - N_Q)                                  # after n_k - N_Q cached keys
    window = 24                                                    # its own key and the 23 before it
    q = tl.load(Q + rows[:, None] * HEAD_DIM + dims[None, :])
    m_i = tl.full([N_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([N_Q], tl.float32)
    acc = tl.zeros([N_Q, HEAD_DIM], tl.float32)
    for start in range(0, n_k, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        inside = cols < n_k
        k = tl.load(K + cols[:, None] * HEAD_DIM + dims[None, :], mask=inside[:, None], other=0.0)
        v = tl.load(V + cols[:, None] * HEAD_DIM + dims[None, :], mask=inside[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * (scale * 1.4426950408889634)
        visible = inside[None, :] & (cols[None, :] <= position[:, None]) & (cols[None, :] > position[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    tl.store(Out + rows[:, None] * HEAD_DIM + dims[None, :], acc / l_i[:, None])
    tl.store(M + rows, m_i)
