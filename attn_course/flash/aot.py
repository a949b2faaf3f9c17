"""Compile the FlashAttention kernels ahead of time for a GPU, on a machine with none.

Triton's interpreter accepts things a GPU compiler rejects (``tl.dot`` shapes below 16,
dtype mix-ups, tiles that overflow shared memory). Compiling every kernel in every
configuration of :data:`~attn_course.flash.triton_attention.CONFIGS` for real targets
catches those without a GPU:

    TRITON_INTERPRET=0 python -m attn_course.flash.aot [SHARD/SHARDS]

(``TRITON_INTERPRET=0`` keeps :mod:`attn_course` from selecting the interpreter.)

The result's ``metadata.shared`` is the shared memory a program needs, in bytes.
"""

from __future__ import annotations

import itertools
import sys

# Shared memory one thread block may use, in bytes (CUDA programming guide, "Technical
# specifications per compute capability"): A100 (sm_80) 163 KiB, H100/H200 (sm_90) 227 KiB.
SHARED_MEMORY_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
_TRITON_DTYPE = {"float16": "*fp16", "bfloat16": "*bf16"}


_CONSTEXPRS = ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL")
_TENSORS = ("Q", "K", "V", "Out", "dOut", "dQ", "dK", "dV")   # in the input dtype
_STATISTICS = ("LSE", "Delta")                                 # float32


def _signature(kernel_function, pointer_type: str) -> dict[str, str]:
    """Triton's type string for each kernel parameter (the strides and sizes are i32)."""
    import inspect

    signature = {}
    for name in inspect.signature(kernel_function.fn).parameters:
        if name in _CONSTEXPRS:
            signature[name] = "constexpr"
        elif name in _TENSORS:
            signature[name] = pointer_type
        elif name in _STATISTICS:
            signature[name] = "*fp32"
        else:
            signature[name] = "fp32" if name == "scale" else "i32"
    return signature


def compile_kernel(kernel: str, head_dim: int, dtype: str, causal: bool, capability: int):
    """Compile one kernel for ``sm_<capability>`` and return Triton's compiled kernel.

    Args:
        kernel: ``"forward"``, ``"backward_dkdv"`` or ``"backward_dq"``.
        head_dim: one of :data:`~attn_course.flash.triton_attention.SUPPORTED_HEAD_DIMS`.
        dtype: ``"float16"`` or ``"bfloat16"``.
        causal: the ``CAUSAL`` specialisation.
        capability: 80 (A100) or 90 (H100/H200).

    Raises:
        RuntimeError: Triton is in interpreter mode (set ``TRITON_INTERPRET=0``).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attn_course.flash import kernels
    from attn_course.flash.triton_attention import KERNEL_NAMES, kernel_config, runs_in_interpreter

    if runs_in_interpreter():
        raise RuntimeError("compile_kernel: Triton is in interpreter mode; run with TRITON_INTERPRET=0")
    if dtype not in _TRITON_DTYPE:
        raise ValueError(f"compile_kernel: dtype must be one of {sorted(_TRITON_DTYPE)}, got {dtype!r}")
    config = kernel_config(kernel, head_dim)
    kernel_function = getattr(kernels, KERNEL_NAMES[kernel])
    constants = {"HEAD_DIM": head_dim, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "CAUSAL": causal}
    source = ASTSource(fn=kernel_function, signature=_signature(kernel_function, _TRITON_DTYPE[dtype]),
                       constexprs=constants)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": config.num_warps, "num_stages": config.num_stages})


def all_cases():
    """Every (kernel, head_dim, dtype, causal, capability) the launcher can pick on a GPU."""
    from attn_course.flash.triton_attention import KERNEL_NAMES, SUPPORTED_HEAD_DIMS

    return list(itertools.product(sorted(KERNEL_NAMES), SUPPORTED_HEAD_DIMS, sorted(_TRITON_DTYPE),
                                  (False, True), sorted(SHARED_MEMORY_LIMIT)))


def main(argv: list[str]) -> int:
    """Compile the cases (all, or the ``shard/shards`` slice given as ``argv[0]``), print one
    line each: the case, shared memory in bytes, the limit, and OK or TOO BIG."""
    cases = all_cases()
    if argv:
        shard, shards = (int(part) for part in argv[0].split("/"))
        cases = cases[shard::shards]
    failures = 0
    for kernel, head_dim, dtype, causal, capability in cases:
        compiled = compile_kernel(kernel, head_dim, dtype, causal, capability)
        shared, limit = compiled.metadata.shared, SHARED_MEMORY_LIMIT[capability]
        failures += shared > limit
        print(f"{kernel} d={head_dim} {dtype} causal={causal} sm_{capability}: shared {shared} "
              f"limit {limit} {'OK' if shared <= limit else 'TOO BIG'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
