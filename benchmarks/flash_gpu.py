"""``python -m attn_course.measure flash`` on a CUDA GPU: our Triton kernels against SDPA's backends.

Two benchmarks, each row written to its CSV the moment it is measured:

* **Attention over a whole sequence** (:func:`gpu_rows`, ``flash-gpu.csv``): forward, backward and
  forward+backward TFLOP/s of :func:`~attn_course.flash.flash_attention`, of
  ``scaled_dot_product_attention`` restricted to each of its CUDA backends (flash,
  memory-efficient, cuDNN) and of naive attention (:func:`~attn_course.core.attention.self_attention`,
  which materialises the N × N weights in float32), for float16 and bfloat16, d = 128 and 64,
  N = 512 … 16384, causal or not. ``B = tokens / N`` sequences of ``H = model_dim / d`` heads, so
  every N does the same work per token, as in the FlashAttention papers.
* **Decoding** (:func:`decode_rows`, ``flash-gpu-decode.csv``): N_q = 1 (and 16) new queries
  against a KV cache of N_k = 1024 … 65536 keys, B = 4, H = 32 query heads and H_kv = 8 key/value
  heads (grouped-query, as in Llama 3 8B), d = 128. Decoding reads the whole cache to do
  ``4 · H · N_q · N_k · d`` FLOPs: about ``N_q · H / H_kv / 2`` FLOPs per byte, far below the
  hundreds a GPU needs to be compute-bound, so it is **memory-bound** and is reported as
  milliseconds and as achieved GB/s of K/V read (the cache's bytes over the time; the H200's
  HBM peaks near 4.8 TB/s).

A backend that is not available for a case, or raises, is a row with ``status="skipped"`` and the
reason (SDPA's own warnings included), never a crash. :func:`speedup_summary` gives ours against
the best SDPA backend per configuration (``flash-gpu-summary.csv``): the goal is forward ≥ 1.0×
and backward ≥ 0.8× at N ≥ 4096. Every row carries the GPU, driver, CUDA, torch and Triton
versions (:class:`MachineInfo`); ``machine.json`` holds more facts about the run.

:func:`run_gpu_benchmark` orders the measurements by importance (long sequences in float16 first,
then decoding, then bfloat16, short sequences last) and stops starting new ones after
``max_minutes``; what it did not reach is recorded as skipped. ``dry_run=True`` runs the very
same code on the CPU at tiny sizes (the kernels in Triton's interpreter, float16 and float32,
a wall-clock timer instead of ``triton.testing.do_bench``) so that a first GPU run does not fail
on a typo.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import inspect
import json
import math
import os
import pathlib
import platform
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.measure.flash import attention_flops
from attn_course.measure.timing import best_time, check_rows

__all__ = ["DECODE_KV_LENGTHS", "DRY_RUN", "GPU_LENGTHS", "DecodeRow", "GpuBenchmarkResult", "GpuRow",
           "MachineInfo", "SummaryRow", "decode_rows", "gpu_rows", "machine_info", "plot_gpu_rows",
           "print_summary", "run_gpu_benchmark", "sdpa_has_enable_gqa", "speedup_summary"]

GPU_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
GPU_HEAD_DIMS = (128, 64)
GPU_DTYPES = (torch.float16, torch.bfloat16)
DRY_RUN_DTYPES = (torch.float16, torch.float32)    # the interpreter's tl.dot has no bfloat16
MODES = ("forward", "backward", "forward+backward")
DECODE_KV_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
DECODE_QUERY_LENGTHS = (1, 16)
LONG_FROM = 4096                                    # the targets are stated for N >= 4096
NAIVE_UP_TO = 8192                                  # naive attention's longest N
TARGETS = {"forward": 1.0, "backward": 0.8}         # ours / best SDPA backend, in speed
SDPA_BACKENDS = {"sdpa flash": "FLASH_ATTENTION", "sdpa efficient": "EFFICIENT_ATTENTION",
                 "sdpa cudnn": "CUDNN_ATTENTION"}
TIME_BUDGET_SPENT = "time budget spent (max_minutes): not measured"
# The GPU run's sizes, and the dry run's: the same code and loops, tiny sizes.
GPU_SIZES = dict(lengths=GPU_LENGTHS, head_dims=GPU_HEAD_DIMS, dtypes=GPU_DTYPES, tokens=16384,
                 model_dim=2048, long_from=LONG_FROM, decode=dict(kv_lengths=DECODE_KV_LENGTHS, batch=4,
                                                                 heads=32, kv_heads=8, head_dim=128))
DRY_RUN = dict(lengths=(64, 128), head_dims=(64,), dtypes=DRY_RUN_DTYPES, tokens=128, model_dim=128,
               long_from=128, decode=dict(kv_lengths=(128, 256), batch=1, heads=4, kv_heads=2, head_dim=64))
_DO_BENCH_OPTIONS = {"warmup": 5, "rep": 25, "return_mode": "median"}   # milliseconds of warm-up, of timing
WARM_UP_SECONDS = 120


# --- the machine -------------------------------------------------------------------------------

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


def _triton_version() -> str:
    try:
        import triton
    except ImportError:   # pragma: no cover - Triton is a Linux-only dependency
        return "not installed"
    return triton.__version__


def _nvidia_driver() -> str:
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
    device = _device("machine_info", device)
    if device.type == "cuda":
        return MachineInfo(gpu=torch.cuda.get_device_name(), driver=_nvidia_driver(), cuda=str(torch.version.cuda),
                           torch_version=torch.__version__, triton_version=_triton_version())
    return MachineInfo(gpu=f"none (CPU dry run: {platform.processor() or platform.machine()})", driver="none",
                       cuda=str(torch.version.cuda or "none"), torch_version=torch.__version__,
                       triton_version=_triton_version())


def _machine_facts(device: torch.device) -> dict:
    """More than the rows carry, for ``machine.json``."""
    facts = {"python": sys.version.split()[0], "platform": platform.platform(), "cpu_count": os.cpu_count(),
             "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
             "sdpa_enable_gqa": sdpa_has_enable_gqa(), "decode_attention": _ours_decode()[0]}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        facts.update(compute_capability=".".join(map(str, torch.cuda.get_device_capability(device))),
                     memory_gib=round(properties.total_memory / 2**30, 1),
                     multiprocessors=properties.multi_processor_count)
    return facts


# --- rows --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GpuRow:
    """One (configuration, method, mode) of :func:`gpu_rows`.

    Attributes:
        method: ``"ours (Triton)"``, ``"sdpa flash"``, ``"sdpa efficient"``, ``"sdpa cudnn"`` or ``"naive"``.
        dtype: e.g. ``"float16"``.
        head_dim, causal, batch, heads, n: d, the mask, B, H and N of ``q``, ``k``, ``v`` ``[B, H, N, d]``.
        mode: ``"forward"``, ``"backward"`` or ``"forward+backward"``.
        status: ``"ok"``, or ``"skipped"`` (then ``reason`` says why and the numbers are None).
        milliseconds: the median of ``triton.testing.do_bench`` on a GPU (the best of a few
            wall-clock runs on the CPU dry run).
        tflops: :func:`~attn_course.measure.flash.attention_flops` per second, in 10¹².
        max_difference: the output's largest absolute difference from SDPA in float32.
        first_call_s: seconds of the first call (Triton compiles, or autotunes, there), forward
            for ``"forward"``, backward for ``"backward"``.
        reason: why a row is skipped, or a note on a measured one.
        gpu, driver, cuda, torch_version, triton_version: the :class:`MachineInfo`.
    """

    method: str
    dtype: str
    head_dim: int
    causal: bool
    batch: int
    heads: int
    n: int
    mode: str
    status: str
    milliseconds: float | None
    tflops: float | None
    max_difference: float | None
    first_call_s: float | None
    reason: str
    gpu: str
    driver: str
    cuda: str
    torch_version: str
    triton_version: str


@dataclasses.dataclass(frozen=True)
class DecodeRow:
    """One (configuration, method) of :func:`decode_rows`: N_q queries against a KV cache of N_k keys.

    Attributes:
        method: ``"ours (decode_attention)"`` (or ``"ours (flash_attention)"`` where there is no
            ``decode_attention``), an SDPA backend, or ``"naive"``.
        dtype, head_dim, batch, heads, kv_heads, n_q, n_k: of ``q [B, H, N_q, d]`` and
            ``k``, ``v`` ``[B, H_kv, N_k, d]``.
        kv_layout: how the method saw grouped K/V: ``"grouped (in place)"``, ``"grouped
            (enable_gqa=True)"``, or ``"expanded (repeat_interleave, outside the timing)"``.
        status, milliseconds, max_difference, first_call_s, reason: as in :class:`GpuRow`.
        kv_gbps: the cache's bytes (K and V, ``2 · B · H_kv · N_k · d`` elements) over the time,
            in 10⁹ bytes per second: the same bytes for every method, so it ranks them like the time.
        gpu, driver, cuda, torch_version, triton_version: the :class:`MachineInfo`.
    """

    method: str
    dtype: str
    head_dim: int
    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_k: int
    kv_layout: str
    status: str
    milliseconds: float | None
    kv_gbps: float | None
    max_difference: float | None
    first_call_s: float | None
    reason: str
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
        dtype, head_dim, causal, n_q, n_k, mode: the configuration (``n_q == n_k == N`` for attention).
        ours_ms: our time, or None when ours did not run.
        best_sdpa: the fastest SDPA backend that ran, or ``""``.
        best_sdpa_ms: its time, or None.
        ratio: ``best_sdpa_ms / ours_ms``: ours in units of SDPA's best speed (> 1: ours faster).
        target: the goal for this ratio (forward 1.0, backward 0.8 at N ≥ 4096), or None.
        meets_target: ``ratio >= target``, or None without a target or a ratio.
        note: why there is no ratio.
        gpu, driver, cuda, torch_version, triton_version: the :class:`MachineInfo`.
    """

    kind: str
    dtype: str
    head_dim: int
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
    note: str
    gpu: str
    driver: str
    cuda: str
    torch_version: str
    triton_version: str


