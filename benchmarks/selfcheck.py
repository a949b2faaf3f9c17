"""``python -m benchmarks.selfcheck [cuda|cpu]``: the Triton kernels against float64, without pytest.

For a GPU machine that has torch and Triton but not pytest (``tools/gpu_check.sh`` runs this there
instead of the kernel tests). Each case runs :func:`~attn_course.flash.flash_attention` forward and
backward (or ``decode_attention`` forward) and judges it by the FlashAttention rule the kernel tests and
chapter 07 use (:func:`attn_course.flash.accuracy.flash_rule`: the kernel's error against float64 at most
a factor times plain attention's in the same dtype, plus a small floor). Exit status 0 when every case
passes, 1 otherwise.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from collections.abc import Callable

import torch

from attn_course import _validate
from attn_course.flash import decode_attention, flash_attention
from attn_course.flash.accuracy import FLOORS, flash_rule

__all__ = ["CaseResult", "cases", "main", "run_case", "selfcheck"]


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """One case of :func:`selfcheck`: per quantity (``"output"``, ``"dq"``, ``"dk"``, ``"dv"``) the kernel's
    largest difference from float64 (``errors``) and what the rule allows; ``error``: what the kernel raised."""

    name: str
    errors: dict
    allowed: dict
    seconds: float
    error: str = ""

    @property
    def passed(self) -> bool:
        return not self.error and all(self.errors[q] <= self.allowed[q] for q in self.errors)


def run_case(fn: Callable, *, batch: int, heads: int, kv_heads: int, n_q: int, n_k: int, head_dim: int,
             dtype: torch.dtype, causal: bool, backward: bool, device: str, name: str, seed: int = 0) -> CaseResult:
    """Run ``fn(q, k, v, causal=...)`` on random inputs and judge it by the FlashAttention rule.

    Args:
        fn: the attention to judge, e.g. :func:`~attn_course.flash.flash_attention`.
        batch, heads, kv_heads, n_q, n_k, head_dim: of ``q [B, H, N_q, d]`` and ``k``, ``v`` ``[B, H_kv, N_k, d]``.
        dtype: the inputs' dtype (one with a floor in :mod:`attn_course.flash.accuracy`).
        causal, backward: a bottom-right causal mask; judge the gradients too.
        device, name: ``"cuda"`` or ``"cpu"``; the case's label.
        seed: for the inputs (drawn in float64, then cast; the reference sees the cast values).

    Returns:
        A :class:`CaseResult` (an exception from ``fn`` is recorded in it, not raised).

    Raises:
        TypeError: ``fn`` not callable, a size not an int, a flag not a bool, ``dtype`` without a floor.
        ValueError: a size below 1, ``heads`` not a multiple of ``kv_heads``, or an unknown device.
    """
    where = "run_case"
    if not callable(fn):
        raise TypeError(f"{where}: fn must be callable, got {type(fn).__name__}")
    _validate.integers(where, minimum=1, batch=batch, heads=heads, kv_heads=kv_heads, n_q=n_q, n_k=n_k,
                       head_dim=head_dim)
    causal, backward = _validate.boolean(where, "causal", causal), _validate.boolean(where, "backward", backward)
    if device not in ("cuda", "cpu"):
        raise ValueError(f"{where}: device must be 'cuda' or 'cpu', got {device!r}")
    if dtype not in FLOORS:
        raise TypeError(f"run_case: dtype must be one of {list(FLOORS)}, got {dtype!r}")
    if heads % kv_heads:
        raise ValueError(f"run_case: heads must be a multiple of kv_heads, got {heads} and {kv_heads}")
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads, n_q, head_dim), (batch, kv_heads, n_k, head_dim), (batch, kv_heads, n_k, head_dim),
              (batch, heads, n_q, head_dim)]
    q, k, v, grad_out = (torch.randn(*shape, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)
                         for shape in shapes)

    def judged(q, k, v, *, causal, scale):     # scale is the rule's default, None: fn's own default
        return fn(q, k, v, causal=causal)

    start = time.perf_counter()
    try:
        checks = flash_rule(judged, q, k, v, grad_out if backward else None, causal=causal)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as error:   # the check reports it; the next case still runs
        text = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        return CaseResult(name, {}, {}, time.perf_counter() - start, f"{type(error).__name__}: {text}")
    seconds = time.perf_counter() - start
    errors = {check.quantity: float("inf") if check.error != check.error else check.error   # NaN fails
              for check in checks}
    return CaseResult(name, errors, {check.quantity: check.allowed for check in checks}, seconds)


def cases(device: str) -> list[dict]:
    """The cases :func:`selfcheck` runs on ``device`` (``"cuda"``: larger, in half precisions; ``"cpu"``):
    keyword arguments for :func:`run_case` without ``fn``, plus ``"kernel"`` (``"flash"`` or ``"decode"``).

    Raises:
        ValueError: another device.
    """
    if device not in ("cuda", "cpu"):
        raise ValueError(f"cases: device must be 'cuda' or 'cpu', got {device!r}")
    gpu = device == "cuda"
    dtypes = (torch.float16, torch.bfloat16) if gpu else (torch.float16, torch.float32)
    head_dims = (64, 128) if gpu else (64,)
    n = 1030 if gpu else 130
    shapes = [("flash", 2, 4, 4, n, n), ("flash", 1, 8, 2, n // 2 + 3, n // 2 + 3), ("flash", 1, 4, 1, n // 3, n)]
    shapes += [("decode", 2, 8, 2, n_q, 8192 + 5 if gpu else 300) for n_q in (1, 16)]
    found = []
    for dtype, head_dim, causal, (kernel, batch, heads, kv_heads, n_q, n_k) in itertools.product(
            dtypes, head_dims, (False, True), shapes):
        name = (f"{kernel} {str(dtype).removeprefix('torch.')} d={head_dim} B={batch} H={heads} H_kv={kv_heads} "
                f"N_q={n_q} N_k={n_k} {'causal' if causal else 'full'}")
        found.append(dict(kernel=kernel, batch=batch, heads=heads, kv_heads=kv_heads, n_q=n_q, n_k=n_k,
                          head_dim=head_dim, dtype=dtype, causal=causal, backward=kernel == "flash", name=name))
    return found


def selfcheck(device: str | None = None, *, report: Callable[[str], None] | None = print) -> list[CaseResult]:
    """Run every case of :func:`cases` on ``device`` (default: ``"cuda"`` when there is a GPU), calling
    ``report`` with a line each (None: silent); a :class:`CaseResult` per case.

    Raises:
        ValueError: an unknown device.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    report = report or (lambda line: None)
    results = []
    for case in cases(device):
        fn = flash_attention if case.pop("kernel") == "flash" else decode_attention
        result = run_case(fn, device=device, **case)
        results.append(result)
        if result.error:
            report(f"FAIL {result.name}: raised {result.error}")
        else:
            worst = ", ".join(f"{q} {result.errors[q]:.1e} (<= {result.allowed[q]:.1e})" for q in result.errors)
            report(f"{'PASS' if result.passed else 'FAIL'} {result.name}: {worst}  [{result.seconds:.2f} s]")
    failed = sum(not r.passed for r in results)
    report(f"{len(results) - failed} of {len(results)} cases passed on {device}")
    return results


def main() -> int:
    """The command line: 0 when every case passed, 1 otherwise, 2 for a bad argument."""
    arguments = sys.argv[1:]
    if len(arguments) > 1 or (arguments and arguments[0] not in ("cuda", "cpu")):
        print("usage: python -m benchmarks.selfcheck [cuda|cpu]", file=sys.stderr)
        return 2
    results = selfcheck(arguments[0] if arguments else None, report=lambda line: print(line, flush=True))
    return 0 if results and all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
