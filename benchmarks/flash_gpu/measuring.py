"""How one method is measured: the device's clock, the time budget, a skipped row (never a crash),
and the input checks the two benchmarks share."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from attn_course import _validate
from attn_course.measure.timing import best_time, gpu_milliseconds, gpu_timer_name, timed
from benchmarks.flash_gpu.plan import DRY_RUN_DTYPES, GPU_DTYPES
from benchmarks.flash_gpu.rows import MachineInfo, machine_info

__all__ = ["TIME_BUDGET_SPENT", "Clock", "Measured", "Terminated", "capture_graph", "check_device",
           "describe_error", "measure", "past", "recorded_warnings", "setup", "sigterm_stops", "skipped"]

TIME_BUDGET_SPENT = "time budget spent (max_minutes): not measured"


def past(deadline: float | None) -> bool:
    """Whether ``deadline`` (a ``time.monotonic()`` value, or None for no limit) has passed."""
    return deadline is not None and time.monotonic() > deadline


class Terminated(BaseException):
    """SIGTERM (``timeout``) during the run: stop measuring, write what there is."""


@contextlib.contextmanager
def sigterm_stops() -> Iterator[None]:
    """Inside the block, SIGTERM raises :class:`Terminated` instead of killing the process (in the main
    thread only: no other can set a handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
    """How ``device`` is timed: ``do_bench`` on a GPU (:func:`~attn_course.measure.timing.gpu_milliseconds`),
    the best of ``repeats`` wall-clock calls on the CPU dry run (Triton's interpreter has no driver to time with)."""

    def __init__(self, device: torch.device, repeats: int = 1):
        self.device = device
        self.repeats = repeats
        self.name = gpu_timer_name() if device.type == "cuda" else f"best of {repeats} wall-clock runs (CPU dry run)"

    def milliseconds(self, call: Callable[[], object]) -> float:
        if self.device.type == "cuda":
            return gpu_milliseconds(call)
        return 1000 * best_time(call, self.repeats)

    def graphed_milliseconds(self, call: Callable[[], object]) -> tuple[float, str, str, float | None]:
        """``(milliseconds, timing, note, plain_milliseconds)`` of one ``call()`` replayed from a CUDA graph
        (``timing="cuda graph"``: no Python launch overhead), or timed plainly where capture fails or on the
        CPU (``"plain"``, ``note`` says why, ``plain_milliseconds`` None).

        ``do_bench`` flushes the L2 cache before each replay, so a small KV cache is read from HBM as a
        model's next layer would; Triton's ``do_bench_cudagraph`` replays many calls without flushing and
        would time a cache of a few MiB from L2.
        """
        if self.device.type != "cuda":
            return self.milliseconds(call), "plain", "CPU dry run: no CUDA graphs, timed without one", None
        try:
            graph = capture_graph(call, self.device)
        except Exception as error:   # a call that synchronises, or allocates in a way capture refuses
            torch.cuda.synchronize(self.device)
            note = (f"CUDA graph capture failed ({describe_error(error)}): timed without a graph, Python's launch "
                    "overhead included")
            return self.milliseconds(call), "plain", note, None
        try:
            return self.milliseconds(graph.replay), "cuda graph", "", self.milliseconds(call)
        finally:
            del graph

    def first_call(self, call: Callable[[], Any]) -> tuple[Any, float]:
        """``call()`` once, untouched by any warm-up (Triton compiles or autotunes there): its result and seconds."""
        def synchronised():
            result = call()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)     # the GPU's work counts, not only its launch
            return result

        return timed(synchronised)

    def empty_cache(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


@dataclasses.dataclass(frozen=True)
class Measured:
    """One method in one mode: ``"ok"`` with its numbers, or ``"skipped"`` with the reason."""

    status: str
    milliseconds: float | None = None
    max_difference: float | None = None
    first_call_s: float | None = None
    reason: str = ""
    timing: str = ""
    plain_milliseconds: float | None = None


def skipped(reason: str, modes: Sequence[str]) -> dict[str, Measured]:
    """``{mode: skipped}`` for every mode, with ``reason``."""
    return {mode: Measured("skipped", reason=reason) for mode in modes}


def describe_error(error: BaseException, caught: Sequence[warnings.WarningMessage] = ()) -> str:
    """A skipped row's reason: the error's type and first line, then the warnings ``caught`` (SDPA says why)."""
    lines = str(error).strip().splitlines() or [""]
    text = f"{type(error).__name__}: {lines[0][:240]}"
    said = [" ".join(str(w.message).split())[:200] for w in caught]
    return text + (" | warnings: " + " | ".join(dict.fromkeys(said)) if said else "")


@contextlib.contextmanager
def recorded_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning raised inside the block, in a list (none shown)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def measure(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor | None,
            reference: torch.Tensor | None, modes: Sequence[str], clock: Clock,
            deadline: float | None, *, graphed: bool = False) -> dict[str, Measured]:
    """``{mode: Measured}`` of ``fn(q, k, v)``; what ``fn`` raises is a skipped row's reason, never raised.
    ``graphed``: the forward is replayed from a CUDA graph (:meth:`Clock.graphed_milliseconds`)."""
    if past(deadline):
        return skipped(TIME_BUDGET_SPENT, modes)
    inputs = (q, k, v)
    with recorded_warnings() as caught:
        try:
            out, first_forward = clock.first_call(lambda: fn(q, k, v))
        except Exception as error:   # an unavailable backend, an unsupported case, out of memory
            clock.empty_cache()
            return skipped(describe_error(error, caught), modes)
    difference = None if reference is None else (out.detach().float() - reference).abs().max().item()
    out = None
    results = {}
    for mode in modes:
        if past(deadline):
            results[mode] = Measured("skipped", reason=TIME_BUDGET_SPENT)
            continue
        first = None
        try:
            if mode == "forward":
                first = first_forward

                def call():
                    with torch.no_grad():
                        fn(q, k, v)
            elif mode == "backward":
                out = fn(q, k, v)
                _, first = clock.first_call(lambda out=out: torch.autograd.grad(out, inputs, grad_out,
                                                                               retain_graph=True))

                def call(out=out):
                    torch.autograd.grad(out, inputs, grad_out, retain_graph=True)
            else:                                # "forward+backward"
                def call():
                    torch.autograd.grad(fn(q, k, v), inputs, grad_out)
            if graphed and mode == "forward":
                ms, timing, note, plain = clock.graphed_milliseconds(call)
                results[mode] = Measured("ok", ms, difference, first, note, timing, plain)
            else:
                results[mode] = Measured("ok", clock.milliseconds(call), difference, first, timing="plain")
        except Exception as error:
            results[mode] = Measured("skipped", reason=describe_error(error))
        finally:
            out = call = None   # frees a retained graph before the next mode
            clock.empty_cache()
    return results


def check_device(where: str, device: object) -> torch.device:
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{where}: device must be 'cuda' or 'cpu', got {type(device).__name__}")
    device = torch.device(device)
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"{where}: device must be 'cuda' or 'cpu' (the CPU dry run), got {str(device)!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{where}: needs a CUDA GPU; use device='cpu' for the dry run, or cpu_rows on a CPU")
    return device