# --- measuring one method ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Measured:
    status: str
    milliseconds: float | None = None
    max_difference: float | None = None
    first_call_s: float | None = None
    reason: str = ""


def _skipped(reason: str, modes: Sequence[str]) -> dict[str, _Measured]:
    return {mode: _Measured("skipped", reason=reason) for mode in modes}


def _reason(error: BaseException, caught: Sequence[warnings.WarningMessage] = ()) -> str:
    lines = str(error).strip().splitlines() or [""]
    text = f"{type(error).__name__}: {lines[0][:240]}"
    said = [" ".join(str(w.message).split())[:200] for w in caught]
    return text + (" | warnings: " + " | ".join(dict.fromkeys(said)) if said else "")


@contextlib.contextmanager
def _recorded_warnings() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


class _Clock:
    """The timer and the synchronisation of one device: CUDA events through ``triton.testing.do_bench``
    on a GPU, wall-clock ``best_time`` on the CPU."""

    def __init__(self, device: torch.device, repeats: int = 1):
        self.device = device
        if device.type == "cuda":
            from triton.testing import do_bench  # here: only a GPU has the driver it needs

            accepted = inspect.signature(do_bench).parameters
            options = {name: value for name, value in _DO_BENCH_OPTIONS.items() if name in accepted}
            self._time = functools.partial(do_bench, **options)
            self.name = f"triton.testing.do_bench({', '.join(f'{k}={v!r}' for k, v in options.items())})"
        else:
            self._time = lambda call: 1000 * best_time(call, repeats)
            self.name = f"best of {repeats} wall-clock runs (CPU dry run)"

    def milliseconds(self, call: Callable[[], object]) -> float:
        result = self._time(call)
        return float(result[0] if isinstance(result, (tuple, list)) else result)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def free_bytes(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.mem_get_info(self.device)[0]
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError, AttributeError):   # pragma: no cover - not Linux
            return 8 << 30

    def empty_cache(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _measure(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor | None,
             reference: torch.Tensor | None, modes: Sequence[str], clock: _Clock,
             deadline: float | None) -> dict[str, _Measured]:
    """Time ``fn(q, k, v)`` in each mode; never raises for what ``fn`` raises (the row says it)."""
    if _past(deadline):
        return _skipped(TIME_BUDGET_SPENT, modes)
    inputs = (q, k, v)
    with _recorded_warnings() as caught:
        try:
            start = time.perf_counter()
            out = fn(q, k, v)
            clock.synchronize()
            first_forward = time.perf_counter() - start
        except Exception as error:   # an unavailable backend, an unsupported case, out of memory
            clock.empty_cache()
            return _skipped(_reason(error, caught), modes)
    difference = None if reference is None else (out.detach().float() - reference).abs().max().item()
    out = None
    results = {}
    for mode in modes:
        if _past(deadline):
            results[mode] = _Measured("skipped", reason=TIME_BUDGET_SPENT)
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
                start = time.perf_counter()
                torch.autograd.grad(out, inputs, grad_out, retain_graph=True)
                clock.synchronize()
                first = time.perf_counter() - start

                def call(out=out):
                    torch.autograd.grad(out, inputs, grad_out, retain_graph=True)
            elif mode == "forward+backward":
                def call():
                    torch.autograd.grad(fn(q, k, v), inputs, grad_out)
            else:
                raise ValueError(f"unknown mode {mode!r}")
            results[mode] = _Measured("ok", clock.milliseconds(call), difference, first)
        except Exception as error:
            results[mode] = _Measured("skipped", reason=_reason(error))
        finally:
            out = call = None   # frees a retained graph before the next mode
            clock.empty_cache()
    return results


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline


def _sdpa_context(method: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[method]))


