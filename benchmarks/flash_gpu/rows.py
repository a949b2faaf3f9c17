"""What every row of the GPU benchmark holds: the machine it ran on, the three kinds of rows, and
their CSV files, written as the rows come (a run killed midway leaves its data)."""

from __future__ import annotations

import csv
import dataclasses
import os
import pathlib
import platform
import re
import subprocess
import sys
from collections.abc import Sequence

import torch

from benchmarks.flash_gpu.backends import sdpa_has_enable_gqa

__all__ = ["CsvStream", "DecodeRow", "GpuRow", "MachineInfo", "SummaryRow", "installed_triton", "machine_facts",
           "machine_info", "nvidia_driver", "write_table"]


@dataclasses.dataclass(frozen=True)
class MachineInfo:
    """What every row names: the GPU and the software that drove it.

    Attributes:
        gpu: e.g. ``"NVIDIA H200"``; on the CPU dry run ``"none (CPU dry run: x86_64)"``.
        driver: the NVIDIA driver version (``nvidia-smi``), ``"none"`` or ``"unknown"``.
        cuda: the CUDA version torch was built with, or ``"none"``.
        torch_version, triton_version: ``torch.__version__``, ``triton.__version__``.
    """

    gpu: str
    driver: str
    cuda: str
    torch_version: str
    triton_version: str

    def title(self) -> str:
        """One line for plot titles and headers."""
        return (f"{self.gpu}; driver {self.driver}; CUDA {self.cuda}; torch {self.torch_version}; "
                f"Triton {self.triton_version}")


def installed_triton() -> str:
    try:
        import triton
    except ImportError:   # pragma: no cover - Triton is a Linux-only dependency
        return "not installed"
    return triton.__version__


def nvidia_driver() -> str:
    try:
        found = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20, check=True)
        return found.stdout.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    try:
        text = pathlib.Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return "unknown"
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else "unknown"


def machine_info(device: str = "cuda") -> MachineInfo:
    """The GPU, driver, CUDA, torch and Triton versions of this machine.

    Args:
        device: ``"cuda"`` (the current GPU) or ``"cpu"`` (the dry run: no GPU is named).

    Returns:
        A :class:`MachineInfo`.

    Raises:
        ValueError: another device.
    """
    if device not in ("cuda", "cpu"):
        raise ValueError(f"machine_info: device must be 'cuda' or 'cpu', got {device!r}")
    if device == "cuda":
        return MachineInfo(gpu=torch.cuda.get_device_name(), driver=nvidia_driver(), cuda=str(torch.version.cuda),
                           torch_version=torch.__version__, triton_version=installed_triton())
    return MachineInfo(gpu=f"none (CPU dry run: {platform.processor() or platform.machine()})", driver="none",
                       cuda=str(torch.version.cuda or "none"), torch_version=torch.__version__,
                       triton_version=installed_triton())


def machine_facts(device: torch.device) -> dict:
    """More than the rows carry, for ``machine.json``."""
    facts = {"python": sys.version.split()[0], "platform": platform.platform(), "cpu_count": os.cpu_count(),
             "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
             "sdpa_enable_gqa": sdpa_has_enable_gqa()}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        facts.update(compute_capability=".".join(map(str, torch.cuda.get_device_capability(device))),
                     memory_gib=round(properties.total_memory / 2**30, 1),
                     multiprocessors=properties.multi_processor_count)
    return facts


@dataclasses.dataclass(frozen=True)
class GpuRow:
    """One (configuration, method, mode) of :func:`gpu_rows`.

    Attributes:
        method: ``"ours (Triton)"``, ``"sdpa flash"``, ``"sdpa efficient"``, ``"sdpa cudnn"``,
            ``"flex compiled"`` (``torch.compile(flex_attention)``) or ``"naive"``.
        path: which code ran: ``"tma"`` or ``"pointer"`` (our forward; ``"tma+pointer"`` forward and
            backward), ``"sdpa-flash"``, ``"sdpa-efficient"``, ``"sdpa-cudnn"``, ``"flex-compiled"``,
            ``"naive"``; ``" (interpreter)"`` or ``"flex-eager"`` on the CPU dry run.
        dtype: e.g. ``"float16"``.
        head_dim, causal, batch, heads, kv_heads, n: d, the mask, B, H, H_kv and N of ``q`` ``[B, H, N, d]``
            and ``k``, ``v`` ``[B, H_kv, N, d]`` (``kv_heads < heads``: grouped-query prefill).
        mode: ``"forward"``, ``"backward"`` or ``"forward+backward"``.
        status: ``"ok"``, or ``"skipped"`` (then ``reason`` says why and the numbers are None).
        milliseconds: the median of ``triton.testing.do_bench`` on a GPU (the best of a few
            wall-clock runs on the CPU dry run).
        tflops: :func:`~attn_course.measure.flash.attention_flops` per second, in 10¹².
        max_difference: the output's largest absolute difference from SDPA in float32.
        first_call_s: seconds of the first call (Triton compiles, or autotunes, there), forward
            for ``"forward"``, backward for ``"backward"``.
        reason: why a row is skipped, or a note on a measured one.
        config: the launch configuration that ran, per kernel (tile sizes, warps, stages; ours from
            the autotuner's ``best_config`` or the launcher's fixed choice), or what is known of it.
        gpu, driver, cuda, torch_version, triton_version: the :class:`MachineInfo`.
    """

    method: str
    path: str
    dtype: str
    head_dim: int
    causal: bool
    batch: int
    heads: int
    kv_heads: int
    n: int
    mode: str
    status: str
    milliseconds: float | None
    tflops: float | None
    max_difference: float | None
    first_call_s: float | None
    reason: str
    config: str
    gpu: str
    driver: str
    cuda: str
    torch_version: str
    triton_version: str


