"""Compile the FlashAttention kernels ahead of time for sm_80 and sm_90, on a machine without a GPU: what
Triton's interpreter accepts and a GPU compiler rejects (``tl.dot`` shapes below 16, dtype mix-ups, tiles
that overflow shared memory) is caught without one.

    python -m gpu_tools.aot [--all | --spills] [--resources] [SHARD/SHARDS]

(``TRITON_INTERPRET=0``, which ``main`` sets when it is unset: without a GPU Triton would be in
interpreter mode; a process has one mode.)
"""

from __future__ import annotations

import inspect
import itertools
import os
import sys
from typing import NamedTuple

from attn_course.flash.configs import (
    DECODE_BLOCK_M,
    DECODE_MAX_SPLITS,
    DELTA_BLOCK_M,
    KERNEL_NAMES,
    SUPPORTED_HEAD_DIMS,
    atomic_dq_config,
    kernel_configs,
)
from attn_course.flash.decode import decode_merge_width
from attn_course.flash.launch import kernel_function, runs_in_interpreter
from attn_course.flash.tma_configs import HOPPER_LIMITS, prune_tma_configs, tma_forward_configs
from gpu_tools.resources import resource_usage

__all__ = ["SHARED_MEMORY_LIMIT", "Case", "all_cases", "compile_case", "essential_cases", "main", "spill_cases"]

# Shared memory one thread block may use, in bytes (CUDA programming guide, "Technical
# specifications per compute capability"): A100 (sm_80) 163 KiB, H100/H200 (sm_90) 227 KiB.
SHARED_MEMORY_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
_TRITON_DTYPE = {"float16": "*fp16", "bfloat16": "*bf16"}
_CONSTEXPRS = ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "SPLITS", "ATOMIC_DQ", "HOST_DESCRIPTORS", "WARP_SPECIALIZE")
_TENSORS = ("Q", "K", "V", "Out", "dOut", "dQ", "dK", "dV")   # in the input dtype
_STATISTICS = ("LSE", "Delta", "LSE2", "PartialOut", "PartialLSE")     # float32
# The kernels without a KernelConfig, besides those of KERNEL_NAMES: flash-decoding's merge, the
# forward over tensor descriptors (its candidates are tma_forward_configs), the backward's Δ.
_OTHER_KERNELS = {"decode_merge": "attention_decode_merge_kernel", "forward_tma": "attention_forward_tma_kernel",
                  "backward_delta": "attention_backward_delta_kernel"}


class Case(NamedTuple):
    """One compilation: a kernel in one configuration, for one GPU (``capability`` 80 or 90).

    ``kernel`` is a key of :data:`~attn_course.flash.configs.KERNEL_NAMES`, ``"decode_merge"``,
    ``"forward_tma"`` or ``"backward_delta"``; ``config`` an index into its candidates
    (:func:`~attn_course.flash.configs.kernel_configs`, for the TMA forward
    :func:`~attn_course.flash.tma_configs.tma_forward_configs`; 0 for the merge and the Δ kernel).
    ``block_m``: the decode kernel's rows per program; ``splits``: the merge's ``SPLITS``. ``groups``: 0
    compiles ``num_kv_groups`` as a run-time integer (a launch with G > 1), 1 as the constant the JIT
    makes of a 1 (G = 1, loop unrolled). ``atomic_dq``: the dK/dV kernel's optional dQ by atomic adds;
    ``device_descriptors``, ``warp_specialize``: the TMA forward's options (descriptors built in the
    kernel, where Triton has no host-side ``TensorDescriptor``).
    """

    kernel: str
    config: int
    head_dim: int
    dtype: str
    causal: bool
    capability: int
    block_m: int = 0
    splits: int = 0
    groups: int = 0
    atomic_dq: bool = False
    device_descriptors: bool = False
    warp_specialize: bool = False

    @property
    def name(self) -> str:
        flags = {f"block_m={self.block_m}": self.kernel == "decode",
                 f"splits={self.splits}": self.kernel == "decode_merge", "G=1": self.groups == 1,
                 "atomic_dq": self.atomic_dq, "device_descriptors": self.device_descriptors,
                 "warp_specialize": self.warp_specialize}
        shape = "".join(f" {flag}" for flag, shown in flags.items() if shown)
        return (f"{self.kernel}[{self.config}]{shape} d={self.head_dim} {self.dtype} causal={self.causal} "
                f"sm_{self.capability}")


