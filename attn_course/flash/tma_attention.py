"""Launch the FlashAttention forward over tensor descriptors (TMA), the kernel of :mod:`attn_course.flash.kernels_tma`.

:func:`tma_forward_supported` is the launcher's switch: a Hopper GPU, a Triton with device-side
tensor descriptors, and layouts TMA can read. :func:`attention_forward_tma` checks its inputs as
every kernel launcher does (:func:`~attn_course.flash.launch.check_kernel_inputs`), plus TMA's
layout rules, and runs the kernel on the GPU or, without one, in Triton's interpreter.
Ahead-of-time compilation for sm_90 is :func:`~attn_course.flash.aot.compile_tma_forward`.
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.flash.configs import GPU_DTYPES, SUPPORTED_HEAD_DIMS
from attn_course.flash.launch import ENABLE_FP_FUSION, cdiv, check_kernel_inputs, kernel_function, output_buffers
from attn_course.flash.triton_mode import is_interpreted

__all__ = [
    "TMA_ALIGNMENT",
    "attention_forward_tma",
    "has_device_tensor_descriptors",
    "tma_forward_config",
    "tma_forward_supported",
]

#: TMA needs base addresses and all strides but the last in multiples of this many bytes.
TMA_ALIGNMENT = 16



def has_device_tensor_descriptors() -> bool:
    """Whether this Triton builds tensor descriptors inside kernels (``tl.make_tensor_descriptor``,
    Triton 3.3 and later) and takes an allocator for their scratch memory (``triton.set_allocator``)."""
    import triton
    import triton.language as tl

    return hasattr(tl, "make_tensor_descriptor") and hasattr(triton, "set_allocator")


def tma_forward_config(head_dim: int) -> dict[str, int]:
    """The launch configuration of the TMA forward for ``head_dim`` on sm_90.

    The pointer forward's (:func:`~attn_course.flash.triton_attention.kernel_config`): 128 query
    rows and 64 key rows per tile, 4 warps (8 for ``d = 128``: the float32 accumulator, 128 × 128,
    would take 128 registers per thread over 4 warps), 3 pipeline stages (K and V tiles in flight
    while the previous one is multiplied). ``tests/flash/test_flash_tma.py`` compiles each for sm_90:
    66,560 bytes of shared memory for ``d = 64``, 132,096 for ``d = 128`` (the limit is 232,448).

    Args:
        head_dim: 16, 32, 64 or 128.

    Returns:
        ``dict(block_m=..., block_n=..., num_warps=..., num_stages=...)``, the keyword arguments
        of :func:`attention_forward_tma`.

    Raises:
        ValueError: another head dimension.
    """
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"tma_forward_config: head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim!r}")
    return {"block_m": 128, "block_n": 64, "num_warps": 8 if head_dim == 128 else 4, "num_stages": 3}


def _tma_kernel():
    """The TMA forward kernel, defined in this machine's mode."""
    return kernel_function("attention_forward_tma_kernel")


def _layout_problem(name: str, tensor: torch.Tensor) -> str | None:
    """Why TMA cannot read ``tensor`` ``[B, heads, N, d]`` through per-(batch, head) descriptors, or None.

    A dimension of size 1 never moves the address (its index is always 0), so its stride is free;
    the row stride is part of the descriptor and must be aligned whatever the length.
    """
    size = tensor.element_size()
    if tensor.stride(-1) != 1:
        return f"{name} must have stride 1 in its last dimension (d), got strides {tuple(tensor.stride())}"
    if tensor.data_ptr() % TMA_ALIGNMENT:
        return f"{name}'s data pointer must be a multiple of {TMA_ALIGNMENT} bytes, got address {tensor.data_ptr()}"
    for axis in (0, 1, 2):
        if (axis == 2 or tensor.shape[axis] > 1) and (tensor.stride(axis) * size) % TMA_ALIGNMENT:
            return (f"{name}'s strides (but the last) must be multiples of {TMA_ALIGNMENT} bytes, got strides "
                    f"{tuple(tensor.stride())} of {size}-byte elements")
    return None


def tma_forward_supported(q, k, v, out=None) -> bool:
    """Whether :func:`attention_forward_tma` should run on these inputs: the launcher's switch.

    True only on a Hopper GPU (CUDA capability 9.x: H100, H200), with a Triton that builds tensor
    descriptors in kernels (:func:`has_device_tensor_descriptors`), float16 or bfloat16 tensors on
    that GPU, ``d`` in 16, 32, 64, 128, and layouts TMA can read: last-dimension stride 1, the
    other strides and each data pointer multiples of :data:`TMA_ALIGNMENT` bytes. False in
    Triton's interpreter (it runs the kernel, see the tests, but gains nothing from TMA). Shapes
    are not checked here; :func:`attention_forward_tma` does that.

    Args:
        q: ``[B, H, N_q, d]``; k, v: ``[B, H_kv, N_k, d]``.
        out: the ``[B, H, N_q, d]`` output buffer, if the caller provides one (it is written by TMA).

    Returns:
        bool.

    Raises:
        TypeError: an argument is not a tensor.
    """
    tensors = {"q": q, "k": k, "v": v, **({} if out is None else {"out": out})}
    for name, tensor in tensors.items():
        _validate.tensor("tma_forward_supported", name, tensor)
    if not has_device_tensor_descriptors() or is_interpreted(_tma_kernel()):
        return False
    if not all(t.is_cuda and t.device == q.device and t.dtype == q.dtype and t.dim() == 4 for t in tensors.values()):
        return False
    if q.dtype not in GPU_DTYPES or q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        return False
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    return all(_layout_problem(name, tensor) is None for name, tensor in tensors.items())


