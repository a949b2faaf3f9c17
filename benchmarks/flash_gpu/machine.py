"""The machine every row names: the GPU, its driver, CUDA, torch and Triton, and more facts for ``machine.json``."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import platform
import re
import subprocess
import sys

import torch

from benchmarks.flash_gpu.backends import ours_decode, sdpa_has_enable_gqa
from benchmarks.flash_gpu.checks import check_device

__all__ = ["MachineInfo", "installed_triton", "machine_facts", "machine_info", "nvidia_driver"]


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
        RuntimeError: ``"cuda"`` without a CUDA GPU.
    """
    device = check_device("machine_info", device)
    if device.type == "cuda":
        return MachineInfo(gpu=torch.cuda.get_device_name(), driver=nvidia_driver(), cuda=str(torch.version.cuda),
                           torch_version=torch.__version__, triton_version=installed_triton())
    return MachineInfo(gpu=f"none (CPU dry run: {platform.processor() or platform.machine()})", driver="none",
                       cuda=str(torch.version.cuda or "none"), torch_version=torch.__version__,
                       triton_version=installed_triton())


def machine_facts(device: torch.device) -> dict:
    """More than the rows carry, for ``machine.json``."""
    facts = {"python": sys.version.split()[0], "platform": platform.platform(), "cpu_count": os.cpu_count(),
             "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
             "sdpa_enable_gqa": sdpa_has_enable_gqa(), "decode_attention": ours_decode()[0]}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        facts.update(compute_capability=".".join(map(str, torch.cuda.get_device_capability(device))),
                     memory_gib=round(properties.total_memory / 2**30, 1),
                     multiprocessors=properties.multi_processor_count)
    return facts