def _signature(kernel_function, pointer_type: str, *, aligned_strides: bool = True, groups: int = 0,
               descriptors: dict[str, list[int]] | None = None) -> tuple[dict[str, str], dict[str, int], dict]:
    """Triton's type string for each kernel parameter, specialised as the JIT specialises a launch on
    contiguous, 16-byte-aligned tensors: ``(signature, extra constants, attributes)`` for ``ASTSource``.

    The JIT compiles a variant per argument pattern (an integer equal to 1 becomes a constant, pointers
    and integers divisible by 16 are marked ``tt.divisibility``), and that decides the code: with the
    head dimension's stride known to be 1 and rows aligned, the compiler issues vector and asynchronous
    copies instead of one scalar load per element. So the last-dimension strides are the constant 1, the
    pointers and other strides divisible by 16 (plain ``i32`` with ``aligned_strides=False``: the TMA
    forward's descriptors carry its strides), the sizes plain ``i32``; ``groups=1`` makes
    ``num_kv_groups`` the constant 1; ``descriptors`` maps tensor parameters to the block shapes of the
    host-side tensor descriptors passed in their place.
    """
    signature, constants, attributes = {}, {}, {}
    for index, name in enumerate(inspect.signature(kernel_function.fn).parameters):
        if name in _CONSTEXPRS:
            signature[name] = "constexpr"
        elif name == "num_kv_groups" and groups == 1:
            signature[name] = "constexpr"
            constants[name] = 1
        elif name.startswith("stride_") and name.endswith("d"):      # stride_qd, ..., stride_dod
            signature[name] = "constexpr"
            constants[name] = 1
        elif descriptors and name in descriptors:
            block = ",".join(str(size) for size in descriptors[name])
            signature[name] = f"tensordesc<{pointer_type.removeprefix('*')}[{block}]>"
        elif name in _TENSORS or name in _STATISTICS:
            signature[name] = pointer_type if name in _TENSORS else "*fp32"
            attributes[(index,)] = [["tt.divisibility", 16]]
        elif name.startswith("stride_"):
            signature[name] = "i32"
            if aligned_strides:
                attributes[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name == "scale" else "i32"
    return signature, constants, attributes


def compile_case(case: Case):
    """Compile one :class:`Case`: Triton's compiled kernel (``.asm["ptx"]``, ``.metadata.shared`` in bytes, ...).

    Raises:
        RuntimeError: Triton is in interpreter mode (set ``TRITON_INTERPRET=0``).
        ValueError: an unknown dtype or kernel, or an option the kernel does not have.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if runs_in_interpreter():
        raise RuntimeError("compile_case: Triton is in interpreter mode; run with TRITON_INTERPRET=0")
    if case.dtype not in _TRITON_DTYPE:
        raise ValueError(f"compile_case: dtype must be one of {sorted(_TRITON_DTYPE)}, got {case.dtype!r}")
    if case.kernel not in KERNEL_NAMES and case.kernel not in _OTHER_KERNELS:
        raise ValueError(f"compile_case: kernel must be one of {sorted([*KERNEL_NAMES, *_OTHER_KERNELS])}, "
                         f"got {case.kernel!r}")
    if case.atomic_dq and case.kernel != "backward_dkdv":
        raise ValueError(f"compile_case: atomic_dq is an option of the backward_dkdv kernel, not {case.kernel!r}")
    if (case.device_descriptors or case.warp_specialize) and case.kernel != "forward_tma":
        raise ValueError(f"compile_case: device_descriptors and warp_specialize are options of the TMA forward, "
                         f"not {case.kernel!r}")
    if case.groups not in (0, 1):
        raise ValueError(f"compile_case: groups must be 0 (a run-time count) or 1, got {case.groups!r}")
    function = kernel_function(KERNEL_NAMES.get(case.kernel) or _OTHER_KERNELS[case.kernel])
    constants, options, descriptors = {"HEAD_DIM": case.head_dim}, {"num_warps": 4, "num_stages": 1}, None
    if case.kernel == "decode_merge":
        constants["SPLITS"] = case.splits
    elif case.kernel == "backward_delta":
        constants["BLOCK_M"] = DELTA_BLOCK_M
    else:
        tma = case.kernel == "forward_tma"
        candidates = tma_forward_configs(case.head_dim) if tma else kernel_configs(case.kernel, case.head_dim)
        config = candidates[case.config]
        constants.update(BLOCK_M=case.block_m if case.kernel == "decode" else config.block_m, BLOCK_N=config.block_n,
                         CAUSAL=case.causal)
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        if case.kernel == "backward_dkdv":
            constants["ATOMIC_DQ"] = case.atomic_dq
        if tma:
            constants.update(HOST_DESCRIPTORS=not case.device_descriptors, WARP_SPECIALIZE=case.warp_specialize)
            if not case.device_descriptors:
                rows = {"Q": config.block_m, "Out": config.block_m, "K": config.block_n, "V": config.block_n}
                descriptors = {name: [1, 1, size, case.head_dim] for name, size in rows.items()}
    signature, strides, attributes = _signature(function, _TRITON_DTYPE[case.dtype],
                                                aligned_strides=case.kernel != "forward_tma", groups=case.groups,
                                                descriptors=descriptors)
    source = ASTSource(fn=function, signature=signature, constexprs={**constants, **strides}, attrs=attributes)
    return triton.compile(source, target=GPUTarget("cuda", case.capability, 32), options=options)


def all_cases() -> list[Case]:
    """Every compilation the launcher can need on a GPU: every candidate of every kernel, head dim and
    causal flag for sm_80 and sm_90 in float16, the default candidate in bfloat16 too (2-byte types
    both: the same tiles and shared memory), the decode kernel at each row width, the merge at the
    smallest and largest ``SPLITS``, the Δ kernel in both dtypes."""
    capabilities, dtypes = sorted(SHARED_MEMORY_LIMIT), sorted(_TRITON_DTYPE)
    cases = []
    for kernel, head_dim, causal, capability in itertools.product(sorted(KERNEL_NAMES), SUPPORTED_HEAD_DIMS,
                                                                  (False, True), capabilities):
        for index in range(len(kernel_configs(kernel, head_dim))):
            for dtype in (dtypes if index == 0 else ["float16"]):
                for block_m in (DECODE_BLOCK_M if kernel == "decode" else (0,)):
                    cases.append(Case(kernel, index, head_dim, dtype, causal, capability, block_m=block_m))
    for head_dim, dtype, capability, splits in itertools.product(
            SUPPORTED_HEAD_DIMS, dtypes, capabilities, (decode_merge_width(1), decode_merge_width(DECODE_MAX_SPLITS))):
        cases.append(Case("decode_merge", 0, head_dim, dtype, False, capability, splits=splits))
    for head_dim, dtype, capability in itertools.product(SUPPORTED_HEAD_DIMS, dtypes, capabilities):
        cases.append(Case("backward_delta", 0, head_dim, dtype, False, capability))
    return cases


def essential_cases() -> list[Case]:
    """The cases ``make test`` compiles, about half of :func:`all_cases`: every kernel in its default
    configuration for every head dim, causal flag and GPU in float16, every other candidate at d = 64 and
    128, causal, and the defaults in bfloat16 at d = 64 on sm_90."""
    def wanted(case: Case) -> bool:
        if case.dtype == "bfloat16":
            return case.config == 0 and case.head_dim == 64 and case.capability == 90 and case.causal \
                and case.block_m in (0, 16) and case.splits in (0, 128)
        if case.kernel == "decode_merge":
            return case.splits == 128
        if case.kernel == "backward_delta":
            return True
        return case.config == 0 or (case.head_dim in (64, 128) and case.causal)

    return [case for case in all_cases() if wanted(case)]


def spill_cases(capability: int = 90) -> list[Case]:
    """The cases whose registers the spill test reads, in float16: every candidate of the forward and the two
    backward kernels, every head dim, causal or not, with G = 1 and a run-time G; the Δ kernel; the
    atomic-dQ dK/dV kernel in its default configuration (:func:`~attn_course.flash.configs.atomic_dq_config`);
    and on sm_90 the TMA forward in every candidate kept for an H100/H200
    (:func:`~attn_course.flash.tma_configs.prune_tma_configs`). bfloat16 is left out to halve the compile
    time: its registers, spills and shared memory were float16's in all 48 default-candidate cases
    measured (Triton 3.9, ptxas 13.4).

    Raises:
        ValueError: a capability other than 80 or 90.
    """
    if capability not in SHARED_MEMORY_LIMIT:
        raise ValueError(f"spill_cases: capability must be one of {sorted(SHARED_MEMORY_LIMIT)}, got {capability!r}")
    half = [case for case in all_cases() if case.capability == capability and case.dtype == "float16"]
    tiled = [case._replace(groups=groups) for case in half
             for groups in (1, 0) if case.kernel in ("forward", "backward_dkdv", "backward_dq")]
    delta = [case for case in half if case.kernel == "backward_delta"]
    atomic = [Case("backward_dkdv", kernel_configs("backward_dkdv", head_dim).index(atomic_dq_config(head_dim)),
                   head_dim, "float16", causal, capability, groups=groups, atomic_dq=True)
              for head_dim, causal, groups in itertools.product(SUPPORTED_HEAD_DIMS, (False, True), (1, 0))]
    tma = [Case("forward_tma", candidates.index(config), head_dim, "float16", causal, capability)
           for head_dim in SUPPORTED_HEAD_DIMS for candidates in [tma_forward_configs(head_dim)]
           for config in prune_tma_configs(candidates, head_dim, **HOPPER_LIMITS) for causal in (False, True)]
    return tiled + delta + atomic + (tma if capability == 90 else [])


def main(argv: list[str]) -> int:
    """Compile :func:`essential_cases` (:func:`all_cases` with ``--all``, :func:`spill_cases` with
    ``--spills``; a ``shard/shards`` slice if given) and print a line each: shared memory and its limit,
    whether the PTX uses ``wgmma``, and with ``--resources`` (implied by ``--spills``) the registers,
    spills and stack. Exit status 1 if anything is too big or spills."""
    # Compiling for a GPU needs Triton's compiler mode, which a machine without a GPU would not choose
    # by itself: unset, TRITON_INTERPRET means 0 here (before anything imports Triton).
    os.environ.setdefault("TRITON_INTERPRET", "0")
    options = {argument for argument in argv if argument.startswith("--")}
    unknown = options - {"--all", "--resources", "--spills"}
    if unknown:
        print(f"unknown options {sorted(unknown)}; use --all, --resources, --spills", file=sys.stderr)
        return 2
    cases = spill_cases() if "--spills" in options else all_cases() if "--all" in options else essential_cases()
    resources = bool(options & {"--resources", "--spills"})
    slices = [argument for argument in argv if not argument.startswith("--")]
    if slices:
        shard, shards = (int(part) for part in slices[0].split("/"))
        cases = cases[shard::shards]
    failures = 0
    for case in cases:
        compiled = compile_case(case)
        shared, limit = compiled.metadata.shared, SHARED_MEMORY_LIMIT[case.capability]
        failures += shared > limit
        verdict = "OK" if shared <= limit else "TOO BIG"
        figures = ""
        if resources:
            usage = resource_usage(compiled)
            figures = (f" registers {usage.registers} spill_stores {usage.spill_stores} "
                       f"spill_loads {usage.spill_loads} stack {usage.stack}")
            failures += usage.spills
            verdict = "SPILLS" if usage.spills and verdict == "OK" else verdict
        print(f"{case.name}: shared {shared} limit {limit} wgmma={'wgmma' in compiled.asm['ptx']}{figures} {verdict}",
              flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
