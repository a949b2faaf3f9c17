"""The timer and the synchronisation of one device, from :mod:`attn_course.measure.timing`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attn_course.measure.memory import available_memory_bytes
from attn_course.measure.timing import best_time, gpu_milliseconds, gpu_timer_name, timed

__all__ = ["Clock", "capture_graph"]


def capture_graph(call: Callable[[], object], device: torch.device) -> torch.cuda.CUDAGraph:
    """``call()`` captured in a ``torch.cuda.CUDAGraph``, after two warm-up calls on a side stream."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            call()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    torch.cuda.synchronize(device)
    return graph


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

    def graphed_milliseconds(self, call: Callable[[], object]) -> tuple[float, str, str, float | None]:
        """Milliseconds of one ``call()`` replayed from a CUDA graph: no Python launch overhead.

        One call is captured in a ``torch.cuda.CUDAGraph`` (after two calls on a side stream, as
        PyTorch's CUDA-graph notes ask, so that lazy initialisation is not captured) and this
        device's timer times ``graph.replay``. ``do_bench`` flushes the L2 cache before each replay,
        so a small KV cache is read from HBM as a model's next layer would; Triton's
        ``do_bench_cudagraph`` unrolls many calls into one graph without flushing, and would time
        a cache of a few MiB from L2. Where capture fails (or on the CPU) the call is timed plainly.

        Returns:
            ``(milliseconds, timing, note, plain_milliseconds)``: ``timing`` is ``"cuda graph"`` or
            ``"plain"``; ``note`` says why a graph was not used; ``plain_milliseconds`` is the same
            call timed without a graph (None when that is ``milliseconds`` itself).
        """
        if self.device.type != "cuda":
            return self.milliseconds(call), "plain", "CPU dry run: no CUDA graphs, timed without one", None
        try:
            graph = capture_graph(call, self.device)
        except Exception as error:   # a call that synchronises, or allocates in a way capture refuses
            torch.cuda.synchronize(self.device)
            lines = str(error).strip().splitlines() or [""]
            note = (f"CUDA graph capture failed ({type(error).__name__}: {lines[0][:200]}): timed without a "
                    "graph, Python's launch overhead included")
            return self.milliseconds(call), "plain", note, None
        try:
            return self.milliseconds(graph.replay), "cuda graph", "", self.milliseconds(call)
        finally:
            del graph

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
