"""Flash-decoding: the forward for a few queries (``N_q <= 16``) against a long cache.

One query per head gives the ordinary forward only ``B · H`` programs, too few to keep a GPU busy
while each reads the whole cache. Flash-decoding splits the keys across programs and merges the
partial results by the log-sum-exp rule (the two kernels of :mod:`attn_course.flash.kernels`).
:func:`~attn_course.flash.triton_attention.flash_attention` takes this path by itself for
``N_q <= 16``; :func:`~attn_course.flash.triton_attention.decode_attention` asks for it.
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.flash.configs import (
    DECODE_BLOCK_M,
    DECODE_MAX_QUERIES,
    DECODE_MAX_SPLITS,
    DECODE_SPLIT_ALIGN,
    KernelConfig,
)
from attn_course.flash.launch import (
    ENABLE_FP_FUSION,
    cdiv,
    check_config,
    check_kernel_inputs,
    kernel_function,
    launch,
    output_buffers,
)

__all__ = ["attention_decode_forward", "decode_merge_width", "decode_num_splits"]


def decode_num_splits(batch: int, kv_heads: int, n_k: int, row_chunks: int = 1, *,
                      multiprocessors: int = 1) -> int:
    """How many splits of the keys flash-decoding uses: enough programs for two per multiprocessor.

    Without splitting, decoding runs ``B · H_kv · row_chunks`` programs, each over all ``N_k``
    keys. Splitting by ``S`` multiplies the programs by ``S`` and divides each one's keys. ``S`` is
    the smallest number giving at least two programs per multiprocessor (so that each has one
    waiting while another loads), at most one split per 128 keys and at most
    :data:`DECODE_MAX_SPLITS`. Triton's interpreter runs programs one after another: there
    ``multiprocessors=1``, and splitting would only add a merge.

    Args:
        batch, kv_heads, n_k: ``B``, ``H_kv``, ``N_k``.
        row_chunks: programs per key/value head and split (``cdiv(G · N_q, BLOCK_M)``).
        multiprocessors: the GPU's streaming multiprocessors (132 on an H100 SXM or H200).

    Returns:
        ``S``, from 1 to ``min(DECODE_MAX_SPLITS, max(N_k // 128, 1))``.

    Raises:
        TypeError, ValueError: an argument that is not an integer ≥ 1.

    Example:
        >>> decode_num_splits(1, 8, 32768, multiprocessors=132)   # 8 programs → 33 splits each
        33
    """
    where = "decode_num_splits"
    batch, kv_heads, n_k, row_chunks, multiprocessors = (
        _validate.integer(where, name, value, minimum=1)
        for name, value in (("batch", batch), ("kv_heads", kv_heads), ("n_k", n_k), ("row_chunks", row_chunks),
                            ("multiprocessors", multiprocessors)))
    most = min(DECODE_MAX_SPLITS, max(n_k // DECODE_SPLIT_ALIGN, 1))
    wanted = cdiv(2 * multiprocessors, batch * kv_heads * row_chunks)
    return max(1, min(most, wanted))


def attention_decode_forward(q, k, v, *, causal: bool = False, scale: float | None = None,
                             num_splits: int | None = None, config: KernelConfig | None = None, out=None, lse=None):
    """Flash-decoding: the forward for a few queries against many keys, keys split across programs.

    Step 1 (:func:`~attn_course.flash.kernels.attention_decode_kernel`) runs
    ``S · B · H_kv · cdiv(G · N_q, BLOCK_M)`` programs; each attends the ``G · N_q`` (query head,
    query) rows of one key/value head to one split of the keys and writes a partial output and
    log-sum-exp. Step 2 (:func:`~attn_course.flash.kernels.attention_decode_merge_kernel`)
    merges the ``S`` partials of every row by the log-sum-exp rule.

    Args:
        q: ``[B, H, N_q, d]`` with ``N_q <= 16``; k, v: ``[B, H_kv, N_k, d]``, ``H % H_kv == 0``.
        causal, scale: as in :func:`flash_attention` (causal is bottom-right aligned).
        num_splits: ``S``, from 1 to ``min(128, max(N_k // 128, 1))``; default
            :func:`decode_num_splits` for this GPU (1 in the interpreter).
        config: one of :func:`kernel_configs` ``("decode", d)``; default: autotuned on a GPU.
        out, lse: optional output buffers, as in :func:`attention_forward`.

    Returns:
        ``(out, lse)`` as :func:`attention_forward` returns them.

    Raises:
        TypeError, ValueError: as :func:`flash_attention`, ``N_q > 16``, or a bad ``num_splits``.
    """
    where = "attention_decode_forward"
    scale = check_kernel_inputs(where, q, k, v, causal, scale)
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    if n_q > DECODE_MAX_QUERIES:
        raise ValueError(f"{where}: flash-decoding takes at most {DECODE_MAX_QUERIES} queries (N_q), got "
                         f"q {_validate.shape_str(q)}; use attention_forward")
    config = check_config(where, "config", config, "decode", head_dim)
    groups = heads // kv_heads
    block_m = DECODE_BLOCK_M[0] if groups * n_q <= DECODE_BLOCK_M[0] else DECODE_BLOCK_M[1]
    row_chunks = cdiv(groups * n_q, block_m)
    most = min(DECODE_MAX_SPLITS, max(n_k // DECODE_SPLIT_ALIGN, 1))
    if num_splits is None:
        multiprocessors = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
        num_splits = decode_num_splits(batch, kv_heads, n_k, row_chunks, multiprocessors=multiprocessors)
    else:
        num_splits = _validate.integer(where, "num_splits", num_splits, minimum=1)
        if num_splits > most:
            raise ValueError(f"{where}: num_splits must be at most min({DECODE_MAX_SPLITS}, max(N_k // "
                             f"{DECODE_SPLIT_ALIGN}, 1)) = {most} for N_k={n_k} (splits are whole blocks of "
                             f"{DECODE_SPLIT_ALIGN} keys), got {num_splits}")
    out, lse = output_buffers(where, q, out, lse)
    partial_out = torch.empty((batch * heads, num_splits, n_q, head_dim), dtype=torch.float32, device=q.device)
    partial_lse = torch.empty((batch * heads, num_splits, n_q), dtype=torch.float32, device=q.device)
    launch("decode", num_splits, batch * kv_heads,
           q, k, v, partial_out, partial_lse, *q.stride(), *k.stride(), *v.stride(),
           heads, groups, n_q, n_k, scale, num_splits, head_dim=head_dim, causal=causal, config=config,
           extra_grid=row_chunks, BLOCK_M=block_m)
    kernel_function("attention_decode_merge_kernel")[(batch * heads * n_q,)](
        partial_out, partial_lse, out, lse, *out.stride(), heads, n_q, num_splits,
        HEAD_DIM=head_dim, SPLITS=decode_merge_width(num_splits), num_warps=4, enable_fp_fusion=ENABLE_FP_FUSION)
    return out, lse


def decode_merge_width(num_splits: int) -> int:
    """The merge kernel's ``SPLITS``: ``num_splits`` rounded up to a power of two, at least 2."""
    return max(2, 1 << (num_splits - 1).bit_length())