def setup(where: str, *, dtypes, seed, deadline, on_row, progress, machine, device) -> dict:
    """The arguments :func:`gpu_rows` and :func:`decode_rows` share, checked, with their defaults: the dtypes
    (float16 and bfloat16 on a GPU, float16 and float32 on the CPU), the machine, the clock and a generator
    seeded on the device."""
    if dtypes is not None:
        dtypes = _validate.sequence(where, "dtypes", dtypes, of="torch dtypes")
        if not dtypes:
            raise ValueError(f"{where}: dtypes must not be empty")
        for index, dtype in enumerate(dtypes):
            if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
                raise TypeError(f"{where}: dtypes[{index}] must be a floating torch.dtype, got {dtype!r}")
    seed = _validate.integer(where, "seed", seed, minimum=0)
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))):
        raise TypeError(f"{where}: deadline must be a time.monotonic() value or None, got {type(deadline).__name__}")
    for name, value in (("on_row", on_row), ("progress", progress)):
        if value is not None and not callable(value):
            raise TypeError(f"{where}: {name} must be callable or None, got {type(value).__name__}")
    if machine is not None and not isinstance(machine, MachineInfo):
        raise TypeError(f"{where}: machine must be a MachineInfo or None, got {type(machine).__name__}")
    device = check_device(where, device)
    return dict(dtypes=dtypes or list(GPU_DTYPES if device.type == "cuda" else DRY_RUN_DTYPES),
                deadline=None if deadline is None else float(deadline), on_row=on_row or (lambda row: None),
                progress=progress or (lambda line: None), machine=machine or machine_info(device.type),
                clock=Clock(device), generator=torch.Generator(device=device).manual_seed(seed))
