"""Input checks shared by every public function.

Each helper raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind,
wrong value) with a message that names the function, the argument, what it got and
what was expected, so that every error in the course reads the same way.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch


def shape_str(tensor: torch.Tensor) -> str:
    """``[2, 5, 8]`` for a tensor of that shape."""
    return "[" + ", ".join(str(size) for size in tensor.shape) + "]"


def tensor(where: str, name: str, value: object) -> torch.Tensor:
    """Require a ``torch.Tensor``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def floating_tensor(where: str, name: str, value: object, *, min_dim: int = 0) -> torch.Tensor:
    """Require a floating-point tensor with at least ``min_dim`` dimensions."""
    value = tensor(where, name, value)
    if not value.is_floating_point():
        raise TypeError(
            f"{where}: {name} must be a floating-point tensor, got dtype {value.dtype}; "
            f"convert it first, e.g. {name}.float()"
        )
    if value.dim() < min_dim:
        raise ValueError(
            f"{where}: {name} must have at least {min_dim} dimensions, "
            f"got shape {shape_str(value)}"
        )
    return value


def same_dtype_and_device(where: str, **tensors: torch.Tensor) -> None:
    """Require that all named tensors share one dtype and one device."""
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
        raise TypeError(f"{where}: {', '.join(tensors)} must share one dtype, got {listing}")
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"{where}: {', '.join(tensors)} must be on one device, got {listing}")


def positive_finite(where: str, name: str, value: object) -> float:
    """Require a real number ``> 0`` that is finite (bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{where}: {name} must be a positive finite number, got {type(value).__name__}"
        )
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}: {name} must be a positive finite number, got {value}")
    return value


def integer(where: str, name: str, value: object, *, minimum: int | None = None) -> int:
    """Require a Python integer (bool excluded), optionally ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an int, got {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {value}")
    return value


def broadcast_batch(where: str, **shapes: Sequence[int]) -> torch.Size:
    """Broadcast the named batch shapes together, or say which ones clash."""
    try:
        return torch.broadcast_shapes(*shapes.values())
    except RuntimeError:
        listing = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
        raise ValueError(
            f"{where}: the batch dimensions (all but the last two) must broadcast, "
            f"got {listing}"
        ) from None


def dropout(where: str, value: object, name: str = "dropout") -> float:
    """Require a dropout probability: a real number in ``[0, 1)`` (bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: {name} must be a number in [0, 1), got {type(value).__name__}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{where}: {name} must lie in [0, 1), got {value}")
    return float(value)
