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
    check_output_buffers,
    kernel_function,
    launch,
    output_buffers,
)

__all__ = ["attention_decode_forward", "check_decode_inputs", "decode_layout", "decode_merge_width",
           "decode_num_splits", "launch_decode"]


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
    batch, kv_heads, n_k, row_chunks, multiprocessors = _validate.integers(
        "decode_num_splits", minimum=1, batch=batch, kv_heads=kv_heads, n_k=n_k, row_chunks=row_chunks,
        multiprocessors=multiprocessors)
    wanted = cdiv(2 * multiprocessors, batch * kv_heads * row_chunks)
    return max(1, min(_most_splits(n_k), wanted))


def decode_layout(batch: int, heads: int, kv_heads: int, n_q: int, n_k: int, *, multiprocessors: int = 1,
                  num_splits: int | None = None) -> tuple[int, int, int]:
    """How flash-decoding lays its programs out: ``(BLOCK_M, row_chunks, num_splits)``.

    ``BLOCK_M`` rows (query head, query) per program, the smaller of :data:`DECODE_BLOCK_M` when a
    group's ``G · N_q`` rows fit it; ``row_chunks = cdiv(G · N_q, BLOCK_M)`` programs per key/value
    head and split; ``num_splits`` as given, else :func:`decode_num_splits` for ``multiprocessors``.
    Inputs are those of a checked launch (:func:`check_decode_inputs`).

    Example:
        >>> decode_layout(1, 32, 8, 1, 32768, multiprocessors=132)   # G = 4 rows: one 16-row tile
        (16, 1, 33)
    """
    groups = heads // kv_heads
    block_m = DECODE_BLOCK_M[0] if groups * n_q <= DECODE_BLOCK_M[0] else DECODE_BLOCK_M[1]
    row_chunks = cdiv(groups * n_q, block_m)
    if num_splits is None:
        num_splits = decode_num_splits(batch, kv_heads, n_k, row_chunks, multiprocessors=multiprocessors)
    return block_m, row_chunks, num_splits


def _most_splits(n_k: int) -> int:
    return min(DECODE_MAX_SPLITS, max(n_k // DECODE_SPLIT_ALIGN, 1))


def check_decode_inputs(where: str, q, k, v, causal, scale, num_splits) -> tuple[float, int | None]:
    """The checks of a flash-decoding entry point: the kernels' (:func:`~attn_course.flash.launch.check_kernel_inputs`),
    ``N_q <= 16``, and ``num_splits`` None or from 1 to ``min(128, max(N_k // 128, 1))``.

    Returns:
        ``(scale, num_splits)``.

    Raises:
        TypeError, ValueError: as :func:`~attn_course.flash.launch.check_kernel_inputs`, ``N_q > 16``,
            or a bad ``num_splits``.
    """
    scale = check_kernel_inputs(where, q, k, v, causal, scale)
    if q.shape[2] > DECODE_MAX_QUERIES:
        raise ValueError(f"{where}: flash-decoding takes at most {DECODE_MAX_QUERIES} queries (N_q), got "
                         f"q {_validate.shape_str(q)}; use flash_attention")
    if num_splits is not None:
        num_splits = _validate.integer(where, "num_splits", num_splits, minimum=1)
        n_k, most = k.shape[2], _most_splits(k.shape[2])
        if num_splits > most:
            raise ValueError(f"{where}: num_splits must be at most min({DECODE_MAX_SPLITS}, max(N_k // "
                             f"{DECODE_SPLIT_ALIGN}, 1)) = {most} for N_k={n_k} (splits are whole blocks of "
                             f"{DECODE_SPLIT_ALIGN} keys), got {num_splits}")
    return scale, num_splits


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
        causal, scale: as in :func:`~attn_course.flash.triton_attention.flash_attention` (causal is
            bottom-right aligned).
        num_splits: ``S``, from 1 to ``min(128, max(N_k // 128, 1))``; default
            :func:`decode_num_splits` for this GPU (1 in the interpreter).
        config: one of :func:`~attn_course.flash.configs.kernel_configs` ``("decode", d)``; default:
            autotuned on a GPU.
        out, lse: optional output buffers, as in :func:`~attn_course.flash.triton_attention.attention_forward`.

    Returns:
        ``(out, lse)`` as :func:`~attn_course.flash.triton_attention.attention_forward` returns them.

    Raises:
        TypeError, ValueError: as :func:`check_decode_inputs`, a bad ``config`` or buffer.
    """
    where = "attention_decode_forward"
    scale, num_splits = check_decode_inputs(where, q, k, v, causal, scale, num_splits)
    config = check_config(where, "config", config, "decode", q.shape[-1])
    check_output_buffers(where, q, out, lse)
    return launch_decode(q, k, v, causal=causal, scale=scale, num_splits=num_splits, config=config, out=out, lse=lse)


def launch_decode(q, k, v, *, causal: bool, scale: float, num_splits: int | None = None,
                  config: KernelConfig | None = None, out=None, lse=None):
    """Flash-decoding's two kernels on inputs already checked (:func:`check_decode_inputs`): the
    core of :func:`attention_decode_forward`, and what ``flash_attention`` runs for ``N_q <= 16``."""
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    multiprocessors = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
    block_m, row_chunks, num_splits = decode_layout(batch, heads, kv_heads, n_q, n_k, multiprocessors=multiprocessors,
                                                    num_splits=num_splits)
    out, lse = output_buffers(q, out, lse)
    partial_out = torch.empty((batch * heads, num_splits, n_q, head_dim), dtype=torch.float32, device=q.device)
    partial_lse = torch.empty((batch * heads, num_splits, n_q), dtype=torch.float32, device=q.device)
    launch("decode", num_splits, batch * kv_heads,
           q, k, v, partial_out, partial_lse, *q.stride(), *k.stride(), *v.stride(),
           heads, heads // kv_heads, n_q, n_k, scale, num_splits, head_dim=head_dim, causal=causal, config=config,
           extra_grid=row_chunks, BLOCK_M=block_m)
    kernel_function("attention_decode_merge_kernel")[(batch * heads * n_q,)](
        partial_out, partial_lse, out, lse, *out.stride(), heads, n_q, num_splits,
        HEAD_DIM=head_dim, SPLITS=decode_merge_width(num_splits), num_warps=4, enable_fp_fusion=ENABLE_FP_FUSION)
    return out, lse


def decode_merge_width(num_splits: int) -> int:
    """The merge kernel's ``SPLITS``: ``num_splits`` rounded up to a power of two, at least 2."""
    return max(2, 1 << (num_splits - 1).bit_length())
