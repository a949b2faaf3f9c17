"""The course's one timer: library timers on the CPU (:mod:`timeit`, ``torch.utils.benchmark``) and on a GPU
(``triton.testing.do_bench``), and the machine they ran on. Nothing here asserts a speed."""

from __future__ import annotations

import gc
import inspect
import platform
import time
import timeit
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.benchmark as torch_benchmark

from attn_course import _validate

__all__ = ["DO_BENCH_OPTIONS", "best_time", "gpu_milliseconds", "gpu_timer_name", "machine_description", "timed"]

DO_BENCH_OPTIONS = {"warmup": 5, "rep": 25, "return_mode": "median"}   # milliseconds of warm-up, of timing
# The garbage collector stays on, as in the code being measured (timeit switches it off by default):
# a measurement under peak_memory must see storages freed when they would be.
_SETUP = "gc.enable(); arguments = prepare()"


def _timers(fn: Callable, setup: Callable[[], object] | None) -> tuple[timeit.Timer, torch_benchmark.Timer]:
    """Both timers for ``fn()`` (or ``fn(setup())``, ``setup`` untimed), sharing one namespace."""
    namespace = {"fn": fn, "prepare": (lambda: ()) if setup is None else (lambda: (setup(),)), "gc": gc}
    single = timeit.Timer("fn(*arguments)", _SETUP, globals=namespace)
    # num_threads: torch's Timer would switch to one thread by default; the caller chose already.
    blocks = torch_benchmark.Timer("fn(*arguments)", _SETUP, globals=namespace, num_threads=torch.get_num_threads())
    return single, blocks


def best_time(fn: Callable[..., object], repeats: int = 1, *, setup: Callable[[], object] | None = None,
              budget_s: float = 0.0) -> float:
    """The shortest time of one call of ``fn``, in seconds, from at least ``repeats`` timed calls.

    The minimum, not the mean: noise from other processes only ever adds time. ``repeats`` single calls are
    timed first (:meth:`timeit.Timer.repeat`, ``number=1``); if they took less than ``budget_s``,
    :meth:`torch.utils.benchmark.Timer.blocked_autorange` (a warm-up, then blocks long enough that the clock's
    overhead does not count) samples for the rest of the budget. With ``setup``, the budget goes to more
    single calls.

    Args:
        fn: called as ``fn()``, or ``fn(setup())`` when ``setup`` is given.
        repeats: single calls to time, at least 1 (exactly this many when ``budget_s`` is 0).
        setup: called untimed before every timed call; its result is ``fn``'s argument (for a step that
            changes what it runs on, such as a cache it appends to).
        budget_s: seconds, ``>= 0``, within which more calls are timed.

    Returns:
        The best time of one call, in seconds.

    Raises:
        TypeError: ``fn`` or ``setup`` not callable, ``repeats`` not an int, ``budget_s`` not a number.
        ValueError: ``repeats`` below 1, ``budget_s`` negative or not finite.

    Example:
        >>> best_time(lambda: sum(range(1000)), repeats=3) > 0
        True
        >>> calls = []
        >>> best_time(calls.append, 2, setup=lambda: "fresh") > 0 and calls
        ['fresh', 'fresh']
    """
    where = "best_time"
    if not callable(fn):
        raise TypeError(f"{where}: fn must be callable, got {type(fn).__name__}")
    if setup is not None and not callable(setup):
        raise TypeError(f"{where}: setup must be callable or None, got {type(setup).__name__}")
    repeats = _validate.integer(where, "repeats", repeats, minimum=1)
    budget_s = _validate.seconds(where, "budget_s", budget_s)
    single, blocks = _timers(fn, setup)
    samples = single.repeat(repeat=repeats, number=1)
    left = budget_s - sum(samples)
    if left > 0 and setup is None:
        samples += blocks.blocked_autorange(min_run_time=left).times        # seconds per call, block by block
    spent = sum(samples)
    while setup is not None and spent < budget_s:
        samples += single.repeat(repeat=1, number=1)
        spent += samples[-1]
    return min(samples)


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Call ``fn(*args, **kwargs)`` once; return its result and the wall-clock seconds it took (for what runs
    once: a first call where Triton compiles, a whole run; :func:`best_time` benchmarks).

    Raises:
        TypeError: ``fn`` is not callable.

    Example:
        >>> result, seconds = timed(sum, range(10))
        >>> result, seconds >= 0
        (45, True)
    """
    if not callable(fn):
        raise TypeError(f"timed: fn must be callable, got {type(fn).__name__}")
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def _do_bench() -> tuple[Callable[..., Any], dict[str, Any]]:
    from triton.testing import do_bench  # here: importing Triton is slow, and only a GPU can run do_bench

    accepted = inspect.signature(do_bench).parameters
    return do_bench, {name: value for name, value in DO_BENCH_OPTIONS.items() if name in accepted}


def gpu_milliseconds(fn: Callable[[], object]) -> float:
    """Milliseconds of one call of ``fn()`` on a CUDA GPU: ``triton.testing.do_bench`` (CUDA events, the L2 cache
    flushed between calls, as Triton's tutorials time kernels) with :data:`DO_BENCH_OPTIONS` (the options this
    Triton takes). Needs a CUDA GPU: Triton's interpreter has no driver to time with ("0 active drivers").

    Returns:
        The median time of one call, in milliseconds.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"gpu_milliseconds: fn must be callable, got {type(fn).__name__}")
    do_bench, options = _do_bench()
    result = do_bench(fn, **options)
    # Old Triton versions returned (median, low, high) percentiles.
    return float(result[0] if isinstance(result, (tuple, list)) else result)


def gpu_timer_name() -> str:
    """How :func:`gpu_milliseconds` times, for a run's record: e.g. ``"triton.testing.do_bench(warmup=5, ...)"``."""
    _, options = _do_bench()
    return f"triton.testing.do_bench({', '.join(f'{k}={v!r}' for k, v in options.items())})"


def machine_description() -> str:
    """The processor or GPU, torch and Triton versions, e.g. ``"x86_64 CPU, 2 threads; torch 2.13.0; Triton 3.5.0"``."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:   # pragma: no cover - Triton is a Linux-only dependency
        triton_version = "not installed"
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        device = f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"
    return f"{device}; torch {torch.__version__}; Triton {triton_version}"
