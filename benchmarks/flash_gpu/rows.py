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

__all__ = ["CsvStream", "DecodeRow", "GpuRow", "MachineInfo", "SummaryRow", "machine_facts", "machine_info",
           "nvidia_driver"]


@dataclasses.dataclass(frozen=True)
class MachineInfo:
    """What every row names: the GPU (``"none (CPU dry run: x86_64)"`` on the dry run), the NVIDIA driver
    (``"none"`` or ``"unknown"`` where not found), the CUDA torch was built with, torch's and Triton's versions."""

    gpu: str
    driver: str
    cuda: str
    torch_version: str
    triton_version: str

    def title(self) -> str:
        """One line for plot titles and headers."""
        return (f"{self.gpu}; driver {self.driver}; CUDA {self.cuda}; torch {self.torch_version}; "
                f"Triton {self.triton_version}")


def _row(cls: type) -> type:
    """A frozen row dataclass whose last columns are :class:`MachineInfo`'s: every row names its machine."""
    cls.__annotations__ = {**cls.__annotations__, **MachineInfo.__annotations__}
    return dataclasses.dataclass(frozen=True)(cls)


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
    """The GPU, driver, CUDA, torch and Triton versions of this machine (``device="cpu"``: the dry run's).

    Raises:
        ValueError: a device other than ``"cuda"`` or ``"cpu"``.
    """
    if device not in ("cuda", "cpu"):
        raise ValueError(f"machine_info: device must be 'cuda' or 'cpu', got {device!r}")
    try:
        from triton import __version__ as triton_version
    except ImportError:   # pragma: no cover - Triton is a Linux-only dependency
        triton_version = "not installed"
    gpu = device == "cuda"
    return MachineInfo(gpu=torch.cuda.get_device_name() if gpu else
                       f"none (CPU dry run: {platform.processor() or platform.machine()})",
                       driver=nvidia_driver() if gpu else "none", cuda=str(torch.version.cuda or "none"),
                       torch_version=torch.__version__, triton_version=triton_version)


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


@_row
class GpuRow:
    """One (configuration, method, mode) of :func:`gpu_rows`, on ``q [B, H, N, d]``, ``k``, ``v`` ``[B, H_kv, N, d]``.

    ``path`` is the code that ran (ours ``"tma"``, ``"pointer"`` or ``"tma+pointer"``; ``"sdpa-cudnn"``,
    ``"flex-compiled"``, ...; ``" (interpreter)"`` or ``"flex-eager"`` on the dry run) and ``config`` its
    launch configuration per kernel (ours: the launcher's tuned winner or the autotuner's ``best_config``).
    A ``"skipped"`` row has a ``reason`` and no numbers. ``milliseconds``: the median of ``do_bench`` (the
    dry run's best wall-clock run); ``tflops``: :func:`~attn_course.measure.flash.attention_flops` per second
    in 10¹²; ``max_difference``: from SDPA in float32; ``first_call_s``: the first forward (or backward)
    call, where Triton compiles or autotunes.
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


@_row
class DecodeRow:
    """One (configuration, method) of :func:`decode_rows`: ``q [B, H, N_q, d]`` against a KV cache
    ``[B, H_kv, N_k, d]``; the columns :class:`GpuRow` has mean the same (ours' ``config`` adds ``BLOCK_M``,
    the key splits and the merge kernel's width).

    ``kv_layout``: how the method saw grouped K/V (in place, ``enable_gqa=True``, or expanded outside the
    timing). ``timing``: ``"cuda graph"`` (one captured call replayed, no Python launch overhead) or
    ``"plain"`` (capture failed or the dry run; ``reason`` says why); ``plain_milliseconds``: the call timed
    without a graph. ``kv_gbps``: the cache's bytes (``2 · B · H_kv · N_k · d`` elements) over the time, in
    10⁹ bytes per second, the same bytes for every method.
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


@_row
class SummaryRow:
    """Ours against FlashAttention-2 (SDPA's flash backend), cuDNN (SDPA's cuDNN backend), the fastest SDPA
    backend (``best_sdpa``) and FlexAttention, for one configuration and mode (:func:`speedup_summary`).

    ``kind``: ``"attention"`` (``n_q == n_k == N``) or ``"decode"``. Each ratio is the other's milliseconds
    over ours (> 1: ours faster): ``fa2_ratio``, ``cudnn_ratio``, ``ratio`` (the fastest SDPA backend's),
    ``flex_ratio``; None where that one did not run. ``target``: the goal for ``fa2_ratio`` and for
    ``cudnn_ratio`` at N >= 4096 (forward 1.0, backward 0.8), else None. ``misses``: the references whose
    target ours missed, ``"FA2"``, ``"cuDNN"`` or ``"FA2+cuDNN"``; ``""`` where it met both, or none applies.
    ``note``: why a ratio is missing.
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
    fa2_ms: float | None
    fa2_ratio: float | None
    cudnn_ms: float | None
    cudnn_ratio: float | None
    best_sdpa: str
    best_sdpa_ms: float | None
    ratio: float | None
    target: float | None
    misses: str
    flex_ms: float | None
    flex_ratio: float | None
    note: str


class CsvStream:
    """A CSV with the columns of the dataclass ``kind`` (the header even with no rows), each row flushed as it
    comes (a killed run leaves its data) and kept in ``rows``; ``rows`` given are written at once."""

    def __init__(self, path: pathlib.Path, kind: type, rows: Sequence[object] = ()):
        self.rows = []
        self._handle = open(path, "w", newline="")
        self._writer = csv.DictWriter(self._handle, fieldnames=[f.name for f in dataclasses.fields(kind)])
        self._writer.writeheader()
        self._handle.flush()
        for row in rows:
            self.write(row)

    def write(self, row: object) -> None:
        self._writer.writerow(dataclasses.asdict(row))
        self._handle.flush()
        self.rows.append(row)

    def close(self) -> None:
        self._handle.close()