@functools.cache
def sdpa_has_enable_gqa() -> bool:
    """Whether this torch's ``scaled_dot_product_attention`` takes ``enable_gqa`` (added in torch 2.5).

    Returns:
        True when SDPA accepts grouped-query K/V with ``enable_gqa=True``; backends may still
        refuse it (then :func:`decode_rows` expands K/V for them).
    """
    q, k = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 2, 8)
    try:
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    except TypeError:
        return False
    return True


@functools.cache
def _ours_decode() -> tuple[str, Callable, str]:
    """(method name, function, note): ``decode_attention`` if the package has it, else ``flash_attention``."""
    from attn_course.flash import triton_attention

    try:
        from attn_course.flash import decode_attention
    except ImportError as error:
        decode_attention = getattr(triton_attention, "decode_attention", None)
        if decode_attention is None:
            return ("ours (flash_attention)", triton_attention.flash_attention,
                    f"no decode_attention ({error}); flash_attention timed")
    return "ours (decode_attention)", decode_attention, ""


# --- input checks shared by gpu_rows and decode_rows --------------------------------------------

def _device(where: str, device: object) -> torch.device:
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{where}: device must be 'cuda' or 'cpu', got {type(device).__name__}")
    device = torch.device(device)
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"{where}: device must be 'cuda' or 'cpu' (the CPU dry run), got {str(device)!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{where}: needs a CUDA GPU; use device='cpu' for the dry run, or cpu_rows on a CPU")
    return device


def _dtypes(where: str, dtypes: object) -> list[torch.dtype]:
    dtypes = _validate.sequence(where, "dtypes", dtypes, of="torch dtypes")
    if not dtypes:
        raise ValueError(f"{where}: dtypes must not be empty")
    for index, dtype in enumerate(dtypes):
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"{where}: dtypes[{index}] must be a floating torch.dtype, got {dtype!r}")
    return dtypes


def _nonempty_ints(where: str, name: str, values: object, minimum: int = 1) -> list[int]:
    values = _validate.integer_sequence(where, name, values, minimum=minimum)
    if not values:
        raise ValueError(f"{where}: {name} must not be empty")
    return values


def _modes(where: str, modes: object) -> list[str]:
    modes = _validate.labels(where, "modes", modes)
    for index, mode in enumerate(modes):
        if mode not in MODES:
            raise ValueError(f"{where}: modes[{index}] must be one of {list(MODES)}, got {mode!r}")
    if not modes:
        raise ValueError(f"{where}: modes must not be empty")
    return modes


def _deadline(where: str, deadline: object) -> float | None:
    if deadline is None:
        return None
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
        raise TypeError(f"{where}: deadline must be a time.monotonic() value or None, got {type(deadline).__name__}")
    return float(deadline)


def _callback(where: str, name: str, value: object) -> Callable | None:
    if value is not None and not callable(value):
        raise TypeError(f"{where}: {name} must be callable or None, got {type(value).__name__}")
    return value


def _randn(shape, dtype, device, generator) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=device, generator=generator)


# --- attention over a whole sequence ------------------------------------------------------------

