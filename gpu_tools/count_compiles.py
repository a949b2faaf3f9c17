"""Count the Triton compilations that tools/gpu_check.sh triggers on a GPU, on a machine without one.

    .venv/bin/python -m gpu_tools.count_compiles [--json FILE] [--plan FILE] [--calibrate] [PYTEST_ARGS...]

A GPU compiles a kernel once per specialisation (its constexprs, launch options, and Triton's
specialisation of every other argument: dtype, 16-byte alignment, an int equal to 1), at about 2 to 6 s
each for sm_90 (``--calibrate`` times a few): most of the check's time. This runs the check's kernel
tests (default: tools/gpu_check.sh's files, ``-m "not slow"``) in Triton's interpreter, records every
launch's key with Triton's own ``native_specialize_impl`` and prints the distinct keys per test file
(each is its own process in the check) and per kernel. Where a GPU takes another path: decoding's split
count follows an H200's 132 multiprocessors; the forward takes the TMA kernel, pinned by ``gpu_setup``
to one configuration per head dim like the pointer kernel here; the interpreter's float32 becomes a
16-bit dtype (the count is an upper bound); the two tuning tests compile every candidate on a GPU (one
here): added. Then the benchmark's essential profile, by its own count
(:func:`~benchmarks.flash_gpu.kernels_used.count_compilations`). ``--plan`` writes the check's shards.
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
        key = (*key, ("num_warps", kwargs.get("num_warps", 4)), ("num_stages", kwargs.get("num_stages", 3)))
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


def gpu_only_compilations() -> dict[str, int]:
    """Compilations two tests add on a GPU, by test: the autotuned launch (every forward and decode candidate
    at d = 64 there, one at d = 16 here) and the TMA forward's tuning (every candidate kept for an H200 at
    d = 64; here it times a fake and launches nothing)."""
    from attn_course.flash.configs import kernel_configs
    from attn_course.flash.tma_configs import HOPPER_LIMITS, prune_tma_configs, tma_forward_configs

    autotuned = sum(len(kernel_configs(name, 64)) - len(kernel_configs(name, 16)) for name in ("forward", "decode"))
    return {"tests/flash/test_flash_configs.py::test_the_autotuned_launch_runs": autotuned,
            "tests/flash/test_flash_tma.py::test_tuning_on_a_gpu_picks_a_kept_candidate_once_per_length_bucket":
            len(prune_tma_configs(tma_forward_configs(64), 64, **HOPPER_LIMITS))}


def plan_shards(by_test: dict[str, set], shards: int, most: int, extra: dict[str, int]) -> list[tuple[str, set, list]]:
    """``[(name, compilation keys, specs)]``: the tests in ``shards`` processes, balanced by compilations.

    A unit is a test function (``FILE::FUNCTION``), or a slice of its cases (``FILE::FUNCTION@I/N``, see
    tests/flash/gpu_setup.py) when it needs more than ``most``; largest first, each goes to the shard
    whose compilations grow least. ``extra``: compilations a function needs on a GPU only.
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


def write_plan(plan, path: pathlib.Path) -> None:
    lines = ["# tools/gpu_check.sh's test shards, one process each, all at once: NAME COMPILATIONS SPEC...",
             "# Written by python -m gpu_tools.count_compiles --plan (rerun it when the kernel tests change: a test",
             "# in no shard would not run, and the dry run says so). COMPILATIONS: the distinct kernel",
             "# specialisations the shard compiles, at 2 to 6 s each for sm_90."]
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
    extra = gpu_only_compilations()
    on_gpu = dict(per_file)
    for test, count in extra.items():
        on_gpu[test.split("::")[0]] = on_gpu.get(test.split("::")[0], 0) + count
    from benchmarks.flash_gpu import GPU_SIZES, count_compilations, plan_phases

    report = {"tests_exit_status": int(status), "launches": recorder.launches, "distinct": len(recorder.keys),
              "per_file": per_file, "per_kernel": dict(per_kernel), "extra_on_gpu": extra, "per_file_on_gpu": on_gpu,
              "benchmark_essential": count_compilations(plan_phases(GPU_SIZES, None, "essential"), GPU_SIZES),
              "interpreter_seconds": round(seconds, 1)}
    index = {key: number for number, key in enumerate(recorder.keys)}
    report["keys"] = [repr(key) for key in recorder.keys]          # to recount any other split into shards
    report["by_test"] = {test: sorted(index[key] for key in keys) for test, keys in recorder.by_test.items()}
    if args.plan:
        plan = plan_shards(recorder.by_test, args.shards, args.most, extra)
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
