"""``python -m benchmarks.selfcheck``: the Triton kernels against float64, without pytest.

For a machine that has torch and Triton but not pytest (``tools/gpu_check.sh`` runs this
instead of the kernel tests there, rather than skipping them). Each case runs
:func:`~attn_course.flash.flash_attention` forward and backward (and ``decode_attention``
forward) and judges the output and the gradients by the
FlashAttention rule, :func:`attn_course.flash.accuracy.flash_rule`, the one the kernel tests
and chapter 07 use: the kernel's error against float64 at most ``factor`` times the error of
plain attention in the same dtype, plus a small floor. Its reference,
:func:`~attn_course.flash.accuracy.plain_attention` (grouped-query heads, bottom-right causal),
is independent of the kernels.

Exit status 0 when every case passes, 1 otherwise.
"""

from __future__ import annotations

import dataclasses
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
    """One case of :func:`selfcheck`.

    Attributes:
        name: what was run, e.g. ``"flash float16 d=64 B=2 H=8 H_kv=2 N_q=300 N_k=300 causal"``.
        errors: quantity (``"output"``, ``"dq"``, ``"dk"``, ``"dv"``) → the kernel's largest
            absolute difference from float64.
        allowed: quantity → ``factor · (plain attention's error in the same dtype) + floor``.
        seconds: wall-clock time of the case (the kernel, and the references it is judged against).
        error: the exception's text if the kernel raised, else ``""``.
    """

    name: str
    errors: dict
    allowed: dict
    seconds: float
    error: str = ""

    @property
    def passed(self) -> bool:
        """Whether the kernel ran and every quantity is within the rule."""
        return not self.error and all(self.errors[q] <= self.allowed[q] for q in self.errors)


def run_case(fn: Callable, *, batch: int, heads: int, kv_heads: int, n_q: int, n_k: int, head_dim: int,
             dtype: torch.dtype, causal: bool, backward: bool, device: str, name: str, seed: int = 0) -> CaseResult:
    """Run ``fn(q, k, v, causal=...)`` on random inputs and judge it by the FlashAttention rule.

    Args:
        fn: the attention to judge, e.g. :func:`~attn_course.flash.flash_attention`.
        batch, heads, kv_heads, n_q, n_k, head_dim: B, H, H_kv, N_q, N_k and d of ``q [B, H, N_q, d]``
            and ``k``, ``v`` ``[B, H_kv, N_k, d]``.
        dtype: the inputs' dtype (one of the floors of :mod:`attn_course.flash.accuracy`).
        causal: bottom-right causal mask.
        backward: also judge the gradients.
        device: ``"cuda"`` or ``"cpu"``.
        name: the case's label.
        seed: for the inputs (drawn in float64 on the CPU, then cast and moved; the float64
            reference sees the cast values).

    Returns:
        A :class:`CaseResult` (an exception from ``fn`` is recorded in it, not raised).

    Raises:
        TypeError: ``fn`` not callable, a size not an int, ``causal``/``backward`` not a bool, or
            ``dtype`` without a floor.
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
    """The cases :func:`selfcheck` runs: larger and in half precisions on a GPU, small on the CPU.

    Args:
        device: ``"cuda"`` or ``"cpu"``.

    Returns:
        Keyword arguments for :func:`run_case`, without ``fn``, plus ``"kernel"``: ``"flash"``
        or ``"decode"``.

    Raises:
        ValueError: another device.
    """
    if device not in ("cuda", "cpu"):
        raise ValueError(f"cases: device must be 'cuda' or 'cpu', got {device!r}")
    gpu = device == "cuda"
    dtypes = (torch.float16, torch.bfloat16) if gpu else (torch.float16, torch.float32)
    head_dims = (64, 128) if gpu else (64,)
    n = 1030 if gpu else 130
    found = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for causal in (False, True):
                shapes = [(2, 4, 4, n, n), (1, 8, 2, n // 2 + 3, n // 2 + 3), (1, 4, 1, n // 3, n)]
                for batch, heads, kv_heads, n_q, n_k in shapes:
                    found.append(dict(kernel="flash", batch=batch, heads=heads, kv_heads=kv_heads, n_q=n_q, n_k=n_k,
                                      head_dim=head_dim, dtype=dtype, causal=causal, backward=True))
                for n_q in (1, 16):
                    found.append(dict(kernel="decode", batch=2, heads=8, kv_heads=2, n_q=n_q,
                                      n_k=8192 + 5 if gpu else 300, head_dim=head_dim, dtype=dtype, causal=causal,
                                      backward=False))
    for case in found:
        mask = "causal" if case["causal"] else "full"
        case["name"] = (f"{case['kernel']} {str(case['dtype']).removeprefix('torch.')} d={case['head_dim']} "
                        f"B={case['batch']} H={case['heads']} H_kv={case['kv_heads']} N_q={case['n_q']} "
                        f"N_k={case['n_k']} {mask}")
    return found


def selfcheck(device: str | None = None, *, report: Callable[[str], None] | None = print) -> list[CaseResult]:
    """Run every case of :func:`cases` and report one line each.

    Args:
        device: ``"cuda"`` or ``"cpu"``; default ``"cuda"`` when there is a GPU.
        report: called with each line of text (None: silent).

    Returns:
        One :class:`CaseResult` per case.

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
    """Command line: ``python -m benchmarks.selfcheck [cuda|cpu]``.

    Returns:
        0 when every case passed, 1 otherwise (2 for a bad argument).
    """
    arguments = sys.argv[1:]
    if len(arguments) > 1 or (arguments and arguments[0] not in ("cuda", "cpu")):
        print("usage: python -m benchmarks.selfcheck [cuda|cpu]", file=sys.stderr)
        return 2
    results = selfcheck(arguments[0] if arguments else None, report=lambda line: print(line, flush=True))
    return 0 if results and all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
