"""The launch configurations the TMA forward is tuned over on Hopper, and the rules that prune them.

:func:`tma_forward_configs` lists the candidates per head dimension, the default first (what the
interpreter and the GPU check's pinned tests run). Before timing, :func:`prune_tma_configs`
drops the ones that cannot fit or are known to lose, as Triton's fused-attention tutorial prunes
its autotuning list (its ``keep`` and ``prune_invalid_configs``), from the GPU's own limits
(``triton.runtime.driver.active.utils.get_device_properties``: shared memory per block, registers
per block) and two estimates written out here, so that the pruning is tested on a CPU with
made-up limits (``tests/flash/test_flash_tma_configs.py``):

* shared memory (:func:`estimated_shared_memory`): the query tile and ``num_stages`` key and
  value tiles in flight, all 16-bit, plus at most 1 KiB of barriers; the output tile reuses that space;
* registers (:func:`estimated_registers`): the float32 accumulator ``[BLOCK_M, d]`` and the float32
  score tile ``[BLOCK_M, BLOCK_N]``, one register per element, spread over ``32 · num_warps``
  threads, plus :data:`REGISTER_OVERHEAD` for addresses, row statistics, probabilities in flight.

Both were checked against the sm_90 builds of every candidate (Triton 3.9, ptxas 13.4;
``tests/flash/test_flash_tma.py``): the shared-memory estimate equals Triton's ``metadata.shared``
at d = 64 and 128 and exceeds it by 768 and 512 bytes at d = 16 and 32; the register estimate is
within 10 of ptxas's count for every candidate kept on an H100/H200, and the candidates it prunes
are exactly those ptxas compiled at 226-255 registers or with spills (d = 128 with 4 warps: 8 to
1,456 bytes of spill stores).

The kept candidates are then timed on the GPU (:func:`time_candidates`), a failing one skipped.
"""

from __future__ import annotations

import math
import warnings

import torch

from attn_course import _validate
from attn_course.flash.configs import SUPPORTED_HEAD_DIMS, KernelConfig

__all__ = [
    "HOPPER_LIMITS",
    "REGISTER_OVERHEAD",
    "REGISTERS_PER_THREAD",
    "SHARED_OVERHEAD",
    "TUNING_REP_MS",
    "TUNING_WARMUP_MS",
    "estimated_registers",
    "estimated_shared_memory",
    "gpu_limits",
    "prune_tma_configs",
    "pruned_because",
    "time_candidates",
    "tma_forward_configs",
]

#: An H100's or H200's limits, as ``triton.runtime.driver.active.utils.get_device_properties`` reports
#: them (CUDA's table for compute capability 9.0: 227 KiB of shared memory per block with opt-in,
#: 64 Ki registers per block): what the ahead-of-time tests prune with, without a GPU.
HOPPER_LIMITS = {"shared_memory_limit": 227 * 1024, "registers_per_block": 64 * 1024, "capability": 90}
#: The most registers one thread can have on sm_80 and sm_90.
REGISTERS_PER_THREAD = 255
#: Registers per thread beyond the float32 tiles: addresses, the row maximum and sum, the 16-bit
#: probabilities, loop counters, barriers' phases. Calibrated on the sm_90 builds: ptxas's counts
#: less the tiles' share ran from 28 to 72.
REGISTER_OVERHEAD = 64
#: Shared memory beyond the tiles: the pipeline's barriers and alignment (Triton's ``metadata.shared``
#: was the tiles plus exactly this in every sm_90 build at d = 64 and 128, plus 256 or 512 bytes at
#: d = 16 or 32).
SHARED_OVERHEAD = 1024

