"""Count the Triton compilations that tools/gpu_check.sh triggers on a GPU, on a machine without one.

    .venv/bin/python -m gpu_tools.count_compiles [--json FILE] [--plan FILE] [PYTEST_ARGS...]

A GPU compiles a kernel once per *specialisation*: its constexpr values (HEAD_DIM, BLOCK_M,
BLOCK_N, CAUSAL, SPLITS), its launch options (num_warps, num_stages), and for every other argument
Triton's type and specialisation of the value (pointer dtype and 16-byte alignment; an int equal
to 1 becomes a constant, an int divisible by 16 is marked so). A cold compile for sm_90 takes
seconds (about 2 to 6 s, see ``--calibrate``), so these counts are most of the check's time.

This runs the GPU check's kernel tests (default: the files and ``-m "not slow"`` of
tools/gpu_check.sh; other pytest arguments replace them) in Triton's interpreter, records every
launch's specialisation key with Triton's own ``native_specialize_impl`` (the function its JIT
keys its cache with) and prints the distinct keys per test file (each file is its own pytest
process in the check, so each compiles its own) and per kernel. Where the GPU takes another path:

* decoding's default split count follows the GPU's multiprocessors: simulated for an H200's 132;
* the forward with no ``config`` takes the TMA kernel on Hopper, pinned by ``gpu_setup`` to one
  configuration per head dim like the pointer kernel's default here: the same number of
  specialisations; the one test of its tuning (here with a fake timer, launching nothing) compiles every candidate
  ``prune_tma_configs`` keeps at d = 64 on an H200: added;
* the interpreter's float32 becomes float16 or bfloat16 on a GPU: the count here is an upper bound
  (two interpreter dtypes may become one GPU dtype, never the reverse);
* test_flash_configs.py's autotuning test uses d = 64 on a GPU (every candidate compiled and
  timed), d = 16 with one candidate here: added from ``CONFIGS``.

Then the benchmark's essential profile, by its own count (``python -m benchmarks.flash_gpu
--count-compilations essential``: every candidate of each backward kernel, the TMA forward's kept
candidates, decoding, FlexAttention's graphs).

``--calibrate`` also times real ahead-of-time compiles for sm_90 (:mod:`gpu_tools.aot`) in a
subprocess (Triton in GPU mode) and prints the seconds each took.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
GPU_CHECK_TESTS = ["tests/flash/test_flash_triton.py", "tests/flash/test_flash_triton_gqa_causal.py",
                   "tests/flash/test_flash_decode.py", "tests/flash/test_flash_tma.py",
                   "tests/flash/test_flash_configs.py"]
H200_MULTIPROCESSORS = 132
CALIBRATION = """
import json, time
from gpu_tools.aot import Case, compile_case
for case in [Case("forward_tma", 0, 64, "float16", True, 90), Case("backward_dkdv", 0, 128, "bfloat16", True, 90),
             Case("backward_dq", 1, 64, "float16", False, 90),
             Case("decode", 0, 128, "float16", False, 90, block_m=16)]:
    start = time.perf_counter()
    compile_case(case)
    print(json.dumps({"case": case.name, "seconds": round(time.perf_counter() - start, 2)}), flush=True)
"""


class LaunchRecorder:
    """A pytest plugin: every kernel launch's specialisation key, and the test file that first needed it."""

    def __init__(self):
        self.keys: dict[tuple, str] = {}
        self.by_file: dict[str, set] = collections.defaultdict(set)
        self.by_test: dict[str, set] = collections.defaultdict(set)
        self.current = self.test = "(outside a test)"
        self.launches = 0

    def pytest_runtest_setup(self, item):
        self.current, self.test = item.nodeid.split("::")[0], item.nodeid
        self.by_test[item.nodeid]               # every test has a shard, one that compiles nothing too

    def record(self, function, args, kwargs):
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend

        parameters = list(inspect.signature(function.fn).parameters.values())
        bound = dict(zip((p.name for p in parameters), args))
        bound.update((name, value) for name, value in kwargs.items() if name in {p.name for p in parameters})
        key = [function.fn.__name__]
        for parameter in parameters:
            value = bound.get(parameter.name, parameter.default)
            if "constexpr" in str(parameter.annotation):
                key.append((parameter.name, value))
            else:
                key.append((parameter.name, native_specialize_impl(BaseBackend, value, False, True, True)))
        # Launch options, at the JIT's defaults when not given (other options keep their defaults).
        key.append(("num_warps", kwargs.get("num_warps", 4)))
        key.append(("num_stages", kwargs.get("num_stages", 3)))
        key = tuple(key)
        self.launches += 1
        self.keys.setdefault(key, self.current)
        self.by_file[self.current].add(key)
        self.by_test[self.test].add(key)


