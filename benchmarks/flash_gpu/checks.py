"""Input checks shared by ``gpu_rows`` and ``decode_rows``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attn_course import _validate
from benchmarks.flash_gpu.sizes import MODES

__all__ = ["check_callback", "check_deadline", "check_device", "check_dtypes", "check_modes", "nonempty_ints", "randn"]


def check_device(where: str, device: object) -> torch.device:
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{where}: device must be 'cuda' or 'cpu', got {type(device).__name__}")
    device = torch.device(device)
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"{where}: device must be 'cuda' or 'cpu' (the CPU dry run), got {str(device)!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{where}: needs a CUDA GPU; use device='cpu' for the dry run, or cpu_rows on a CPU")
    return device


def check_dtypes(where: str, dtypes: object) -> list[torch.dtype]:
    dtypes = _validate.sequence(where, "dtypes", dtypes, of="torch dtypes")
    if not dtypes:
        raise ValueError(f"{where}: dtypes must not be empty")
    for index, dtype in enumerate(dtypes):
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"{where}: dtypes[{index}] must be a floating torch.dtype, got {dtype!r}")
    return dtypes


def nonempty_ints(where: str, name: str, values: object, minimum: int = 1) -> list[int]:
    values = _validate.integer_sequence(where, name, values, minimum=minimum)
    if not values:
        raise ValueError(f"{where}: {name} must not be empty")
    return values


def check_choices(where: str, name: str, values: object, allowed: Sequence[str]) -> list[str]:
    """``values``, a non-empty sequence of labels each one of ``allowed``; or the error naming the first that is not."""
    values = _validate.labels(where, name, values)
    for index, value in enumerate(values):
        if value not in allowed:
            raise ValueError(f"{where}: {name}[{index}] must be one of {list(allowed)}, got {value!r}")
    if not values:
        raise ValueError(f"{where}: {name} must not be empty")
    return values


def check_modes(where: str, modes: object) -> list[str]:
    return check_choices(where, "modes", modes, MODES)


def check_deadline(where: str, deadline: object) -> float | None:
    if deadline is None:
        return None
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
        raise TypeError(f"{where}: deadline must be a time.monotonic() value or None, got {type(deadline).__name__}")
    return float(deadline)


def check_callback(where: str, name: str, value: object) -> Callable | None:
    if value is not None and not callable(value):
        raise TypeError(f"{where}: {name} must be callable or None, got {type(value).__name__}")
    return value


def randn(shape, dtype, device, generator) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=device, generator=generator)