def gpu_rows(lengths: Sequence[int] = GPU_LENGTHS, *, head_dims: Sequence[int] = GPU_HEAD_DIMS,
             dtypes: Sequence[torch.dtype] | None = None, causal: Sequence[bool] = (False, True),
             modes: Sequence[str] = MODES, tokens: int = 16384, model_dim: int = 2048, seed: int = 0,
             device: str = "cuda", deadline: float | None = None, on_row: Callable[[GpuRow], None] | None = None,
             progress: Callable[[str], None] | None = None, machine: MachineInfo | None = None) -> list[GpuRow]:
    """TFLOP/s of our Triton kernel, SDPA's backends and naive attention, forward and backward.

    Batch and heads follow the FlashAttention papers: ``B = tokens / N`` sequences (at least 1)
    of ``H = model_dim / d`` heads. Every (dtype, d, causal, N) gives one row per method and
    mode; a method that is unavailable or raises gives ``status="skipped"`` rows with the reason.
    Naive attention is skipped above N = 8192 and where its N × N float32 matrices would not
    fit in free memory.

    Args:
        lengths: sequence lengths N, measured in this order.
        head_dims: d values; each must divide ``model_dim``.
        dtypes: floating dtypes; default float16 and bfloat16 on a GPU, float16 and float32 on the CPU.
        causal: the mask settings to measure, e.g. ``(False, True)``.
        modes: a subset of ``"forward"``, ``"backward"``, ``"forward+backward"``.
        tokens: B · N per measurement.
        model_dim: H · d per measurement.
        seed: for the random inputs, ``>= 0`` (a generator on the device; the global RNG is not touched).
        device: ``"cuda"``, or ``"cpu"`` for the dry run (Triton's interpreter, a wall-clock timer).
        deadline: a ``time.monotonic()`` value; a measurement that would start later becomes a
            skipped row (``reason`` says so). None: no limit.
        on_row: called with each row as soon as it is measured (e.g. to append it to a CSV).
        progress: called with one line of text per configuration.
        machine: the :class:`MachineInfo` the rows name (default: :func:`machine_info`).

    Returns:
        One :class:`GpuRow` per (dtype, d, causal, N, method, mode), in that nesting order.

    Raises:
        TypeError: an argument of the wrong type (a size not an int, a dtype not a floating
            ``torch.dtype``, a callback not callable).
        ValueError: empty or non-positive sizes, a head dim that does not divide ``model_dim``,
            an unknown mode, a negative seed, or an unknown device.
        RuntimeError: ``device="cuda"`` without a CUDA GPU.
    """
    where = "gpu_rows"
    lengths = _nonempty_ints(where, "lengths", lengths)
    head_dims = _nonempty_ints(where, "head_dims", head_dims)
    dtypes = None if dtypes is None else _dtypes(where, dtypes)
    causal = _validate.sequence(where, "causal", causal, of="bools")
    causal = [_validate.boolean(where, f"causal[{index}]", value) for index, value in enumerate(causal)]
    if not causal:
        raise ValueError(f"{where}: causal must not be empty")
    modes = _modes(where, modes)
    tokens = _validate.integer(where, "tokens", tokens, minimum=1)
    model_dim = _validate.integer(where, "model_dim", model_dim, minimum=1)
    for index, head_dim in enumerate(head_dims):
        if model_dim % head_dim:
            raise ValueError(f"{where}: head_dims[{index}] must divide model_dim={model_dim}, got {head_dim}")
    seed = _validate.integer(where, "seed", seed, minimum=0)
    deadline = _deadline(where, deadline)
    on_row, progress = _callback(where, "on_row", on_row), _callback(where, "progress", progress)
    if machine is not None and not isinstance(machine, MachineInfo):
        raise TypeError(f"{where}: machine must be a MachineInfo or None, got {type(machine).__name__}")
    device = _device(where, device)
    dtypes = dtypes or list(GPU_DTYPES if device.type == "cuda" else DRY_RUN_DTYPES)
    machine = machine or machine_info(device.type)
    clock = _Clock(device)
    # Imported here: it loads Triton, which the CPU benchmark does not need.
    from attn_course.flash.triton_attention import flash_attention

    generator = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for is_causal in causal:
                for n in lengths:
                    started = time.perf_counter()
                    batch, heads = max(1, tokens // n), model_dim // head_dim
                    config = dict(dtype=str(dtype).removeprefix("torch."), head_dim=head_dim, causal=is_causal,
                                  batch=batch, heads=heads, n=n)
                    found = _one_configuration(flash_attention, config, dtype, modes, clock, generator, deadline)
                    clock.empty_cache()
                    for method, results in found.items():
                        for mode, result in results.items():
                            flops = attention_flops(batch, heads, n, head_dim, causal=is_causal, mode=mode)
                            ms = result.milliseconds
                            row = GpuRow(method=method, **config, mode=mode, status=result.status, milliseconds=ms,
                                         tflops=None if ms is None else flops / ms / 1e9,
                                         max_difference=result.max_difference, first_call_s=result.first_call_s,
                                         reason=result.reason, **dataclasses.asdict(machine))
                            rows.append(row)
                            if on_row:
                                on_row(row)
                    if progress:
                        progress(_progress_line(rows[-len(found) * len(modes):], config,
                                                time.perf_counter() - started))
    return rows


def _one_configuration(flash_attention, config, dtype, modes, clock, generator, deadline):
    """{method: {mode: _Measured}} for one (dtype, d, causal, N)."""
    methods = ["ours (Triton)", *SDPA_BACKENDS, "naive"]
    if _past(deadline):
        return {method: _skipped(TIME_BUDGET_SPENT, modes) for method in methods}
    shape = (config["batch"], config["heads"], config["n"], config["head_dim"])
    device, causal, n = clock.device, config["causal"], config["n"]
    try:
        q, k, v, grad_out = (_randn(shape, dtype, device, generator) for _ in range(4))
    except Exception as error:   # out of memory
        return {method: _skipped(_reason(error), modes) for method in methods}
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    try:
        with torch.no_grad():
            reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    except Exception:   # no reference: the rows say nothing about differences
        reference = None
    mask = causal_mask(n, device=device) if causal else None
    functions = {"ours (Triton)": lambda q, k, v: flash_attention(q, k, v, causal=causal),
                 "naive": lambda q, k, v: self_attention(q, k, v, mask)[0]}
    for method in SDPA_BACKENDS:
        functions[method] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    # Naive keeps about five B·H·N·N float32 matrices for its backward (scores, weights, their gradients).
    naive_bytes = 5 * 4 * q.shape[0] * q.shape[1] * n * n
    found = {}
    for method in methods:
        if method == "naive" and n > NAIVE_UP_TO:
            found[method] = _skipped(f"naive is left out above N = {NAIVE_UP_TO}: its N x N float32 matrices "
                                     "take tens of GB and seconds a call; the time goes to the kernels", modes)
            continue
        if method == "naive" and naive_bytes > 0.8 * clock.free_bytes():
            found[method] = _skipped(f"needs about {naive_bytes / 2**30:.0f} GiB for its N x N float32 "
                                     f"matrices, {clock.free_bytes() / 2**30:.0f} GiB free", modes)
            continue
        context = _sdpa_context(method) if method in SDPA_BACKENDS else contextlib.nullcontext()
        with context:
            found[method] = _measure(functions[method], q, k, v, grad_out, reference, modes, clock, deadline)
    return found   # the inputs are freed as this returns; the caller empties the cache


def _progress_line(rows: Sequence[GpuRow], config: dict, seconds: float) -> str:
    modes = list(dict.fromkeys(r.mode for r in rows))
    parts = []
    for method in dict.fromkeys(r.method for r in rows):
        values = [next(r for r in rows if r.method == method and r.mode == mode) for mode in modes]
        parts.append(f"{method} " + "/".join("-" if r.tflops is None else f"{r.tflops:.3g}" for r in values))
    mask = "causal" if config["causal"] else "full"
    return (f"{config['dtype']} d={config['head_dim']} {mask} N={config['n']} (B={config['batch']} "
            f"H={config['heads']}) TFLOP/s {'/'.join(modes)}: " + ", ".join(parts) + f"  [{seconds:.1f} s]")


# --- decoding --------------------------------------------------------------------------------------

def decode_rows(kv_lengths: Sequence[int] = DECODE_KV_LENGTHS, *, query_lengths: Sequence[int] = (1,),
                dtypes: Sequence[torch.dtype] | None = None, batch: int = 4, heads: int = 32, kv_heads: int = 8,
                head_dim: int = 128, seed: int = 0, device: str = "cuda", deadline: float | None = None,
                on_row: Callable[[DecodeRow], None] | None = None, progress: Callable[[str], None] | None = None,
                machine: MachineInfo | None = None) -> list[DecodeRow]:
    """Decoding time and achieved K/V bandwidth: our decode kernel against SDPA's backends.

    Decoding is memory-bound: N_q new queries read the whole cache (K and V, ``2 · B · H_kv ·
    N_k · d`` elements) for ``4 · B · H · N_q · N_k · d`` FLOPs, so the number to compare is the
    bandwidth, reported as the cache's bytes over the time (``kv_gbps``). Ours reads the
    grouped-query K/V in place. SDPA gets them with ``enable_gqa=True`` where this torch has it
    (2.5 and later) and the backend accepts it; otherwise they are expanded to H heads with
    ``repeat_interleave`` once, outside the timing (which favours SDPA: it reads ``H / H_kv``
    times the bytes, but a model would also pay for the copy). Naive attention uses the expanded
    K/V. No mask: the new queries see the whole cache.

    Args:
        kv_lengths: cache lengths N_k, measured in this order.
        query_lengths: N_q values, at most 16 (the decode kernel's range).
        dtypes: floating dtypes; default float16 and bfloat16 on a GPU, float16 and float32 on the CPU.
        batch, heads, kv_heads, head_dim: B, H, H_kv (dividing H) and d.
        seed, device, deadline, on_row, progress, machine: as in :func:`gpu_rows`.

    Returns:
        One :class:`DecodeRow` per (dtype, N_q, N_k, method), in that nesting order.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: empty or non-positive sizes, N_q above 16, ``heads`` not a multiple of
            ``kv_heads``, a negative seed or an unknown device.
        RuntimeError: ``device="cuda"`` without a CUDA GPU.
    """
    where = "decode_rows"
    kv_lengths = _nonempty_ints(where, "kv_lengths", kv_lengths)
    query_lengths = _nonempty_ints(where, "query_lengths", query_lengths)
    for index, n_q in enumerate(query_lengths):
        if n_q > 16:
            raise ValueError(f"{where}: query_lengths[{index}] must be <= 16 (decoding), got {n_q}")
    dtypes = None if dtypes is None else _dtypes(where, dtypes)
    sizes = {name: _validate.integer(where, name, value, minimum=1) for name, value in
             (("batch", batch), ("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim))}
    if sizes["heads"] % sizes["kv_heads"]:
        raise ValueError(f"{where}: heads must be a multiple of kv_heads, got heads={heads}, kv_heads={kv_heads}")
    seed = _validate.integer(where, "seed", seed, minimum=0)
    deadline = _deadline(where, deadline)
    on_row, progress = _callback(where, "on_row", on_row), _callback(where, "progress", progress)
    if machine is not None and not isinstance(machine, MachineInfo):
        raise TypeError(f"{where}: machine must be a MachineInfo or None, got {type(machine).__name__}")
    device = _device(where, device)
    dtypes = dtypes or list(GPU_DTYPES if device.type == "cuda" else DRY_RUN_DTYPES)
    machine = machine or machine_info(device.type)
    clock = _Clock(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for dtype in dtypes:
        for n_q in query_lengths:
            for n_k in kv_lengths:
                started = time.perf_counter()
                config = dict(dtype=str(dtype).removeprefix("torch."), head_dim=head_dim, batch=batch, heads=heads,
                              kv_heads=kv_heads, n_q=n_q, n_k=n_k)
                kv_bytes = 2 * batch * kv_heads * n_k * head_dim * dtype.itemsize
                new = []
                measured = _one_decode(config, dtype, clock, generator, deadline)
                clock.empty_cache()
                for method, layout, result in measured:
                    ms = result.milliseconds
                    row = DecodeRow(method=method, **config, kv_layout=layout, status=result.status,
                                    milliseconds=ms, kv_gbps=None if ms is None else kv_bytes / ms / 1e6,
                                    max_difference=result.max_difference, first_call_s=result.first_call_s,
                                    reason=result.reason, **dataclasses.asdict(machine))
                    new.append(row)
                    if on_row:
                        on_row(row)
                rows += new
                if progress:
                    parts = ", ".join(f"{r.method} " + ("-" if r.kv_gbps is None else f"{r.kv_gbps:.3g}") for r in new)
                    progress(f"decode {config['dtype']} N_q={n_q} N_k={n_k} (B={batch} H={heads} H_kv={kv_heads} "
                             f"d={head_dim}) K/V GB/s: {parts}  [{time.perf_counter() - started:.1f} s]")
    return rows


def _one_decode(config, dtype, clock, generator, deadline):
    """[(method, kv_layout, _Measured)] for one (dtype, N_q, N_k)."""
    ours_name, ours, ours_note = _ours_decode()
    methods = [ours_name, *SDPA_BACKENDS, "naive"]
    expanded_layout = "expanded (repeat_interleave, outside the timing)"
    layouts = {ours_name: "grouped (in place)", "naive": expanded_layout}
    if _past(deadline):
        return [(method, layouts.get(method, ""), _skipped(TIME_BUDGET_SPENT, ["forward"])["forward"])
                for method in methods]
    device = clock.device
    b, h, h_kv, d = config["batch"], config["heads"], config["kv_heads"], config["head_dim"]
    try:
        q = _randn((b, h, config["n_q"], d), dtype, device, generator)
        k, v = (_randn((b, h_kv, config["n_k"], d), dtype, device, generator) for _ in range(2))
        k_wide, v_wide = (t.repeat_interleave(h // h_kv, dim=1) for t in (k, v))     # [B, H, N_k, d]
    except Exception as error:   # out of memory
        return [(method, layouts.get(method, ""), _Measured("skipped", reason=_reason(error))) for method in methods]
    try:
        with torch.no_grad():
            reference = F.scaled_dot_product_attention(q.float(), k_wide.float(), v_wide.float())
    except Exception:
        reference = None
    found = []
    for method in methods:
        note = ours_note if method == ours_name else ""
        if method == ours_name:
            fn = lambda q, k, v: ours(q, k, v)   # noqa: E731
        elif method == "naive":
            fn = lambda q, k, v: self_attention(q, k_wide, v_wide)[0]   # noqa: E731
        else:
            fn, layouts[method], note = _sdpa_decode_function(method, q, k, v, k_wide, v_wide, expanded_layout)
        context = _sdpa_context(method) if method in SDPA_BACKENDS else contextlib.nullcontext()
        with context:
            result = _measure(fn, q, k, v, None, reference, ["forward"], clock, deadline)["forward"]
        if note:
            result = dataclasses.replace(result, reason=f"{result.reason}; {note}" if result.reason else note)
        found.append((method, layouts[method], result))
    return found   # the inputs are freed as this returns; the caller empties the cache


def _sdpa_decode_function(method, q, k, v, k_wide, v_wide, expanded_layout):
    """(fn, kv_layout, note): SDPA on grouped K/V with ``enable_gqa`` if this backend takes it, else expanded."""
    def expanded(q, k, v):
        return F.scaled_dot_product_attention(q, k_wide, v_wide)

    if k.shape[1] == q.shape[1]:
        return expanded, "not grouped", ""
    if not sdpa_has_enable_gqa():
        return expanded, expanded_layout, f"torch {torch.__version__} has no enable_gqa"

    def grouped(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    with _recorded_warnings() as caught:
        try:
            with _sdpa_context(method), torch.no_grad():
                grouped(q, k, v)
        except Exception as error:
            return expanded, expanded_layout, f"enable_gqa=True refused ({_reason(error, caught)[:300]})"
    return grouped, "grouped (enable_gqa=True)", ""


# --- the summary -------------------------------------------------------------------------------

def speedup_summary(rows: Sequence[GpuRow] = (), decode: Sequence[DecodeRow] = (), *,
                    long_from: int = LONG_FROM) -> list[SummaryRow]:
    """Ours against the fastest SDPA backend, per configuration and mode.

    Args:
        rows: rows of :func:`gpu_rows` (may be empty).
        decode: rows of :func:`decode_rows` (may be empty).
        long_from: the N from which the targets apply (forward ≥ 1.0, backward ≥ 0.8).

    Returns:
        One :class:`SummaryRow` per configuration and mode found, in the rows' order (attention
        first); configurations with no measured row at all are left out.

    Raises:
        TypeError: rows of the wrong type, or ``long_from`` not an int.
        ValueError: ``long_from`` below 1.
    """
    where = "speedup_summary"
    rows = _validate.sequence(where, "rows", rows, of="GpuRow")
    rows = check_rows(where, rows, (GpuRow,)) if rows else []
    decode = _validate.sequence(where, "decode", decode, of="DecodeRow")
    decode = check_rows(where, decode, (DecodeRow,)) if decode else []
    long_from = _validate.integer(where, "long_from", long_from, minimum=1)
    summary = []
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(("attention", r.dtype, r.head_dim, r.causal, r.n, r.n, r.mode), []).append(r)
    for r in decode:
        groups.setdefault(("decode", r.dtype, r.head_dim, False, r.n_q, r.n_k, "forward"), []).append(r)
    for key, members in groups.items():
        measured = [r for r in members if r.status == "ok"]
        if not measured:
            continue
        kind, dtype, head_dim, causal, n_q, n_k, mode = key
        ours = next((r for r in measured if r.method.startswith("ours")), None)
        sdpa = [r for r in measured if r.method.startswith("sdpa")]
        best = min(sdpa, key=lambda r: r.milliseconds) if sdpa else None
        ratio = best.milliseconds / ours.milliseconds if ours and best else None
        target = TARGETS.get(mode) if kind == "attention" and n_k >= long_from else None
        note = "" if ratio is not None else ("ours did not run" if not ours else "no SDPA backend ran")
        summary.append(SummaryRow(kind=kind, dtype=dtype, head_dim=head_dim, causal=causal, n_q=n_q, n_k=n_k,
                                  mode=mode, ours_ms=ours.milliseconds if ours else None,
                                  best_sdpa=best.method if best else "",
                                  best_sdpa_ms=best.milliseconds if best else None,
                                  ratio=ratio, target=target,
                                  meets_target=None if target is None or ratio is None else ratio >= target,
                                  note=note, **{f.name: getattr(members[0], f.name) for f in
                                                dataclasses.fields(MachineInfo)}))
    return summary


def print_summary(summary: Sequence[SummaryRow]) -> None:
    """Print :func:`speedup_summary`'s rows as a table, then how many targets were met.

    Args:
        summary: a non-empty sequence of :class:`SummaryRow`.

    Raises:
        TypeError: not a sequence of :class:`SummaryRow`.
        ValueError: no rows.
    """
    summary = check_rows("print_summary", summary, (SummaryRow,))

    def number(value, form):
        return "-" if value is None else format(value, form)

    print(f"{'kind':>9} {'dtype':>8} {'d':>4} {'causal':>6} {'N_q':>5} {'N_k':>6} {'mode':>16} {'ours ms':>9} "
          f"{'best SDPA':>14} {'SDPA ms':>9} {'ours/SDPA':>9} {'target':>6}")
    for r in summary:
        verdict = "" if r.meets_target is None else (" ok" if r.meets_target else " MISSED")
        print(f"{r.kind:>9} {r.dtype:>8} {r.head_dim:>4} {str(r.causal):>6} {r.n_q:>5} {r.n_k:>6} {r.mode:>16} "
              f"{number(r.ours_ms, '9.3f')} {r.best_sdpa or '-':>14} {number(r.best_sdpa_ms, '9.3f')} "
              f"{number(r.ratio, '8.2f')}x {number(r.target, '6.1f')}{verdict}")
    for mode, target in TARGETS.items():
        judged = [r for r in summary if r.mode == mode and r.meets_target is not None]
        if judged:
            met = sum(r.meets_target for r in judged)
            worst = min(judged, key=lambda r: r.ratio)
            print(f"{mode}: ours >= {target}x SDPA's best in {met} of {len(judged)} configurations with a target "
                  f"(worst {worst.ratio:.2f}x: {worst.dtype} d={worst.head_dim} causal={worst.causal} N={worst.n_k})")


# --- the plot ----------------------------------------------------------------------------------

def plot_gpu_rows(rows: Sequence[GpuRow] | Sequence[DecodeRow], path: str | os.PathLike, *, title: str) -> None:
    """Save a PNG of :func:`gpu_rows` (TFLOP/s against N, one panel per dtype, d, mask and mode)
    or :func:`decode_rows` (K/V GB/s against N_k, one panel per dtype and N_q). Skipped rows
    are left out.

    Args:
        rows: a non-empty sequence of :class:`GpuRow`, or one of :class:`DecodeRow`.
        path: the PNG file to write.
        title: the figure's title; name the machine (:meth:`MachineInfo.title`).

    Raises:
        TypeError: rows of mixed or other types, ``path`` not a path, ``title`` not a str.
        ValueError: no rows.
        ImportError: matplotlib is not installed.
    """
    where = "plot_gpu_rows"
    rows = check_rows(where, rows, (GpuRow, DecodeRow))
    path = _validate.path(where, "path", path)
    if not isinstance(title, str):
        raise TypeError(f"{where}: title must be a str, got {type(title).__name__}")
    import matplotlib  # here, not at the top: a bare GPU image may lack it, and the CSV suffices

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    decode = isinstance(rows[0], DecodeRow)
    if decode:
        def panel_of(r):
            return (r.dtype, r.n_q)
        x_of, y_of, ylabel, xlabel = (lambda r: r.n_k), (lambda r: r.kv_gbps), "K/V GB/s", "N_k (KV cache length)"
    else:
        def panel_of(r):
            return (r.dtype, r.head_dim, r.causal, r.mode)
        x_of, y_of, ylabel, xlabel = (lambda r: r.n), (lambda r: r.tflops), "TFLOP/s", "N"
    panels = list(dict.fromkeys(panel_of(r) for r in rows))
    columns = min(len(panels), 2 if decode else 3)
    height = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(height, columns, squeeze=False, figsize=(4.5 * columns, 3.2 * height + 0.6))
    for axis, panel in zip(axes.flat, panels):
        chosen = [r for r in rows if panel_of(r) == panel and r.status == "ok"]
        for method in dict.fromkeys(r.method for r in chosen):
            points = sorted((x_of(r), y_of(r)) for r in chosen if r.method == method)
            axis.plot(*zip(*points), marker="o", label=method)
        if decode:
            name = f"{panel[0]} N_q={panel[1]}"
        else:
            name = f"{panel[0]} d={panel[1]} {'causal' if panel[2] else 'full'} {panel[3]}"
        axis.set_xscale("log", base=2)
        ticks = sorted({x_of(r) for r in rows})
        axis.set_xticks(ticks, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks], fontsize=7)
        axis.xaxis.set_minor_formatter(NullFormatter())
        axis.set(xlabel=xlabel, ylabel=ylabel, title=name)
        axis.title.set_fontsize(9)
        if chosen:
            axis.legend(fontsize=6)
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


# --- warming Triton's cache in parallel -------------------------------------------------------------

def _warm_up_jobs(sizes: dict, dry_run: bool) -> list[dict]:
    """One job per kernel specialization the run will need: (dtype, d, causal) for attention and one per
    dtype for decoding. The dry run warms only the first, to run the code, not to save time."""
    device = "cpu" if dry_run else "cuda"
    n = 64 if dry_run else 1024            # a multiple of 16, like every N measured: the same specialization
    jobs = [dict(kind="attention", dtype=str(dtype).removeprefix("torch."), head_dim=d, causal=causal, n=n,
                 heads=sizes["model_dim"] // d, device=device)
            for dtype in sizes["dtypes"] for d in sizes["head_dims"] for causal in (False, True)]
    decode = sizes["decode"]
    decoding = [dict(kind="decode", dtype=str(dtype).removeprefix("torch."), head_dim=decode["head_dim"],
                     causal=False, n=decode["kv_lengths"][0], heads=decode["heads"], kv_heads=decode["kv_heads"],
                     batch=decode["batch"], device=device) for dtype in sizes["dtypes"]]
    return jobs[:1] if dry_run else jobs + decoding


def _warm_up(job: dict) -> None:
    """Run one warm-up job (in its own process): the kernels compile, and the autotuner compiles
    every candidate, into Triton's on-disk cache, where the benchmark's process finds them."""
    from attn_course.flash import triton_attention

    dtype, device, d = getattr(torch, job["dtype"]), job["device"], job["head_dim"]
    if job["kind"] == "attention":
        q, k, v = (torch.randn(1, job["heads"], job["n"], d, dtype=dtype, device=device, requires_grad=True)
                   for _ in range(3))
        out = triton_attention.flash_attention(q, k, v, causal=job["causal"])
        out.backward(torch.randn_like(out))
    else:
        _, decode, _ = _ours_decode()
        k, v = (torch.randn(job["batch"], job["kv_heads"], job["n"], d, dtype=dtype, device=device) for _ in range(2))
        for n_q in DECODE_QUERY_LENGTHS:
            decode(torch.randn(job["batch"], job["heads"], n_q, d, dtype=dtype, device=device), k, v)
    if device == "cuda":
        torch.cuda.synchronize()


def _warm_triton_cache(jobs: list[dict], *, timeout_s: float, interpret: bool) -> dict:
    """Run the warm-up jobs in parallel processes (compiling is single-threaded and CPU-bound;
    a GPU machine has cores to spare). Failures are reported, never raised: it is only a warm-up."""
    started = time.monotonic()
    # The same environment as this process (Triton's cache key includes some TRITON_* variables),
    # but for the dry run's interpreter.
    env = {**os.environ, "TRITON_INTERPRET": "1"} if interpret else dict(os.environ)
    processes = [subprocess.Popen([sys.executable, "-m", "benchmarks.flash_gpu", "--warm-up", json.dumps(job)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                 for job in jobs]
    failures = []
    try:
        for job, process in zip(jobs, processes):
            try:
                output, _ = process.communicate(timeout=max(1.0, timeout_s - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate()
                failures.append(f"{job}: timed out after {timeout_s:.0f} s")
                continue
            if process.returncode:
                last = (output or "").strip().splitlines()[-1:] or ["no output"]
                failures.append(f"{job}: exit status {process.returncode}: {last[0][:300]}")
    finally:   # SIGTERM while waiting: leave no warm-up process behind
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return {"jobs": len(jobs), "seconds": round(time.monotonic() - started, 1), "failures": failures}


# --- the whole run -----------------------------------------------------------------------------

class _Terminated(BaseException):
    """SIGTERM (``timeout``) during the run: stop measuring, write what there is."""


class _CsvStream:
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


@dataclasses.dataclass
class GpuBenchmarkResult:
    """What :func:`run_gpu_benchmark` measured and wrote.

    Attributes:
        rows, decode, summary: the :class:`GpuRow`, :class:`DecodeRow` and :class:`SummaryRow` lists.
        files: name → path of every file written (``"rows"``, ``"decode"``, ``"summary"``, ``"machine"``,
            ``"plot"``, ``"decode_plot"``; plots only where matplotlib is installed).
        seconds: the run's wall-clock time.
        stopped: ``""`` when everything planned was attempted, ``"max_minutes"`` when the time budget
            left measurements out, ``"SIGTERM"`` when the run was terminated.
    """

    rows: list
    decode: list
    summary: list
    files: dict
    seconds: float
    stopped: str


def _plan(sizes: dict, lengths: Sequence[int] | None) -> list[tuple[str, dict]]:
    """The measurements in order of importance: long sequences in the first dtype (both d, both
    masks, all modes), decoding at N_q = 1, the second dtype, decoding at N_q = 16 and in the
    second dtype, and the short sequences last."""
    lengths = list(lengths or sizes["lengths"])
    long = [n for n in lengths if n >= sizes["long_from"]]
    short = [n for n in lengths if n < sizes["long_from"]]
    first, *others = sizes["dtypes"]
    phases = [("attention", dict(dtypes=[first], lengths=long)),
              ("decode", dict(dtypes=[first], query_lengths=[1]))]
    phases += [("attention", dict(dtypes=others, lengths=long))]
    phases += [("decode", dict(dtypes=[first], query_lengths=[16])),
               ("decode", dict(dtypes=others, query_lengths=list(DECODE_QUERY_LENGTHS)))]
    phases += [("attention", dict(dtypes=list(sizes["dtypes"]), lengths=short))]
    return [(kind, options) for kind, options in phases if options["dtypes"] and options.get("lengths", [1])]


def run_gpu_benchmark(out: str | os.PathLike, *, lengths: Sequence[int] | None = None, dry_run: bool = False,
                      max_minutes: float | None = None, decode: bool = True, warm_up: bool = True,
                      progress: Callable[[str], None] | None = print) -> GpuBenchmarkResult:
    """The whole GPU benchmark, most important measurements first, each row written as measured.

    Writes into ``out``: ``flash-gpu.csv`` (:class:`GpuRow`), ``flash-gpu-decode.csv``
    (:class:`DecodeRow`), ``flash-gpu-summary.csv`` (:class:`SummaryRow`, rewritten after each
    phase), ``machine.json`` (the machine, the plan, the timer and how the run ended) and the
    plots ``flash-gpu.png`` and ``flash-gpu-decode.png`` (if matplotlib is installed). After
    ``max_minutes`` no new measurement starts (the one under way finishes: allow a minute
    more); SIGTERM, as from ``timeout``, stops the run the same way and the summary and
    plots are still written.

    Cost on an H200 (estimate, not yet measured): ours has 2 or 3 autotuning candidates per kernel,
    so about 60 compilations of a few seconds each, done first in parallel (:func:`_warm_triton_cache`,
    about 30 s with 10 processes); the autotuner then times the candidates once per N (about 1 s
    per configuration); then 48 configurations × 5 methods × 3 modes of ``do_bench`` at 0.05 to
    1 s each, and 28 decoding configurations × 5 methods: about 4 minutes in all. The budget
    cuts whatever does not fit, short N last.

    Args:
        out: the folder for the files (created if missing).
        lengths: sequence lengths N for the attention rows (default: 512 … 16384; the dry run's 64, 128).
        dry_run: run on the CPU at tiny sizes (:data:`DRY_RUN`): the kernels in Triton's
            interpreter, float16 and float32, a wall-clock timer.
        max_minutes: the time budget, > 0; None: no limit.
        decode: also run :func:`decode_rows`.
        warm_up: first compile the kernels into Triton's on-disk cache in parallel processes, one
            per (dtype, d, causal) and per dtype for decoding (at most 120 s, inside the budget;
            a failure there is reported in ``machine.json``, not raised).
        progress: called with each line of progress text (None: silent).

    Returns:
        A :class:`GpuBenchmarkResult`.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a non-positive ``max_minutes`` or length.
        RuntimeError: no CUDA GPU and not ``dry_run``.
    """
    where = "run_gpu_benchmark"
    out = _validate.path(where, "out", out)
    if lengths is not None:
        lengths = _nonempty_ints(where, "lengths", lengths)
    dry_run = _validate.boolean(where, "dry_run", dry_run)
    decode = _validate.boolean(where, "decode", decode)
    warm_up = _validate.boolean(where, "warm_up", warm_up)
    if max_minutes is not None:
        max_minutes = _validate.positive_finite(where, "max_minutes", max_minutes)
    progress = _callback(where, "progress", progress) or (lambda line: None)
    device = _device(where, "cpu" if dry_run else "cuda")
    sizes = DRY_RUN if dry_run else GPU_SIZES
    started, started_at = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    deadline = None if max_minutes is None else started + 60 * max_minutes
    machine = machine_info(device.type)
    out.mkdir(parents=True, exist_ok=True)
    files = {"rows": out / "flash-gpu.csv", "decode": out / "flash-gpu-decode.csv",
             "summary": out / "flash-gpu-summary.csv", "machine": out / "machine.json"}
    streams = {"rows": _CsvStream(files["rows"], GpuRow), "decode": _CsvStream(files["decode"], DecodeRow)}
    plan = _plan(sizes, lengths)
    if not decode:
        plan = [phase for phase in plan if phase[0] != "decode"]
    rows, decode_found, summary = [], [], []
    facts = {"machine": dataclasses.asdict(machine), **_machine_facts(device), "dry_run": dry_run,
             "timer": _Clock(device).name, "max_minutes": max_minutes, "started": started_at,
             "plan": [{"kind": kind, **{k: [str(x) for x in v] if k == "dtypes" else v for k, v in options.items()}}
                      for kind, options in plan],
             "sizes": {k: v for k, v in sizes.items() if k not in ("dtypes", "lengths")}}
    progress(f"# {machine.title()}; timer: {facts['timer']}; budget: "
             f"{'none' if max_minutes is None else f'{max_minutes:g} min'}")

    def write_summary(stopped: str) -> None:
        nonlocal summary
        summary = speedup_summary(rows, decode_found, long_from=sizes["long_from"])
        with open(files["summary"], "w", newline="") as handle:   # the header alone when nothing ran yet
            writer = csv.DictWriter(handle, fieldnames=[f.name for f in dataclasses.fields(SummaryRow)])
            writer.writeheader()
            writer.writerows(dataclasses.asdict(r) for r in summary)
        facts.update(stopped=stopped, seconds=round(time.monotonic() - started, 1),
                     measured=sum(r.status == "ok" for r in rows + decode_found),
                     skipped=sum(r.status != "ok" for r in rows + decode_found),
                     not_reached=sum(r.reason == TIME_BUDGET_SPENT for r in rows + decode_found))
        files["machine"].write_text(json.dumps(facts, indent=2, default=str) + "\n")

    def on_term(signum, frame):
        raise _Terminated()

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if in_main_thread else None
    stopped = ""
    try:
        if warm_up:
            jobs = _warm_up_jobs(sizes, dry_run)
            progress(f"## warming Triton's cache: {len(jobs)} processes at once (at most {WARM_UP_SECONDS} s)")
            facts["warm_up"] = _warm_triton_cache(jobs, timeout_s=WARM_UP_SECONDS, interpret=dry_run)
            progress(f"warm-up: {facts['warm_up']['seconds']} s, "
                     f"{len(facts['warm_up']['failures'])} failed" + "".join(
                         f"\n  {failure}" for failure in facts["warm_up"]["failures"]))
        for index, (kind, options) in enumerate(plan, 1):
            common = dict(device=device.type, deadline=deadline, progress=progress, machine=machine)
            progress(f"## phase {index}/{len(plan)}: {kind} {options}  "
                     f"[{time.monotonic() - started:.0f} s so far]".replace("torch.", ""))
            if kind == "attention":
                rows += gpu_rows(options["lengths"], dtypes=options["dtypes"], head_dims=sizes["head_dims"],
                                 tokens=sizes["tokens"], model_dim=sizes["model_dim"], on_row=streams["rows"].write,
                                 seed=index, **common)
            else:
                decode_found += decode_rows(sizes["decode"]["kv_lengths"], query_lengths=options["query_lengths"],
                                            dtypes=options["dtypes"], on_row=streams["decode"].write, seed=index,
                                            **{k: v for k, v in sizes["decode"].items() if k != "kv_lengths"},
                                            **common)
            write_summary("running")
        if any(r.reason == TIME_BUDGET_SPENT for r in rows + decode_found):
            stopped = "max_minutes"
    except _Terminated:
        stopped = "SIGTERM"
        progress("terminated (SIGTERM): writing the summary and plots of what was measured")
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
        for stream in streams.values():
            stream.close()
    write_summary(stopped or "complete")
    if summary:
        print_summary(summary)
    title = f"FlashAttention benchmark{' (CPU dry run)' if dry_run else ''}: {machine.title()}"
    for name, found in (("plot", rows), ("decode_plot", decode_found)):
        if not found:
            continue
        path = out / ("flash-gpu.png" if name == "plot" else "flash-gpu-decode.png")
        try:
            plot_gpu_rows(found, path, title=title)
        except ImportError:   # a bare GPU image may lack matplotlib; the CSVs hold the numbers
            progress("matplotlib is not installed: no plot")
            break
        files[name] = path
    seconds = time.monotonic() - started
    if stopped == "max_minutes":
        progress(f"stopped by max_minutes={max_minutes:g}: {facts['not_reached']} rows not measured "
                 "(status 'skipped', reason 'time budget ...')")
    progress(f"# {facts['measured']} rows measured, {facts['skipped']} skipped, in {seconds:.0f} s; wrote "
             + ", ".join(str(path) for path in files.values()))
    return GpuBenchmarkResult(rows=rows, decode=decode_found, summary=summary, files=files, seconds=seconds,
                              stopped=stopped)


# python -m benchmarks.flash_gpu --warm-up JOB: one of _warm_triton_cache's processes.
if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--warm-up":
        sys.exit("usage: python -m benchmarks.flash_gpu --warm-up JOB_JSON (run by run_gpu_benchmark)")
    _warm_up(json.loads(sys.argv[2]))