def _scratch_allocator(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global scratch for the descriptors Triton builds on the device (128 bytes each), from
    PyTorch's caching allocator on the current device (its blocks are 512-byte aligned)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """Install :func:`_scratch_allocator` unless an allocator is already set.

    Triton has no public getter; ``triton.runtime._allocation._allocator`` holds the allocator
    (a ``ContextVar`` in recent Triton, so a new thread starts without one and gets ours on its
    first launch), and its default is a ``NullAllocator`` that raises at launch.
    """
    global _allocator_installed
    try:
        from triton.runtime import _allocation

        current = _allocation._allocator
        current = current.get() if hasattr(current, "get") else current
        unset = isinstance(current, _allocation.NullAllocator)
    except (ImportError, AttributeError):   # a Triton whose internals moved: install ours once
        unset = not _allocator_installed
    if unset:
        import triton

        triton.set_allocator(_scratch_allocator)
        _allocator_installed = True


_allocator_installed = False


def _power_of_two(where: str, name: str, value, minimum: int, maximum: int) -> int:
    value = _validate.integer(where, name, value, minimum=minimum)
    if value > maximum or value & (value - 1):
        raise ValueError(f"{where}: {name} must be a power of two from {minimum} to {maximum}, got {value}")
    return value


def _check_tma_inputs(where, q, k, v, out, lse, causal, scale) -> float:
    """The kernels' common checks (:func:`~attn_course.flash.launch.check_kernel_inputs`), the
    buffers, and TMA's layout rules; return the scale."""
    _validate.four_d(where, out=out)
    _validate.tensor(where, "lse", lse)
    scale = check_kernel_inputs(where, q, k, v, causal, scale)
    output_buffers(where, q, out, lse)
    for name, tensor in (("q", q), ("k", k), ("v", v), ("out", out)):
        problem = _layout_problem(name, tensor)
        if problem:
            raise ValueError(f"{where}: {problem} (TMA's layout rules; .contiguous() gives one that fits)")
    return scale


def attention_forward_tma(q, k, v, out, lse, *, causal: bool = False, scale: float | None = None,
                          block_m: int = 128, block_n: int = 64, num_warps: int | None = None,
                          num_stages: int = 3):
    """Run the TMA forward kernel: attention output and each row's log-sum-exp, into ``out``, ``lse``.

    The counterpart of :func:`~attn_course.flash.triton_attention.attention_forward` for the TMA
    path; a launcher picks it when :func:`tma_forward_supported` says so. Runs on a GPU, or in
    Triton's interpreter (float16, float32) when that is Triton's mode.

    Args:
        q: ``[B, H, N_q, d]``; k, v: ``[B, H_kv, N_k, d]`` with ``H % H_kv == 0`` (grouped-query),
            float16/bfloat16 on a GPU; last-dimension stride 1, other strides and data pointers
            multiples of 16 bytes.
        out: ``[B, H, N_q, d]`` in the input dtype, laid out by the same rules: written in full.
        lse: contiguous float32 ``[B, H, N_q]``: written in full.
        causal: bottom-right aligned: query ``i`` sees keys ``0 .. i + N_k - N_q`` (needs ``N_q <= N_k``).
        scale: softmax scale, default ``1 / sqrt(d)``.
        block_m, block_n: query and key rows per tile, powers of two, 16 to 256 (TMA's tile limit).
        num_warps: default 8 for ``d = 128``, else 4. num_stages: software pipelining depth.
            :func:`tma_forward_config` gives the tested configuration per head dimension.

    Returns:
        ``(out, lse)``: ``out`` holds ``softmax(scale · q kᵀ) v``, ``lse[b, h, i] = log Σ_j exp(scale · q_i · k_j)``
        over the visible keys (natural log).

    Raises:
        TypeError: non-tensors, a non-bool ``causal``, non-int block sizes, an unsupported dtype.
        ValueError: mismatched shapes, empty inputs, causal with ``N_q > N_k``, a head dimension
            other than 16, 32, 64, 128, an ``lse`` of the wrong shape or dtype, a layout TMA cannot
            read (the message names the tensor), bad block sizes or launch options.
        RuntimeError: CPU tensors while Triton is in GPU mode.

    Example (on a Hopper GPU; not run as a doctest)::

            q = k = v = torch.randn(1, 2, 100, 64, device="cuda", dtype=torch.float16)
            out, lse = torch.empty_like(q), torch.empty(1, 2, 100, device="cuda")
            if tma_forward_supported(q, k, v, out):  # a Hopper GPU
                _ = attention_forward_tma(q, k, v, out, lse, causal=True, **tma_forward_config(64))
    """
    where = "attention_forward_tma"
    scale = _check_tma_inputs(where, q, k, v, out, lse, causal, scale)
    block_m = _power_of_two(where, "block_m", block_m, 16, 256)
    block_n = _power_of_two(where, "block_n", block_n, 16, 256)
    num_warps = (8 if q.shape[-1] == 128 else 4) if num_warps is None else num_warps
    num_warps = _power_of_two(where, "num_warps", num_warps, 1, 32)
    num_stages = _validate.integer(where, "num_stages", num_stages, minimum=1)
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    # Strides of the last dimension are 1 (checked), so the kernel takes only the other three.
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3])
    grid = (cdiv(n_q, block_m), batch * heads)
    kernel = _tma_kernel()
    launch = kernel[grid]
    arguments = (q, k, v, out, lse, *strides, heads, heads // k.shape[1], n_q, n_k, scale)
    options = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
                   num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=ENABLE_FP_FUSION)
    if is_interpreted(kernel):
        launch(*arguments, **options)
    else:
        _ensure_allocator()
        with torch.cuda.device(q.device):   # Triton launches on the current device
            launch(*arguments, **options)
    return out, lse
