"""The launch configurations of the FlashAttention kernels, in one table, and what they support.

:data:`CONFIGS` holds a short list of candidates per kernel and head dimension. On a GPU,
``triton.autotune`` times the candidates on the first call for each shape and keeps the fastest;
in Triton's interpreter (no GPU driver to time with) the first candidate of the same list runs.
The ahead-of-time compile test (``tests/flash/test_flash_compile.py``) compiles every candidate
for sm_80 and sm_90.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = [
    "CONFIGS",
    "DECODE_BLOCK_M",
    "DECODE_MAX_QUERIES",
    "DECODE_MAX_SPLITS",
    "DECODE_SPLIT_ALIGN",
    "DELTA_BLOCK_M",
    "GPU_DTYPES",
    "INTERPRETER_DTYPES",
    "KERNEL_MODULES",
    "KERNEL_NAMES",
    "SUPPORTED_HEAD_DIMS",
    "KernelConfig",
    "atomic_dq_config",
    "kernel_config",
    "kernel_configs",
]

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
GPU_DTYPES = (torch.float16, torch.bfloat16)
# The interpreter's tl.dot gives wrong results for bfloat16 (NumPy has no bfloat16).
INTERPRETER_DTYPES = (torch.float16, torch.float32)


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch options of one kernel: ``block_m`` query rows and ``block_n`` key
    rows per tile, ``num_warps`` and ``num_stages`` (software pipelining depth) on a GPU.
    Frozen, so hashable: a dictionary key, a set member, a cached argument."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# (kernel, head_dim) -> candidate configs, the first being the default (and the interpreter's).
# Each is (block_m, block_n, num_warps, num_stages). Small head dims have one: their tiles are
# cheap and the choice matters little. Every candidate is compiled for sm_80 and sm_90 by the
# tests, and its shared memory checked against those GPUs' limits.
_CANDIDATES = {
    # Forward: 128 queries per program hold Q on chip; wider key tiles halve the loop trips.
    "forward": {
        16: [(128, 64, 4, 3)], 32: [(128, 64, 4, 3)],
        64: [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4)],
        128: [(128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)],
    },
    # dK/dV: block_n keys held per program, block_m queries streamed per step. The program
    # holds K, V and the float32 dK, dV of its keys for the whole loop, plus the P, dP, dS tiles
    # of each step: chosen so that no sm_90 build spills registers (tests/flash/test_flash_spills.py).
    # At d = 128, 64-query steps spill with 4 or 8 warps and any pipelining depth; 32 do not, and
    # 128 keys fit with 16-query steps (with 32, one stage fits sm_90 but ptxas spills 12 KB for
    # sm_80; two stages reach 254 of sm_90's 255 registers). A 128-key tile needs 8 warps at
    # d = 64 (4 warps spill).
    "backward_dkdv": {
        16: [(64, 64, 4, 3)], 32: [(64, 64, 4, 3)],
        64: [(64, 64, 4, 3), (32, 128, 8, 2)],
        128: [(32, 64, 8, 2), (16, 128, 8, 2)],
    },
    # dQ: block_m queries held per program, block_n keys streamed per step.
    "backward_dq": {
        16: [(64, 64, 4, 3)], 32: [(64, 64, 4, 3)],
        64: [(64, 64, 4, 3), (128, 32, 4, 3)],
        128: [(64, 64, 8, 2), (128, 32, 8, 2)],
    },
    # Decode: block_m is set by the launcher from the rows (DECODE_BLOCK_M); block_n must
    # divide DECODE_SPLIT_ALIGN (128).
    "decode": {
        16: [(16, 64, 4, 3)], 32: [(16, 64, 4, 3)],
        64: [(16, 64, 4, 3), (16, 128, 4, 3)],
        128: [(16, 64, 4, 3), (16, 128, 8, 2)],
    },
}
CONFIGS: dict[tuple[str, int], tuple[KernelConfig, ...]] = {
    (kernel, head_dim): tuple(KernelConfig(*candidate) for candidate in candidates)
    for kernel, by_head_dim in _CANDIDATES.items() for head_dim, candidates in by_head_dim.items()
}
#: The kernels that take a :class:`KernelConfig`: kernel -> its function's name.
KERNEL_NAMES = {
    "forward": "attention_forward_kernel",
    "backward_dkdv": "attention_backward_dkdv_kernel",
    "backward_dq": "attention_backward_dq_kernel",
    "decode": "attention_decode_kernel",
}
#: Every kernel function of the package -> the module that defines it.
KERNEL_MODULES = {
    "attention_forward_kernel": "attn_course.flash.kernels",
    "attention_decode_kernel": "attn_course.flash.kernels",
    "attention_decode_merge_kernel": "attn_course.flash.kernels",
    "attention_backward_dkdv_kernel": "attn_course.flash.kernels_backward",
    "attention_backward_dq_kernel": "attn_course.flash.kernels_backward",
    "attention_backward_delta_kernel": "attn_course.flash.kernels_backward",
    "attention_forward_tma_kernel": "attn_course.flash.kernels_tma",
}
# Flash-decoding: at most this many queries; rows (query head, query) per decode program, the
# smaller when a group's G·N_q rows fit it; at most this many key splits, each a whole number of
# blocks of DECODE_SPLIT_ALIGN keys (the decode kernel reads it from here).
DECODE_MAX_QUERIES = 16
DECODE_BLOCK_M = (16, 64)
DECODE_MAX_SPLITS = 128
DECODE_SPLIT_ALIGN = 128
# The backward's first kernel (Δ = rowsum(dO ∘ O) and the base-2 log-sum-exp): query rows per program.
DELTA_BLOCK_M = 64


def kernel_configs(kernel: str, head_dim: int) -> tuple[KernelConfig, ...]:
    """The candidate launch configurations of ``kernel`` (``"forward"``, ``"backward_dkdv"``,
    ``"backward_dq"``, ``"decode"``) for a head dimension in :data:`SUPPORTED_HEAD_DIMS`, the
    default first. On a GPU the autotuner picks among them.

    Raises:
        ValueError: an unknown kernel or head dimension.

    Example:
        >>> [c.block_n for c in kernel_configs("forward", 64)]
        [64, 128, 64]
    """
    kernel_config(kernel, head_dim)        # validates both arguments
    return CONFIGS[kernel, head_dim]


def kernel_config(kernel: str, head_dim: int) -> KernelConfig:
    """The default launch configuration of ``kernel`` (``"forward"``, ``"backward_dkdv"``,
    ``"backward_dq"``, ``"decode"``) for a head dimension in :data:`SUPPORTED_HEAD_DIMS`: the
    one the interpreter runs, and the first the autotuner tries on a GPU.

    Raises:
        ValueError: an unknown kernel or head dimension.

    Example:
        >>> kernel_config("forward", 64)
        KernelConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
    """
    if kernel not in KERNEL_NAMES:
        raise ValueError(f"kernel_config: kernel must be one of {sorted(KERNEL_NAMES)}, got {kernel!r}")
    if (kernel, head_dim) not in CONFIGS:
        raise ValueError(f"kernel_config: head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim!r}")
    return CONFIGS[kernel, head_dim][0]


def atomic_dq_config(head_dim: int) -> KernelConfig:
    """The dK/dV configuration of the optional atomic-dQ backward
    (``attention_backward(..., deterministic=False)``) when none is given: the candidate with the
    widest key tile (the first of those), since each program adds into every dQ row it visits, so
    ``N_k / block_n`` atomic adds land on each element of dQ. No sm_90 build of it spills
    (``tests/flash/test_flash_spills.py``); at d = 64 the default (64, 64, 4, 3) would, by 8 bytes.

    Raises:
        ValueError: an unsupported head dimension.

    Example:
        >>> atomic_dq_config(64)
        KernelConfig(block_m=32, block_n=128, num_warps=8, num_stages=2)
    """
    return max(kernel_configs("backward_dkdv", head_dim), key=lambda config: config.block_n)
