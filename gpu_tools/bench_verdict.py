"""Whether ``tools/gpu_check.sh``'s benchmark step failed, from its exit status and what it wrote.

``timeout`` ends the step with 124 (137 after ``-k``) whenever its limit passes, also when the
benchmark had written every row and was drawing its plots. The benchmark's ``machine.json`` says how
the run ended (``stopped``, :class:`~benchmarks.flash_gpu.run.GpuBenchmarkResult`): ``"complete"``,
or ``"max_minutes"`` (its budget ran out: the rows not reached are written too, as skipped rows that
say so) mean every row is in the CSVs; ``"running"`` (killed inside a phase) or ``"SIGTERM"`` (the
phases left are not written) do not. A step that wrote all its rows is not a failure:

    python -m gpu_tools.bench_verdict RC OUT      one line; exit status 1 when the step failed

Standard library only: it runs on the GPU machine's bare Python in a few milliseconds.
"""

from __future__ import annotations

import json
import pathlib
import sys

__all__ = ["ROWS_ALL_WRITTEN", "bench_verdict", "main"]

#: The ``stopped`` values of a run whose every planned row is in its CSVs.
ROWS_ALL_WRITTEN = ("complete", "max_minutes")


def bench_verdict(returncode: int, out) -> tuple[bool, str]:
    """``(failed, line)`` for the benchmark step that ended with ``returncode`` and wrote into ``out``.

    Args:
        returncode: the step's exit status (``timeout``'s: 124 or 137 when it ended the step).
        out: the folder holding the benchmark's ``machine.json``.

    Returns:
        ``failed`` False when the step exited 0, or when ``timeout`` ended it (124, 137) after
        ``machine.json`` said every row was written (``stopped`` in :data:`ROWS_ALL_WRITTEN`); any other
        exit status is a failure (an error in the benchmark); ``line`` says which.

    Raises:
        TypeError: ``returncode`` not an int, ``out`` not a path or str.

    Example:
        >>> bench_verdict(0, "/nonexistent")
        (False, 'benchmark: done (rows not reached within the budget, if any, are status skipped in the CSVs)')
    """
    if isinstance(returncode, bool) or not isinstance(returncode, int):
        raise TypeError(f"bench_verdict: returncode must be an int, got {type(returncode).__name__}")
    if not isinstance(out, (str, pathlib.Path)):
        raise TypeError(f"bench_verdict: out must be a path or str, got {type(out).__name__}")
    if returncode == 0:
        return False, "benchmark: done (rows not reached within the budget, if any, are status skipped in the CSVs)"
    try:
        stopped = json.loads((pathlib.Path(out) / "machine.json").read_text()).get("stopped")
    except (OSError, ValueError, AttributeError) as error:
        stopped, why = None, f"no readable machine.json ({type(error).__name__})"
    else:
        why = f"machine.json: stopped={stopped}"
    if returncode not in (124, 137):
        return True, f"benchmark: FAILED, exit status {returncode} ({why}; see bench.txt)"
    if stopped in ROWS_ALL_WRITTEN:
        return False, (f"benchmark: every row written ({why}), then stopped by the timeout (exit status "
                       f"{returncode}) while writing its summary or plots: not a failure")
    return True, (f"benchmark: stopped by the timeout (exit status {returncode}) before every row was written "
                  f"({why}); the CSVs hold the rows measured")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[0].lstrip("-").isdigit():
        print("usage: python -m gpu_tools.bench_verdict RC OUT", file=sys.stderr)
        return 2
    failed, line = bench_verdict(int(argv[0]), argv[1])
    print(line)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
