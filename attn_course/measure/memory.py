"""The peak memory a computation allocates, on any device, and the memory free now.

PyTorch reports allocator statistics only for CUDA, so :func:`peak_memory` counts tensor storages itself: each
one an operation creates is added when it appears and subtracted when it is freed. The count is exact and the
same on every run, which is what the chapters need to show an ``N²`` curve.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["available_memory_bytes", "peak_memory"]


class _StorageCounter(TorchDispatchMode):
    """Follows the bytes held by storages created inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        # A view or an in-place result shares an input's storage: nothing new was allocated.
        inputs = {
            value.untyped_storage().data_ptr()
            for value in tree_flatten((args, kwargs))[0]
            if isinstance(value, torch.Tensor)
        }
        for value in tree_flatten(result)[0]:
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                if storage.data_ptr() not in inputs:
                    self._add(storage)
        return result

    def _add(self, storage: torch.UntypedStorage) -> None:
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self.live:
            return
        self.live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)


def peak_memory(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """Run ``fn(*args, **kwargs)`` and return ``(result, peak_bytes)``, the peak bytes it allocated.

    Only memory allocated during the call counts: the inputs do not, and whatever the result holds does (it
    is alive at the end).

    Raises:
        TypeError: ``fn`` is not callable.

    Example:
        >>> _, peak = peak_memory(torch.zeros, 1024, 1024)   # float32: 4 bytes each
        >>> peak
        4194304
    """
    if not callable(fn):
        raise TypeError(f"peak_memory: fn must be callable, got {type(fn).__name__}")
    counter = _StorageCounter()
    with counter:
        result = fn(*args, **kwargs)
    return result, counter.peak


def available_memory_bytes(device: str | torch.device = "cpu") -> int:
    """Bytes free now on ``device``: the machine's free RAM for ``"cpu"`` (8 GiB where it is not reported: not
    Linux), the GPU's free memory for a CUDA device; a benchmark skips a size that would swap (measuring the
    disk, not attention) or run out of GPU memory.

    Raises:
        TypeError: ``device`` not a str or ``torch.device``.
        ValueError: a device that is neither CPU nor CUDA.

    Example:
        >>> available_memory_bytes() > 0
        True
    """
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"available_memory_bytes: device must be a str or torch.device, got {type(device).__name__}")
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        raise ValueError(f"available_memory_bytes: device must be 'cpu' or 'cuda', got {str(device)!r}")
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):   # pragma: no cover - not Linux
        return 8 << 30
