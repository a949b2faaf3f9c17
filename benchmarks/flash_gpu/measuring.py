"""Measuring one method in each mode: a skipped row with the reason, never a crash."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch

from benchmarks.flash_gpu.budget import TIME_BUDGET_SPENT, past
from benchmarks.flash_gpu.clock import Clock

__all__ = ["Measured", "describe_error", "measure", "recorded_warnings", "skipped"]


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
    """Time ``fn(q, k, v)`` in each mode; never raises for what ``fn`` raises (the row says it).
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
            elif mode == "forward+backward":
                def call():
                    torch.autograd.grad(fn(q, k, v), inputs, grad_out)
            else:
                raise ValueError(f"unknown mode {mode!r}")
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
