"""The GPU benchmark's rows: attention over a whole sequence, decoding, and ours against SDPA's best."""

from __future__ import annotations

import dataclasses

__all__ = ["DecodeRow", "GpuRow", "SummaryRow"]


@dataclasses.dataclass(frozen=True)
class GpuRow:
    """One (configuration, method, mode) of :func:`gpu_rows`.

    Attributes:
        method: ``"ours (Triton)"``, ``"sdpa flash"``, ``"sdpa efficient"``, ``"sdpa cudnn"`` or ``"naive"``.
        dtype: e.g. ``"float16"``.
        head_dim, causal, batch, heads, n: d, the mask, B, H and N of ``q``, ``k``, ``v`` ``[B, H, N, d]``.
        mode: ``"forward"``, ``"backward"`` or ``"forward+backward"``.
        status: ``"ok"``, or ``"skipped"`` (then ``reason`` says why and the numbers are None).
        milliseconds: the median of ``triton.testing.do_bench`` on a GPU (the best of a few
            wall-clock runs on the CPU dry run).
        tflops: :func:`~attn_course.measure.flash.attention_flops` per second, in 10¹².
        max_difference: the output's largest absolute difference from SDPA in float32.
        first_call_s: seconds of the first call (Triton compiles, or autotunes, there), forward
            for ``"forward"``, backward for ``"backward"``.
        reason: why a row is skipped, or a note on a measured one.
        gpu, driver, cuda, torch_version, triton_version: the :class:`MachineInfo`.
    """

    method: str
    dtype: str
    head_dim: int
    causal: bool
    batch: int
    heads: int
    n: int
    mode: str
    status: str
    milliseconds: float | None
    tflops: float | None
    max_difference: float | None
    first_call_s: float | None
    reason: str
    gpu: str
    driver: str
    cuda: str
    torch_version: str
    triton_version: str


@dataclasses.dataclass(frozen=True)
class DecodeRow:
    """One (configuration, method) of :func:`decode_rows`: N_q queries against a KV cache of N_k keys.

    Attributes:
        method: ``"ours (decode_attention)"`` (or ``"ours (flash_attention)"`` where there is no
            ``decode_attention``), an SDPA backend, or ``"naive"``.
        dtype, head_dim, batch, heads, kv_heads, n_q, n_k: of ``q [B, H, N_q, d]`` and
            ``k``, ``v`` ``[B, H_kv, N_k, d]``.
        kv_layout: how the method saw grouped K/V: ``"grouped (in place)"``, ``"grouped
            (enable_gqa=True)"``, or ``"expanded (repeat_interleave, outside the timing)"``.
        status, milliseconds, max_difference, first_call_s, reason: as in :class:`GpuRow`.
        kv_gbps: the cache's bytes (K and V, ``2 · B · H_kv · N_k · d`` elements) over the time,
            in 10⁹ bytes per second: the same bytes for every method, so it ranks them like the time.
        gpu, driver, cuda, torch_version, triton_version: the :class:`MachineInfo`.
    """

    method: str
    dtype: str
    head_dim: int
    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_k: int
    kv_layout: str
    status: str
    milliseconds: float | None
    kv_gbps: float | None
    max_difference: float | None
    first_call_s: float | None
    reason: str
    gpu: str
    driver: str
    cuda: str
    torch_version: str
    triton_version: str


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """Ours against the best SDPA backend for one configuration and mode (:func:`speedup_summary`).

    Attributes:
        kind: ``"attention"`` (:class:`GpuRow`) or ``"decode"`` (:class:`DecodeRow`).
        dtype, head_dim, causal, n_q, n_k, mode: the configuration (``n_q == n_k == N`` for attention).
        ours_ms: our time, or None when ours did not run.
        best_sdpa: the fastest SDPA backend that ran, or ``""``.
        best_sdpa_ms: its time, or None.
        ratio: ``best_sdpa_ms / ours_ms``: ours in units of SDPA's best speed (> 1: ours faster).
        target: the goal for this ratio (forward 1.0, backward 0.8 at N ≥ 4096), or None.
        meets_target: ``ratio >= target``, or None without a target or a ratio.
        note: why there is no ratio.
        gpu, driver, cuda, torch_version, triton_version: the :class:`MachineInfo`.
    """

    kind: str
    dtype: str
    head_dim: int
    causal: bool
    n_q: int
    n_k: int
    mode: str
    ours_ms: float | None
    best_sdpa: str
    best_sdpa_ms: float | None
    ratio: float | None
    target: float | None
    meets_target: bool | None
    note: str
    gpu: str
    driver: str
    cuda: str
    torch_version: str
    triton_version: str
