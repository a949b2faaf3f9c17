"""Input checks shared by every public function.

Each helper raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind,
wrong value) with a message that names the function, the argument, what it got and
what was expected, so that every error in the course reads the same way.
"""

from __future__ import annotations

import math
import numbers
import os
import pathlib
from collections.abc import Mapping, Sequence

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


def matrix(where: str, name: str, value: object, *, axes: str = "[N_q, N_k]") -> torch.Tensor:
    """Require a 2-D floating tensor, such as one attention map (``axes`` names its dimensions)."""
    value = floating_tensor(where, name, value)
    if value.dim() != 2:
        raise ValueError(f"{where}: {name} must be 2-D {axes}, got shape {shape_str(value)}")
    return value


def path(where: str, name: str, value: object) -> pathlib.Path:
    """Require a ``str`` or ``os.PathLike`` and return it as a ``pathlib.Path``."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{where}: {name} must be a str or pathlib.Path, got {type(value).__name__}")
    return pathlib.Path(value)


def existing_file(where: str, name: str, value: object, *, what: str = "file") -> pathlib.Path:
    """Require the path of an existing file; ``what`` says which in the error (``"config file"``)."""
    found = path(where, name, value)
    if not found.is_file():
        raise FileNotFoundError(f"{where}: no {what} {found}")
    return found


def floating_dtype(where: str, name: str, value: object) -> torch.dtype:
    """Require a floating ``torch.dtype`` (``torch.float32``, ``torch.bfloat16``, ...)."""
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise TypeError(f"{where}: {name} must be a floating torch.dtype (e.g. torch.float32), got {value!r}")
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


def instance(where: str, name: str, value: object, kind: type) -> object:
    """Require an instance of ``kind`` (a config, a step, a kernel configuration)."""
    if not isinstance(value, kind):
        raise TypeError(f"{where}: {name} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def integer(where: str, name: str, value: object, *, minimum: int | None = None) -> int:
    """Require a Python integer (bool excluded), optionally ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an int, got {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {value}")
    return value


def integer_tensor(where: str, name: str, value: object) -> torch.Tensor:
    """Require a tensor of integers (any integer dtype; not bool, floating or complex)."""
    value = tensor(where, name, value)
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{where}: {name} must be an integer tensor, got dtype {value.dtype}")
    return value


def sequence(where: str, name: str, value: object, *, of: str = "values") -> list:
    """Require a list, tuple or other sequence (a string is not one here); ``of`` names the items."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{where}: {name} must be a sequence of {of}, got {type(value).__name__}")
    return list(value)


def integer_sequence(where: str, name: str, value: object, *, minimum: int | None = None,
                     nonempty: bool = False) -> list[int]:
    """Require a sequence of ints (not a string), each ``>= minimum``, at least one if ``nonempty``;
    errors name the index."""
    value = sequence(where, name, value, of="ints")
    if nonempty and not value:
        raise ValueError(f"{where}: {name} must not be empty")
    return [integer(where, f"{name}[{index}]", item, minimum=minimum) for index, item in enumerate(value)]


def integers(where: str, *, minimum: int | None = None, **values: object) -> tuple[int, ...]:
    """Require every keyword's value to be an int ``>= minimum``; return them in the order given."""
    return tuple(integer(where, name, value, minimum=minimum) for name, value in values.items())


def seconds(where: str, name: str, value: object) -> float:
    """Require a number of seconds ``>= 0`` that is finite (a time budget)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: {name} must be a number of seconds, got {type(value).__name__}")
    if not 0 <= value < math.inf:
        raise ValueError(f"{where}: {name} must be >= 0 and finite, got {value}")
    return float(value)


def labels(where: str, name: str, value: object, expected: int | None = None) -> list[str]:
    """Require a sequence of strings (a plain string is not one), of length ``expected`` if given."""
    value = sequence(where, name, value, of="strings")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise TypeError(f"{where}: {name}[{index}] must be a str, got {type(item).__name__}")
    if expected is not None and len(value) != expected:
        raise ValueError(f"{where}: {name} must have {expected} labels, got {len(value)}")
    return list(value)


def four_d(where: str, *, layout: str = "[B, H, N, d]", **tensors: object) -> None:
    """Require floating 4-D tensors (``layout`` names their axes) that share one dtype and device."""
    for name, value in tensors.items():
        floating_tensor(where, name, value)
        if value.dim() != 4:
            raise ValueError(f"{where}: {name} must be 4-D {layout}, got shape {shape_str(value)}")
    same_dtype_and_device(where, **tensors)


def attention_inputs(
    where: str, q: object, k: object, v: object, *, causal: object = False, scale: object = None
) -> float:
    """Check ``q [B, H, N_q, d]``, ``k [B, H, N_k, d]``, ``v [B, H, N_k, d_v]`` and the options.

    Returns:
        the softmax scale: ``scale``, or ``1 / sqrt(d)`` when it is None.
    """
    four_d(where, q=q, k=k, v=v)
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{where}: expected q [B, H, N_q, d], k [B, H, N_k, d] and v [B, H, N_k, d_v], got q "
            f"{shape_str(q)}, k {shape_str(k)}, v {shape_str(v)}"
        )
    boolean(where, "causal", causal)
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(f"{where}: causal needs N_q <= N_k (the queries are the last N_q of the N_k "
                         f"positions), got N_q={q.shape[2]}, N_k={k.shape[2]}")
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else positive_finite(where, "scale", scale)


def config_mapping(where: str, name: str, value: object) -> Mapping:
    """A model configuration as a mapping: the parsed ``config.json``, or a config object's ``to_dict()``."""
    if not isinstance(value, Mapping) and callable(getattr(value, "to_dict", None)):
        value = value.to_dict()
    if not isinstance(value, Mapping):
        raise TypeError(f"{where}: {name} must be a mapping (the parsed config.json) or a config with "
                        f"to_dict(), got {type(value).__name__}")
    return value


def broadcast_shapes(*shapes: Sequence[int]) -> torch.Size:
    """``torch.broadcast_shapes`` in plain Python (NumPy's rule), raising ValueError when shapes clash.

    torch's own imports its symbolic-shapes machinery (sympy) on first use, two seconds in every new
    process, the ranks of chapter 10 included; this needs nothing.
    """
    result: list[int] = []
    for shape in shapes:
        shape = list(shape)
        for index in range(1, len(shape) + 1):
            size = shape[-index]
            if index > len(result):
                result.insert(0, size)
            elif result[-index] == 1:
                result[-index] = size
            elif size not in (1, result[-index]):
                raise ValueError(f"shapes {[list(s) for s in shapes]} do not broadcast")
    return torch.Size(result)


def broadcast_batch(where: str, **shapes: Sequence[int]) -> torch.Size:
    """Broadcast the named batch shapes together, or say which ones clash."""
    try:
        return broadcast_shapes(*shapes.values())
    except ValueError:
        listing = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
        raise ValueError(
            f"{where}: the batch dimensions (all but the last two) must broadcast, "
            f"got {listing}"
        ) from None


def boolean(where: str, name: str, value: object) -> bool:
    """Require a Python bool (``0``/``1`` are not accepted: they usually mean a mix-up)."""
    if not isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be a bool, got {type(value).__name__}")
    return value


def dropout(where: str, value: object, name: str = "dropout") -> float:
    """Require a dropout probability: a real number in ``[0, 1)`` (bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: {name} must be a number in [0, 1), got {type(value).__name__}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{where}: {name} must lie in [0, 1), got {value}")
    return float(value)


def token_ids(where: str, name: str, value: object, vocab_size: int) -> torch.Tensor:
    """``value`` as ``[B, N]`` integer ids in ``0 .. vocab_size - 1`` with ``N >= 1``."""
    ids = integer_tensor(where, name, value)
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(f"{where}: {name} must be [B, N] token ids with N >= 1, got shape {shape_str(ids)}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{where}: {name} must lie in 0 .. {vocab_size - 1} (the vocabulary), got ids from "
                         f"{int(ids.min())} to {int(ids.max())}")
    return ids
