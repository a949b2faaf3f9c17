"""The timer and the synchronisation of one device, from :mod:`attn_course.measure.timing`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attn_course.measure.memory import available_memory_bytes
from attn_course.measure.timing import best_time, gpu_milliseconds, gpu_timer_name, timed

__all__ = ["Clock"]


class Clock:
    """How one device is timed: ``triton.testing.do_bench`` on a GPU
    (:func:`~attn_course.measure.timing.gpu_milliseconds`), the best of ``repeats`` wall-clock
    calls on the CPU dry run (:func:`~attn_course.measure.timing.best_time`: Triton's interpreter
    has no driver for ``do_bench``).

    Args:
        device: ``cuda`` or ``cpu``.
        repeats: the dry run's timed calls per measurement.
    """

    def __init__(self, device: torch.device, repeats: int = 1):
        self.device = device
        self.repeats = repeats
        self.name = gpu_timer_name() if device.type == "cuda" else f"best of {repeats} wall-clock runs (CPU dry run)"

    def milliseconds(self, call: Callable[[], object]) -> float:
        """Milliseconds of one ``call()``, by this device's timer."""
        if self.device.type == "cuda":
            return gpu_milliseconds(call)
        return 1000 * best_time(call, self.repeats)

    def first_call(self, call: Callable[[], Any]) -> tuple[Any, float]:
        """``call()`` once, untouched by any warm-up (Triton compiles or autotunes there): its result and seconds."""
        def synchronised():
            result = call()
            self.synchronize()                       # the GPU's work counts, not only its launch
            return result

        return timed(synchronised)

    def synchronize(self) -> None:
        """Wait for the device's queued work (nothing to wait for on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def free_bytes(self) -> int:
        """Bytes free on the device now (:func:`~attn_course.measure.memory.available_memory_bytes`)."""
        return available_memory_bytes(self.device)

    def empty_cache(self) -> None:
        """Return the caching allocator's free blocks to the GPU, between measurements."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