# (block_m, block_n, num_warps, num_stages), the default first. 128 query rows per program: the
# warp-group matrix multiply (wgmma) takes 64 rows per warp group, and 128 keep Q's reuse high.
_CANDIDATES = {
    16: [(128, 64, 4, 3)],
    32: [(128, 64, 4, 3)],
    64: [(128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 8, 2), (128, 128, 8, 3), (128, 128, 4, 3)],
    # The former default (128, 64, 8, 3) stays listed so that the tutorial's rule prunes it visibly:
    # 8 warps on a 128 x 64 tile leave each warp too little of the matrix multiply on Hopper.
    128: [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 4, 3),
          (128, 64, 8, 3)],
}


#: Milliseconds of warm-up and of timed runs per candidate when tuning (``triton.testing.do_bench``;
#: Triton's autotuner takes 25 and 100): once per length bucket, so a rough ranking is enough.
TUNING_WARMUP_MS, TUNING_REP_MS = 10, 40

def tma_forward_configs(head_dim: int) -> tuple[KernelConfig, ...]:
    """The candidate launch configurations of the TMA forward for ``head_dim``, the default first.

    Raises:
        ValueError: a head dimension other than 16, 32, 64, 128.

    Example:
        >>> [(c.block_n, c.num_warps, c.num_stages) for c in tma_forward_configs(64)]
        [(64, 4, 3), (64, 4, 4), (128, 8, 2), (128, 8, 3), (128, 4, 3)]
    """
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"tma_forward_configs: head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim!r}")
    return tuple(KernelConfig(*candidate) for candidate in _CANDIDATES[head_dim])


def _check(where: str, configs, head_dim, element_bytes=2, **limits) -> None:
    """The checks every function here makes: KernelConfigs, sizes and limits that are ints >= 1
    (``capability`` >= 10)."""
    for config in configs:
        if not isinstance(config, KernelConfig):
            raise TypeError(f"{where}: config must be a KernelConfig, got {type(config).__name__}")
    for name, value in (("head_dim", head_dim), ("element_bytes", element_bytes), *limits.items()):
        _validate.integer(where, name, value, minimum=10 if name == "capability" else 1)


def _shared_memory(config: KernelConfig, head_dim: int, element_bytes: int) -> int:
    tiles = config.block_m * head_dim + config.num_stages * 2 * config.block_n * head_dim
    return tiles * element_bytes + SHARED_OVERHEAD


def _registers(config: KernelConfig, head_dim: int) -> int:
    return config.block_m * (head_dim + config.block_n) // (32 * config.num_warps) + REGISTER_OVERHEAD


def _pruned_because(config: KernelConfig, head_dim: int, shared_memory_limit: int, registers_per_block: int,
                    capability: int, element_bytes: int) -> str | None:
    shared, registers = _shared_memory(config, head_dim, element_bytes), _registers(config, head_dim)
    if shared > shared_memory_limit:
        return f"shared memory {shared} > {shared_memory_limit} bytes"
    if registers > REGISTERS_PER_THREAD:
        return f"about {registers} registers per thread > {REGISTERS_PER_THREAD}"
    if registers * 32 * config.num_warps > registers_per_block:
        return f"about {registers * 32 * config.num_warps} registers per block > {registers_per_block}"
    if 90 <= capability < 100 and config.num_warps == 8 and config.block_m * config.block_n < 128 * 128:
        return f"8 warps on a {config.block_m} x {config.block_n} tile (Triton tutorial: pruned on Hopper)"
    return None


def estimated_shared_memory(config: KernelConfig, head_dim: int, element_bytes: int = 2) -> int:
    """Shared memory in bytes one program of the TMA forward needs in ``config``, by the tiles it holds.

    ``(BLOCK_M · d  +  num_stages · 2 · BLOCK_N · d) · element_bytes + SHARED_OVERHEAD``: Q and the
    K and V tiles of every pipeline stage (the output tile is staged for its TMA store in space
    the loop no longer needs).

    Raises:
        TypeError: ``config`` not a :class:`~attn_course.flash.configs.KernelConfig`.
        ValueError: a head dimension or element size out of range.

    Example:
        >>> estimated_shared_memory(KernelConfig(block_m=128, block_n=64, num_warps=4, num_stages=3), 64)
        66560
    """
    _check("estimated_shared_memory", [config], head_dim, element_bytes)
    return _shared_memory(config, head_dim, element_bytes)


