"""What the Triton kernel tests share so that they run unchanged on a CUDA GPU and in Triton's interpreter.

* :data:`DEVICE`, :data:`DTYPES` (``tests/support/flash_rule.py``'s): the device the kernels use here
  and the two dtypes they take there (float16 and bfloat16 on a GPU; float16 and float32 in the
  interpreter, whose ``tl.dot`` has no bfloat16).
* :data:`PRECISE_DTYPE`: the most precise dtype the kernels take here, for the tests that check
  exactness rather than accuracy (float32 in the interpreter, float16 on a GPU: the GPU path
  refuses float32), and :func:`round_off`, the tolerance such a test allows in that dtype.
* :func:`pinned_configs`, an autouse fixture: on a GPU every launch that would autotune (the
  launcher's ``config=None``) takes the first candidate of ``CONFIGS`` instead, as the interpreter
  always does. Autotuning compiles every candidate and times each one per shape; pinned, each
  kernel specialisation compiles once, which is what lets ``tools/gpu_check.sh`` fit its time.
  :func:`autotuned_kernel` is the launcher's real autotuner, for the one test of autotuning
  (``test_flash_configs.py``). Likewise the TMA forward's tuning
  (:func:`~attn_course.flash.tma_attention.tuned_tma_config`) answers its default on a GPU;
  :func:`tuned_tma_config` is the real one, for its one test (``test_flash_tma.py``).
  ``tools/gpu_check.sh`` also loads this module as a plugin (``-p gpu_setup``), so that the other
  kernel tests (``test_flash_tma.py``) are pinned too, and
  with ``GPU_CHECK_COMPILE_LOG=FILE`` this plugin appends one JSON line per Triton compilation to
  FILE (the kernel's specialisation and the seconds it took): the check's real compile count.

A test module takes the fixture by importing it: ``from gpu_setup import pinned_configs``.
"""

import json
import os
import time

import pytest
import torch

from attn_course.flash import launch, tma_attention
from attn_course.flash.configs import KERNEL_NAMES, kernel_config
from attn_course.flash.tma_configs import tma_forward_configs

from support.flash_rule import DEVICE, DTYPES

__all__ = ["DEVICE", "DTYPES", "PRECISE_DTYPE", "autotuned_kernel", "pinned_configs", "round_off", "tuned_tma_config"]

ON_GPU = DEVICE == "cuda"
PRECISE_DTYPE = torch.float16 if ON_GPU else torch.float32

# The launcher's autotuner and the TMA forward's tuning, kept before pinned_configs replaces them on a GPU.
autotuned_kernel = launch.autotuned_kernel
tuned_tma_config = tma_attention.tuned_tma_config

# A few units in the last place of values of order 1: what two computations of the same numbers
# in a different order (splits, tiles) may differ by.
_ROUND_OFF = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def round_off(dtype: torch.dtype) -> float:
    """The absolute tolerance between two orders of summing the same attention in ``dtype``."""
    return _ROUND_OFF[dtype]


class _PinnedKernel:
    """Stands in for ``triton.autotune(...)(kernel)``: launched as ``pinned[grid](*args, **constants)``,
    it runs the kernel in its default configuration, with the grid the launcher computed for it."""

    def __init__(self, kernel: str, head_dim: int):
        config = kernel_config(kernel, head_dim)
        # The decode kernel's BLOCK_M comes from the launcher (its rows), not from the config.
        self.sizes = {"BLOCK_N": config.block_n} if kernel == "decode" else {"BLOCK_M": config.block_m,
                                                                             "BLOCK_N": config.block_n}
        self.options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        self.function = launch.kernel_function(KERNEL_NAMES[kernel])

    def __getitem__(self, grid):
        def run(*args, **constants):
            shape = grid({**constants, **self.sizes}) if callable(grid) else grid
            return self.function[shape](*args, **constants, **self.sizes, **self.options)
        return run


@pytest.fixture(autouse=True)
def pinned_configs(monkeypatch):
    """On a GPU, every launch the autotuner would take runs the default configuration (see the module)."""
    if ON_GPU:
        monkeypatch.setattr(launch, "autotuned_kernel", _PinnedKernel)
        monkeypatch.setattr(tma_attention, "tuned_tma_config", _pinned_tma_config)


def _pinned_tma_config(q, k, v, out, lse, **options):
    """Stands in for :func:`~attn_course.flash.tma_attention.tuned_tma_config`: the default, untimed."""
    return tma_forward_configs(q.shape[-1])[0]


def pytest_configure(config):
    """As a plugin (``-p gpu_setup``) with ``GPU_CHECK_COMPILE_LOG`` set: log every compilation."""
    path = os.environ.get("GPU_CHECK_COMPILE_LOG")
    if path:
        _log_compilations(path)


