"""What ``flash_attention`` and ``decode_attention`` run where Triton is not installed.

Triton ships wheels for Linux only, so on macOS and Windows the kernels cannot run, not even in
Triton's interpreter. There the two functions run the kernels' algorithm in PyTorch instead:
chapter 06's :func:`~attn_course.flash.tiled_attention`, the same online softmax over the same
tiles (its backward recomputing each tile of weights from the log-sum-exp, as the backward
kernels do), and for flash-decoding the same split of the keys, each split's partial output merged
by its log-sum-exp (:func:`~attn_course.flash.tiled.merge_attention_outputs`). The results are the
algorithm's, not the compiled kernel's: no registers, no shared memory, no timing worth reading.
The first call says so once, on stderr.
"""

from __future__ import annotations

import torch

from attn_course.flash.schedule import decode_splits
from attn_course.flash.tiled import merge_attention_outputs, tiled_attention

__all__ = ["attention_without_triton"]


def attention_without_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float,
                             num_splits: int | None = None) -> torch.Tensor:
    """The kernels' algorithm in PyTorch, on inputs the kernels' launcher has checked.

    Args:
        q: ``[B, H, N_q, d]``; k, v: ``[B, H_kv, N_k, d]`` with ``H % H_kv == 0``.
        causal: bottom-right aligned (``N_q <= N_k``), as the kernels are.
        scale: the softmax scale.
        num_splits: flash-decoding's ``S``: the keys in ``S`` splits of whole blocks of 128
            (:func:`~attn_course.flash.schedule.decode_splits`), merged; None for one pass.

    Returns:
        ``[B, H, N_q, d]`` in ``q``'s dtype, differentiable.
    """
    group = q.shape[1] // k.shape[1]
    # Grouped-query heads: each query head's keys and values, copied (the kernels read them in place).
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    # The kernels keep their running statistics and accumulator in float32 whatever the inputs' dtype.
    q32, k32, v32 = (t.to(torch.float32) for t in (q, k, v))
    if num_splits is None:
        return tiled_attention(q32, k32, v32, causal=causal, scale=scale).to(q.dtype)
    n_k = k.shape[2]
    out = lse = None
    for start, end in decode_splits(n_k, num_splits):
        # Only the last split holds keys a causal query may not see: it has at least 128 keys and
        # flash-decoding at most 16 queries, so every earlier key precedes every query's position.
        part = tiled_attention(q32, k32[:, :, start:end], v32[:, :, start:end], causal=causal and end == n_k,
                               scale=scale, return_lse=True)
        out, lse = part if out is None else merge_attention_outputs(out, lse, *part)
    return out.to(q.dtype)