@dataclasses.dataclass(frozen=True)
class DecodeRow:
    """One (configuration, method) of :func:`decode_rows`: N_q queries against a KV cache of N_k keys.

    Attributes:
        method: ``"ours (decode_attention)"``, an SDPA backend, or ``"naive"``.
        path: ``"flash-decoding"`` (ours), ``"sdpa-flash"``, ``"sdpa-efficient"``, ``"sdpa-cudnn"`` or ``"naive"``.
        dtype, head_dim, batch, heads, kv_heads, n_q, n_k: of ``q [B, H, N_q, d]`` and
            ``k``, ``v`` ``[B, H_kv, N_k, d]``.
        kv_layout: how the method saw grouped K/V: ``"grouped (in place)"``, ``"grouped
            (enable_gqa=True)"``, or ``"expanded (repeat_interleave, outside the timing)"``.
        status, milliseconds, max_difference, first_call_s, reason, config: as in :class:`GpuRow`
            (ours' config adds ``BLOCK_M``, the key splits and the merge kernel's width).
        timing: ``"cuda graph"`` (one call captured in a ``torch.cuda.CUDAGraph``, its replay timed:
            no Python launch overhead in ``milliseconds``) or ``"plain"`` (capture failed or the CPU
            dry run; ``reason`` says why).
        plain_milliseconds: the same call timed without a graph (Python's launch overhead
            included), for comparison; None when ``timing`` is ``"plain"``.
        kv_gbps: the cache's bytes (K and V, ``2 · B · H_kv · N_k · d`` elements) over the time,
            in 10⁹ bytes per second: the same bytes for every method, so it ranks them like the time.
        gpu, driver, cuda, torch_version, triton_version: the :class:`MachineInfo`.
    """

    method: str
    path: str
    dtype: str
    head_dim: int
    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_k: int
    kv_layout: str
    status: str
    timing: str
    milliseconds: float | None
    plain_milliseconds: float | None
    kv_gbps: float | None
    max_difference: float | None
    first_call_s: float | None
    reason: str
    config: str
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
        dtype, head_dim, heads, kv_heads, causal, n_q, n_k, mode: the configuration (``n_q == n_k == N``
            for attention; ``kv_heads < heads`` for grouped-query rows).
        ours_ms: our time, or None when ours did not run.
        best_sdpa: the fastest SDPA backend that ran, or ``""``.
        best_sdpa_ms: its time, or None.
        ratio: ``best_sdpa_ms / ours_ms``: ours in units of SDPA's best speed (> 1: ours faster).
        target: the goal for this ratio (forward 1.0, backward 0.8 at N ≥ 4096), or None.
        meets_target: ``ratio >= target``, or None without a target or a ratio.
        flex_ms: FlexAttention compiled's time, or None (decoding, or it did not run).
        flex_ratio: ``flex_ms / ours_ms`` (> 1: ours faster), or None.
        note: why there is no ratio.
        gpu, driver, cuda, torch_version, triton_version: the :class:`MachineInfo`.
    """

    kind: str
    dtype: str
    head_dim: int
    heads: int
    kv_heads: int
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
    flex_ms: float | None
    flex_ratio: float | None
    note: str
    gpu: str
    driver: str
    cuda: str
    torch_version: str
    triton_version: str


class CsvStream:
    """A CSV with one dataclass's columns, each row flushed as it comes: a killed run leaves its data."""

    def __init__(self, path: pathlib.Path, kind: type):
        self.path = path
        self._handle = open(path, "w", newline="")
        self._writer = csv.DictWriter(self._handle, fieldnames=[f.name for f in dataclasses.fields(kind)])
        self._writer.writeheader()
        self._handle.flush()

    def write(self, row: object) -> None:
        self._writer.writerow(dataclasses.asdict(row))
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def write_table(path: pathlib.Path, kind: type, rows: Sequence[object]) -> None:
    """Write ``rows`` (instances of the dataclass ``kind``) to ``path``: the header even when there are none."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[f.name for f in dataclasses.fields(kind)])
        writer.writeheader()
        writer.writerows(dataclasses.asdict(row) for row in rows)