def _log_compilations(path: str) -> None:
    """Append ``{"kernel": ..., "seconds": ...}`` to ``path`` after each Triton compilation, from
    Triton's JIT hooks (``triton.knobs.runtime.jit_cache_hook`` runs before a compilation,
    ``jit_post_compile_hook`` after; both since Triton 3.4). A hit in Triton's on-disk cache is
    logged too, with its (short) time: the line says what this process did not find in memory."""
    from attn_course.flash.triton_mode import use_interpreter_without_gpu

    use_interpreter_without_gpu()                  # Triton is imported in this process's mode, once
    import triton

    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        print(f"gpu_setup: Triton {triton.__version__} has no JIT compile hooks; compilations are not logged")
        return
    started = {}

    def before(*args, **kwargs):
        started[kwargs.get("repr")] = time.monotonic()
        return False                               # False: go on and compile

    def after(*args, **kwargs):
        name = kwargs.get("repr")
        seconds = time.monotonic() - started.pop(name, time.monotonic())
        with open(path, "a") as log:
            log.write(json.dumps({"kernel": name, "seconds": round(seconds, 3), "pid": os.getpid()}) + "\n")
        return False

    runtime.jit_cache_hook = before
    runtime.jit_post_compile_hook = after


# --- Shards: tools/gpu_check.sh runs the kernel tests in parallel processes -------------------------
# Each process compiles its own kernels, one after another, so the shards are balanced by the
# compilations they need (python -m gpu_tools.count_compiles --plan writes tools/gpu_check_shards.txt).
# A shard lists test functions, "FILE::FUNCTION", or a slice of one's parametrisations,
# "FILE::FUNCTION@I/N" (the I-th of N consecutive runs of its cases, in collection order: the ids
# name dtypes, which differ between a GPU and the interpreter, the order does not).

def pytest_addoption(parser):
    group = parser.getgroup("gpu_setup")
    group.addoption("--gpu-shard-plan", default=None, help="a shard plan (tools/gpu_check_shards.txt)")
    group.addoption("--gpu-shard", default=None, help="run only this shard of the plan")
    group.addoption("--gpu-shard-coverage", action="store_true",
                    help="run nothing; say which shard of the plan holds each collected test (the dry run's check)")


def read_shard_plan(path: str) -> dict[str, list[str]]:
    """``{shard name: [spec, ...]}`` from a plan file: one shard a line, ``NAME KEYS SPEC...``; ``#`` comments."""
    plan = {}
    with open(path) as lines:
        for line in lines:
            words = line.split("#", 1)[0].split()
            if words:
                plan[words[0]] = words[2:]
    return plan


def _in_slice(spec: str, function_id: str, position: int, count: int) -> bool:
    base, _, part = spec.partition("@")
    if base != function_id:
        return False
    if not part:
        return True
    index, slices = (int(number) for number in part.split("/"))
    return index * count // slices <= position < (index + 1) * count // slices


def _shards_of(plan: dict[str, list[str]], items) -> list[list[str]]:
    """For each item, the shards of ``plan`` that hold it."""
    counts, positions = {}, []
    for item in items:
        function_id = item.nodeid.split("[", 1)[0]
        positions.append((function_id, counts.get(function_id, 0)))
        counts[function_id] = counts.get(function_id, 0) + 1
    return [[name for name, specs in plan.items()
             if any(_in_slice(spec, function_id, position, counts[function_id]) for spec in specs)]
            for function_id, position in positions]


@pytest.hookimpl(trylast=True)      # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
    plan_path, shard = config.getoption("--gpu-shard-plan"), config.getoption("--gpu-shard")
    if not plan_path:
        return
    plan = read_shard_plan(plan_path)
    if config.getoption("--gpu-shard-coverage"):
        holders = _shards_of(plan, items)
        wrong = [f"{item.nodeid}: in {shards or 'no shard'}"
                 for item, shards in zip(items, holders) if len(shards) != 1]
        print(f"\ngpu_setup: {len(items)} tests, {len(items) - len(wrong)} in exactly one of the {len(plan)} shards"
              + "".join(f"\n  {line}" for line in wrong))
        config.hook.pytest_deselected(items=list(items))
        items[:] = []
        return
    if shard not in plan:
        raise pytest.UsageError(f"--gpu-shard {shard!r} is not in {plan_path} (shards: {sorted(plan)})")
    kept, dropped = [], []
    for item, shards in zip(items, _shards_of(plan, items)):
        (kept if shard in shards else dropped).append(item)
    items[:] = kept
    config.hook.pytest_deselected(items=dropped)