def install(recorder: LaunchRecorder) -> None:
    """Route every interpreted launch through ``recorder``, and decode's split count through an H200's
    multiprocessor count (the GPU's default, which decides the merge kernel's width)."""
    from triton.runtime.interpreter import InterpretedFunction

    from attn_course.flash import decode

    original_run = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        if not warmup:
            recorder.record(self, args, kwargs)
        return original_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    splits = decode.decode_num_splits

    def gpu_splits(*args, multiprocessors=1, **kwargs):
        return splits(*args, multiprocessors=H200_MULTIPROCESSORS, **kwargs)

    decode.decode_num_splits = gpu_splits


def autotuning_test_extra() -> int:
    """Compilations test_the_autotuned_launch_runs adds on a GPU (every candidate at d = 64) over the
    interpreter's (one candidate at d = 16), for the forward and the decode kernel."""
    from attn_course.flash.configs import kernel_configs

    return sum(len(kernel_configs(kernel, 64)) - len(kernel_configs(kernel, 16)) for kernel in ("forward", "decode"))


TMA_TUNING_TEST = "tests/flash/test_flash_tma.py::test_tuning_on_a_gpu_picks_a_kept_candidate_once_per_length_bucket"


def tma_tuning_test_extra() -> int:
    """Compilations the TMA forward's tuning test adds on a GPU (in the interpreter it times a fake, launching nothing):
    every candidate the pruning keeps for an H200 at d = 64, float16, causal."""
    from attn_course.flash.tma_configs import HOPPER_LIMITS, prune_tma_configs, tma_forward_configs

    return len(prune_tma_configs(tma_forward_configs(64), 64, **HOPPER_LIMITS))


def benchmark_compiles(profile: str = "essential") -> dict:
    """The compilations of the GPU benchmark's ``profile`` on an H200, by the benchmark's own count
    (:func:`~benchmarks.flash_gpu.kernels_used.count_compilations`, from the tables the code launches from)."""
    from benchmarks.flash_gpu import GPU_SIZES, count_compilations, plan_phases

    return count_compilations(plan_phases(GPU_SIZES, None, profile), GPU_SIZES)


