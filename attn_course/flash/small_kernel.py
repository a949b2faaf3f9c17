"""Launch a small, one-program attention kernel: chapter 07's first kernel and the frame of its exercises.

Such a kernel computes attention for one head: all ``N_Q`` queries in one program, the keys in
tiles of ``BLOCK_N``, with the online softmax in base 2
(:mod:`~attn_course.flash.one_program_kernel`); exercise 2's adds FlashAttention-4's
*conditional rescaling*, which raises the running maxima only when a tile's maximum exceeds one of
them by more than ``tau`` (base 2), and exercise 3's a sliding window. Its signature is fixed::

    @triton.jit
    def kernel(Q, K, V, Out, M, n_k, scale, tau, N_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_N: tl.constexpr): ...

with ``Q [N_Q, HEAD_DIM]``, ``K``, ``V [n_k, HEAD_DIM]`` and ``Out [N_Q, HEAD_DIM]`` contiguous
float32, and ``M [N_Q]`` where the kernel stores the maximum each row ended with (base 2).
:func:`launch_small_attention` checks the inputs, allocates the outputs and launches one
program, on the GPU or, without one, in Triton's interpreter (a kernel defined before that mode
was chosen is re-defined in it: :func:`~attn_course.flash.triton_mode.runnable`).

On a GPU a float32 ``tl.dot`` runs in TF32 by default (10 bits of mantissa, errors near 1e-3);
the exercise's kernel passes ``input_precision="ieee"`` to both of its products so that its
output matches float32 attention to about 1e-6, on the GPU as in the interpreter.
"""

from __future__ import annotations

import math

import torch

from attn_course import _validate
from attn_course.flash.triton_mode import runnable

__all__ = ["launch_small_attention"]


def launch_small_attention(kernel: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                           block_n: int = 16, tau: float = 8.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a one-program attention kernel on ``q``, ``k``, ``v``; return its output and final maxima.

    Args:
        kernel: a ``@triton.jit`` function with the signature of this module's docstring.
        q: ``[N_Q, d]``, N_Q and d powers of two ``>= 16`` (what ``tl.arange`` and ``tl.dot`` need).
        k: ``[N_k, d]``, any ``N_k >= 1``.
        v: ``[N_k, d]``.
        block_n: keys per tile, a power of two ``>= 16``.
        tau: the rescaling threshold, in base-2 units of the scores (``>= 0``; 8 means a factor 256).

    Returns:
        ``(out, row_max)``: ``out [N_Q, d]`` and ``row_max [N_Q]`` (base 2), float32, on ``q``'s device.

    Raises:
        TypeError: ``kernel`` is not a Triton kernel, or inputs that are not floating tensors.
        ValueError: shapes that do not fit the kernel, a bad ``block_n`` or a negative ``tau``.

    Example:
        >>> q, k, v = torch.randn(16, 16), torch.randn(40, 16), torch.randn(40, 16)
        >>> launch_small_attention(print, q, k, v)
        Traceback (most recent call last):
        ...
        TypeError: launch_small_attention: kernel must be a @triton.jit function, got builtin_function_or_method
    """
    where = "launch_small_attention"
    if not (hasattr(kernel, "__getitem__") and hasattr(kernel, "fn")):
        raise TypeError(f"{where}: kernel must be a @triton.jit function, got {type(kernel).__name__}")
    q = _validate.floating_tensor(where, "q", q, min_dim=2)
    k = _validate.floating_tensor(where, "k", k, min_dim=2)
    v = _validate.floating_tensor(where, "v", v, min_dim=2)
    block_n = _validate.integer(where, "block_n", block_n, minimum=16)
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau >= 0:
        raise ValueError(f"{where}: tau must be a number >= 0, got {tau!r}")
    if q.dim() != 2 or k.dim() != 2 or v.dim() != 2:
        raise ValueError(f"{where}: q, k, v must be 2-D [N, d], got {_validate.shape_str(q)}, "
                         f"{_validate.shape_str(k)}, {_validate.shape_str(v)}")
    n_q, d = q.shape
    for name, size in (("N_Q", n_q), ("d", d), ("block_n", block_n)):
        if size < 16 or size & (size - 1):
            raise ValueError(f"{where}: {name} must be a power of two >= 16, got {size}")
    if k.shape[1] != d or v.shape != k.shape or k.shape[0] < 1:
        raise ValueError(f"{where}: k and v must both be [N_k, {d}] with N_k >= 1, got "
                         f"{_validate.shape_str(k)} and {_validate.shape_str(v)}")
    q, k, v = (t.to(torch.float32).contiguous() for t in (q, k, v))
    out = torch.empty_like(q)                                               # [N_Q, d]
    row_max = torch.empty(n_q, dtype=torch.float32, device=q.device)        # [N_Q], base 2
    # A stand-in for a kernel that runs in another process (the grader's proxy of a student's
    # kernel, whose ``fn`` is None) is launched as it is: that process has chosen its own mode.
    launchable = kernel if kernel.fn is None else runnable(kernel)
    launchable[(1,)](q, k, v, out, row_max, k.shape[0], 1.0 / math.sqrt(d), float(tau),
                     N_Q=n_q, HEAD_DIM=d, BLOCK_N=block_n)
    return out, row_max