def estimated_registers(config: KernelConfig, head_dim: int) -> int:
    """Registers per thread the TMA forward needs in ``config``: its tiles' share plus the overhead.

    ``BLOCK_M · (d + BLOCK_N) / (32 · num_warps) + REGISTER_OVERHEAD``: the float32 accumulator and
    scores, one register per element, spread over the program's threads; Q, K and V stay in shared
    memory, where ``wgmma`` reads them. A rough estimate (see the module): good for pruning, not
    for predicting ptxas's count.

    Raises:
        TypeError: ``config`` not a :class:`~attn_course.flash.configs.KernelConfig`.
        ValueError: a head dimension out of range.

    Example:
        >>> estimated_registers(KernelConfig(block_m=128, block_n=128, num_warps=8, num_stages=2), 128)
        192
    """
    _check("estimated_registers", [config], head_dim)
    return _registers(config, head_dim)


def prune_tma_configs(configs, head_dim: int, *, shared_memory_limit: int, registers_per_block: int,
                      capability: int, element_bytes: int = 2) -> list[KernelConfig]:
    """The candidates worth timing on a GPU with these limits, in their order.

    A candidate is dropped when its :func:`estimated_shared_memory` exceeds ``shared_memory_limit``,
    when its :func:`estimated_registers` exceed :data:`REGISTERS_PER_THREAD` or, over all its
    threads, ``registers_per_block`` (ptxas would spill), or, on Hopper (``capability`` 90 to 99),
    when it runs 8 warps on tiles smaller than 128 x 128 (Triton's fused-attention tutorial prunes
    exactly that on Hopper: too little of the warp-group matrix multiply per warp). If every
    candidate is dropped the first (the default) is kept, so there is always one to run.

    Args:
        configs: candidates, e.g. :func:`tma_forward_configs` ``(head_dim)``.
        head_dim: the head dimension d.
        shared_memory_limit: bytes one block may use (``max_shared_mem``; 232,448 on an H100/H200).
        registers_per_block: registers one block may use (``max_num_regs``; 65,536 on an H100/H200).
        capability: the CUDA compute capability times ten (90 for Hopper).
        element_bytes: bytes per element of Q, K, V (2 for float16 and bfloat16).

    Returns:
        A list of :class:`~attn_course.flash.configs.KernelConfig`, never empty when ``configs`` is not.

    Raises:
        TypeError: a candidate that is not a ``KernelConfig``, or non-int limits.
        ValueError: limits below 1.

    Example:
        >>> kept = prune_tma_configs(tma_forward_configs(128), 128, shared_memory_limit=232448,
        ...                          registers_per_block=65536, capability=90)
        >>> [(c.block_n, c.num_warps, c.num_stages) for c in kept]
        [(128, 8, 2), (128, 8, 3)]
    """
    configs = list(configs)
    limits = dict(shared_memory_limit=shared_memory_limit, registers_per_block=registers_per_block,
                  capability=capability)
    _check("prune_tma_configs", configs, head_dim, element_bytes, **limits)
    kept = [config for config in configs if _pruned_because(config, head_dim, **limits, element_bytes=element_bytes)
            is None]
    return kept if kept or not configs else configs[:1]


def pruned_because(config: KernelConfig, head_dim: int, *, shared_memory_limit: int, registers_per_block: int,
                   capability: int, element_bytes: int = 2) -> str | None:
    """Why :func:`prune_tma_configs` drops ``config`` on a GPU with these limits, or None if it keeps it.

    Raises:
        TypeError, ValueError: as :func:`prune_tma_configs`.

    Example:
        >>> pruned_because(tma_forward_configs(128)[-1], 128, **HOPPER_LIMITS)
        '8 warps on a 128 x 64 tile (Triton tutorial: pruned on Hopper)'
    """
    limits = dict(shared_memory_limit=shared_memory_limit, registers_per_block=registers_per_block,
                  capability=capability)
    _check("pruned_because", [config], head_dim, element_bytes, **limits)
    return _pruned_because(config, head_dim, **limits, element_bytes=element_bytes)