def plan_shards(by_test: dict[str, set], shards: int, most: int, extra: dict[str, int]) -> list[tuple[str, set, list]]:
    """Split the tests into ``shards`` processes, balanced by the compilations each process needs.

    A unit is a test function (``FILE::FUNCTION``), or, when one needs more than ``most``
    compilations, a slice of its cases (``FILE::FUNCTION@I/N``, see tests/flash/gpu_setup.py).
    Largest units first, each goes to the shard whose set of compilations grows least (the
    compilations shared with tests already there are free). ``extra``: compilations a function
    needs on a GPU only (function id -> how many).

    Returns:
        ``[(name, compilation keys, specs)]``.
    """
    by_function: dict[str, list[tuple[str, set]]] = collections.defaultdict(list)
    for test, keys in by_test.items():
        by_function[test.split("[", 1)[0]].append((test, set(keys)))
    units = []
    for function, cases in by_function.items():
        if function.startswith("("):
            continue
        gpu_only = {(function, number) for number in range(extra.get(function, 0))}
        keys = set().union(*(case_keys for _, case_keys in cases)) | gpu_only
        slices = min(len(cases), -(-len(keys) // most))
        if slices <= 1:
            units.append((function, keys))
            continue
        for index in range(slices):
            part = cases[index * len(cases) // slices:(index + 1) * len(cases) // slices]
            units.append((f"{function}@{index}/{slices}", set().union(*(case_keys for _, case_keys in part))))
    plan = [(f"shard{number:02d}", set(), []) for number in range(shards)]
    for spec, keys in sorted(units, key=lambda unit: (-len(unit[1]), unit[0])):
        _, chosen, specs = min(plan, key=lambda shard: (len(shard[1] | keys), len(shard[2])))
        chosen |= keys
        specs.append(spec)
    return plan


def write_plan(plan, path: pathlib.Path, seconds_per_compile=(2, 6)) -> None:
    low, high = seconds_per_compile
    lines = ["# tools/gpu_check.sh's test shards, one process each, all at once: NAME COMPILATIONS SPEC...",
             "# Written by python -m gpu_tools.count_compiles --plan (rerun it when the kernel tests change: a test",
             "# in no shard would not run, and the dry run says so). COMPILATIONS: the distinct kernel",
             f"# specialisations the shard compiles, at {low} to {high} s each for sm_90."]
    lines += [f"{name} {len(keys)} {' '.join(sorted(specs))}" for name, keys, specs in plan if specs]
    path.write_text("\n".join(lines) + "\n")


def calibrate() -> list[dict]:
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1", "OMP_NUM_THREADS": "1",
           "TRITON_CACHE_DIR": os.environ.get("COUNT_COMPILES_CACHE", f"/tmp/count-compiles-cache-{os.getpid()}")}
    result = subprocess.run([sys.executable, "-c", CALIBRATION], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    if result.returncode:
        raise SystemExit(f"calibration failed:\n{result.stderr[-3000:]}")
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=pathlib.Path, help="also write the counts here")
    parser.add_argument("--calibrate", action="store_true", help="time real sm_90 compiles (about 15 s)")
    parser.add_argument("--plan", type=pathlib.Path,
                        help="write gpu_check's test shards here (tools/gpu_check_shards.txt)")
    parser.add_argument("--shards", type=int, default=10, help="how many test processes (default 10)")
    parser.add_argument("--most", type=int, default=10,
                        help="split a test function's cases when it needs more compilations than this (default 10)")
    args, pytest_args = parser.parse_known_args(argv)
    os.environ["TRITON_INTERPRET"] = "1"       # before anything imports Triton: a process has one mode
    os.chdir(ROOT)
    import pytest

    recorder = LaunchRecorder()
    install(recorder)
    started = time.monotonic()
    status = pytest.main([*(pytest_args or [*GPU_CHECK_TESTS, "-m", "not slow"]), "-q", "-p", "no:cacheprovider",
                          "-p", "no:xdist"], plugins=[recorder])
    seconds = time.monotonic() - started
    per_file = {name: len(keys) for name, keys in sorted(recorder.by_file.items())}
    per_kernel = collections.Counter(key[0] for key in recorder.keys)
    extra, tma_extra = autotuning_test_extra(), tma_tuning_test_extra()
    bench = benchmark_compiles()
    report = {"tests_exit_status": int(status), "launches": recorder.launches, "distinct": len(recorder.keys),
              "per_file": per_file, "per_kernel": dict(per_kernel), "autotuning_test_extra_on_gpu": extra,
              "tma_tuning_test_extra_on_gpu": tma_extra,
              "per_file_on_gpu": {**per_file, "tests/flash/test_flash_configs.py":
                                  per_file.get("tests/flash/test_flash_configs.py", 0) + extra,
                                  "tests/flash/test_flash_tma.py":
                                  per_file.get("tests/flash/test_flash_tma.py", 0) + tma_extra},
              "benchmark_essential": bench,
              "interpreter_seconds": round(seconds, 1)}
    index = {key: number for number, key in enumerate(recorder.keys)}
    report["keys"] = [repr(key) for key in recorder.keys]          # to recount any other split into shards
    report["by_test"] = {test: sorted(index[key] for key in keys) for test, keys in recorder.by_test.items()}
    if args.plan:
        autotune = "tests/flash/test_flash_configs.py::test_the_autotuned_launch_runs"
        plan = plan_shards(recorder.by_test, args.shards, args.most, {autotune: extra, TMA_TUNING_TEST: tma_extra})
        write_plan(plan, args.plan)
        report["shards"] = {name: len(keys) for name, keys, specs in plan if specs}
    if args.calibrate:
        report["calibration_sm90"] = calibrate()
    print(json.dumps({name: value for name, value in report.items() if name not in ("keys", "by_test")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