def gpu_limits(device: torch.device) -> dict[str, int]:
    """What :func:`~attn_course.flash.tma_configs.prune_tma_configs` needs to know of a CUDA ``device``.

    Returns:
        ``{"shared_memory_limit": bytes per block, "registers_per_block": ..., "capability": 10·major + minor}``,
        read from Triton's driver and PyTorch (an H100 or H200 gives :data:`HOPPER_LIMITS`).

    Raises:
        TypeError: ``device`` not a torch.device. ValueError: not a CUDA device.
    """
    if not isinstance(device, torch.device):
        raise TypeError(f"gpu_limits: device must be a torch.device, got {type(device).__name__}")
    if device.type != "cuda":
        raise ValueError(f"gpu_limits: device must be a CUDA device, got {device}")
    import triton

    index = device.index if device.index is not None else torch.cuda.current_device()
    limits = triton.runtime.driver.active.utils.get_device_properties(index)
    major, minor = torch.cuda.get_device_capability(index)
    return {"shared_memory_limit": limits["max_shared_mem"], "registers_per_block": limits["max_num_regs"],
            "capability": 10 * major + minor}


def time_candidates(candidates, run) -> list[float]:
    """Milliseconds of ``run(config)`` for each candidate (``triton.testing.do_bench``), ``inf`` for one
    that fails: skipped, with a warning, as Triton's autotuner skips a configuration.

    Triton's ``Autotuner._bench`` (the same in Triton 3.6 and 3.9) times a configuration as infinitely
    slow when it raises ``OutOfResources`` (more shared memory or threads than the GPU has, raised when
    the compiled kernel is loaded, at its first launch), ``PTXASError`` or
    ``CompileTimeAssertionFailure``. A compiler pass that fails raises a plain ``RuntimeError``
    ("PassManager::run failed") in both versions, so any ``Exception`` skips the candidate here; if
    every candidate fails the inputs or the machine are at fault (no C compiler for Triton's launcher,
    an error in the kernel), and that is raised.

    Args:
        candidates: a non-empty sequence of :class:`~attn_course.flash.configs.KernelConfig`.
        run: launches the kernel in the configuration it is given.

    Returns:
        One time per candidate, in their order; at least one finite.

    Raises:
        TypeError: a candidate that is not a ``KernelConfig``, ``run`` not callable.
        ValueError: no candidates.
        RuntimeError: every candidate failed (the message names each one's error).
    """
    candidates = _validate.sequence("time_candidates", "candidates", candidates, of="KernelConfigs")
    if not candidates:
        raise ValueError("time_candidates: candidates must not be empty")
    for index, config in enumerate(candidates):
        _validate.instance("time_candidates", f"candidates[{index}]", config, KernelConfig)
    if not callable(run):
        raise TypeError(f"time_candidates: run must be callable, got {type(run).__name__}")
    import triton.testing

    times, failures = [], []
    for config in candidates:
        try:
            times.append(triton.testing.do_bench(lambda config=config: run(config), warmup=TUNING_WARMUP_MS,
                                                 rep=TUNING_REP_MS))
        except Exception as error:   # skipped, as Triton's autotuner skips it
            lines = str(error).strip().splitlines() or [""]
            failures.append(f"{config}: {type(error).__name__}: {lines[0][:300]}")
            warnings.warn(f"TMA forward tuning: skipped {failures[-1]}", RuntimeWarning, stacklevel=3)
            times.append(math.inf)
    if all(math.isinf(time) for time in times):
        raise RuntimeError("TMA forward tuning: no candidate ran: " + "; ".join(failures))
    return times
