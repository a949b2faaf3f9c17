"""Launch the FlashAttention forward over tensor descriptors (TMA), the kernel of :mod:`attn_course.flash.kernels_tma`.

:func:`tma_forward_supported` is the launcher's switch: a Hopper GPU, a Triton with tensor
descriptors, and layouts TMA can read. :func:`attention_forward_tma` checks its inputs as every
kernel launcher does (:func:`~attn_course.flash.launch.check_kernel_inputs`), plus TMA's layout
rules, builds the four descriptors on the host once per call (Triton's
``triton.tools.tensor_descriptor.TensorDescriptor``; where a Triton lacks it, the kernel builds them
itself), and runs the kernel on the GPU or, without one, in Triton's interpreter. Given no
configuration on a GPU, it tunes: :func:`tuned_tma_config` times the candidates of
:func:`~attn_course.flash.tma_configs.tma_forward_configs` that
:func:`~attn_course.flash.tma_configs.prune_tma_configs` keeps for this GPU's limits, once per
length bucket (:func:`~attn_course.flash.launch.tuning_key`), and launches the winner afterwards.

The warp-specialised unmasked loop (``warp_specialize=True``, where the installed Triton's
``tl.range`` has the option) is off by default: Triton's issues report the Hopper warp-specialisation
pass crashing for exactly this shape, "a small FA2-like causal two-loop descriptor kernel"
(triton-lang/triton#9728, Triton 3.4 on an H100), and Triton enabled it on Hopper for the
tutorial's attention only without causality and with on-device descriptors (triton-lang/triton#7658);
it has never been run on a GPU here.
Ahead-of-time compilation for sm_90 is ``python -m gpu_tools.aot`` (:mod:`gpu_tools.aot`, apart from the course).
"""

from __future__ import annotations

import dataclasses
import inspect

import torch

from attn_course import _validate
from attn_course.flash.configs import GPU_DTYPES, SUPPORTED_HEAD_DIMS, KernelConfig
from attn_course.flash.launch import (
    ENABLE_FP_FUSION,
    cdiv,
    check_kernel_inputs,
    check_output_buffers,
    kernel_function,
    program_grid,
    record_tuned,
    tuned_config,
    tuning_key,
)
from attn_course.flash.tma_configs import gpu_limits, prune_tma_configs, time_candidates, tma_forward_configs
from attn_course.flash.triton_mode import is_interpreted

__all__ = [
    "TMA_ALIGNMENT",
    "attention_forward_tma",
    "has_device_tensor_descriptors",
    "host_tensor_descriptor",
    "launch_tma_forward",
    "tma_forward_config",
    "tma_forward_supported",
    "tuned_tma_config",
    "warp_specialize_supported",
]

#: TMA needs base addresses and all strides but the last in multiples of this many bytes.
TMA_ALIGNMENT = 16


def has_device_tensor_descriptors() -> bool:
    """Whether this Triton builds tensor descriptors inside kernels (``tl.make_tensor_descriptor``,
    Triton 3.3 and later) and takes an allocator for their scratch memory (``triton.set_allocator``)."""
    import triton
    import triton.language as tl

    return hasattr(tl, "make_tensor_descriptor") and hasattr(triton, "set_allocator")


def host_tensor_descriptor():
    """Triton's host-side ``TensorDescriptor`` class (``triton.tools.tensor_descriptor``, in Triton
    3.4 and later, 3.6 to 3.9 included), or None where this Triton has none."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


def warp_specialize_supported() -> bool:
    """Whether this Triton's ``tl.range`` takes ``warp_specialize`` (the option of :func:`attention_forward_tma`)."""
    import triton.language as tl

    try:
        return "warp_specialize" in inspect.signature(tl.range).parameters
    except (TypeError, ValueError):
        return False


def tma_forward_config(head_dim: int) -> dict[str, int]:
    """The default launch configuration of the TMA forward for ``head_dim``: the first of
    :func:`~attn_course.flash.tma_configs.tma_forward_configs`, which the GPU check's pinned tests
    run and the tuning times first.

    128 query rows per program, 3 stages of 64 keys with 4 warps for ``d`` up to 64; 128 keys with
    8 warps and 2 stages for ``d = 128`` (8 warps on 128 x 64 tiles is what Triton's tutorial
    prunes on Hopper). ``tests/flash/test_flash_tma.py`` compiles every candidate for sm_90.

    Args:
        head_dim: 16, 32, 64 or 128.

    Returns:
        ``dict(block_m=..., block_n=..., num_warps=..., num_stages=...)``, the keyword arguments
        of :func:`attention_forward_tma`.

    Raises:
        ValueError: another head dimension.

    Example:
        >>> tma_forward_config(128)
        {'block_m': 128, 'block_n': 128, 'num_warps': 8, 'num_stages': 2}
    """
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"tma_forward_config: head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim!r}")
    return dataclasses.asdict(tma_forward_configs(head_dim)[0])


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

    True only on a Hopper GPU (CUDA capability 9.x: H100, H200), with a Triton that has tensor
    descriptors (:func:`host_tensor_descriptor` or :func:`has_device_tensor_descriptors`), float16
    or bfloat16 tensors on that GPU, ``d`` in 16, 32, 64, 128, and layouts TMA can read: last-dimension stride 1, the
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
    descriptors = host_tensor_descriptor() is not None or has_device_tensor_descriptors()
    if not descriptors or is_interpreted(_tma_kernel()):
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
    check_output_buffers(where, q, out, lse)
    for name, tensor in (("q", q), ("k", k), ("v", v), ("out", out)):
        problem = _layout_problem(name, tensor)
        if problem:
            raise ValueError(f"{where}: {problem} (TMA's layout rules; .contiguous() gives one that fits)")
    return scale


def _descriptor_strides(tensor: torch.Tensor) -> list[int]:
    """``tensor``'s strides for a ``[B, heads, N, d]`` descriptor. A dimension of size 1 never
    moves the address, so its stride, which TMA would still check for alignment, is replaced by
    the one a contiguous layout would have there (a multiple of the row stride)."""
    strides = list(tensor.stride())
    for axis in (1, 0):
        if tensor.shape[axis] == 1:
            strides[axis] = strides[axis + 1] * tensor.shape[axis + 1]
    return strides


def launch_tma_forward(q, k, v, out, lse, *, causal: bool, scale: float, config: KernelConfig | None = None,
                       warp_specialize: bool = False, host_descriptors: bool | None = None) -> None:
    """The TMA kernel on inputs already checked (the core of :func:`attention_forward_tma`, and the
    Hopper path of :func:`~attn_course.flash.triton_attention.attention_forward`): in ``config``,
    or with none, in :func:`tuned_tma_config`'s; ``host_descriptors`` None: where this Triton has them."""
    if host_descriptors is None:
        host_descriptors = host_tensor_descriptor() is not None
    if config is None:
        config = tuned_tma_config(q, k, v, out, lse, causal=causal, scale=scale, warp_specialize=warp_specialize,
                                  host_descriptors=host_descriptors)
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    kernel = _tma_kernel()
    tensors = (q, k, v, out)
    if host_descriptors:
        # Built here, once per call: the kernel receives each as its base, shape and 64-bit strides.
        descriptor = host_tensor_descriptor()
        rows = (config.block_m, config.block_n, config.block_n, config.block_m)
        tensors = tuple(descriptor(t, list(t.shape), _descriptor_strides(t), [1, 1, size, head_dim])
                        for t, size in zip(tensors, rows))
    # Strides of the last dimension are 1 (checked), so the kernel takes only the other three.
    strides = [stride for t in (q, k, v, out) for stride in _descriptor_strides(t)[:3]]
    arguments = (*tensors, lse, *strides, heads, heads // k.shape[1], n_q, n_k, scale)
    options = dict(HEAD_DIM=head_dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n, CAUSAL=causal,
                   HOST_DESCRIPTORS=host_descriptors, WARP_SPECIALIZE=warp_specialize,
                   num_warps=config.num_warps, num_stages=config.num_stages, enable_fp_fusion=ENABLE_FP_FUSION)
    launch = kernel[program_grid(cdiv(n_q, config.block_m), batch * heads)]
    if is_interpreted(kernel):
        launch(*arguments, **options)
    else:
        if not host_descriptors:
            _ensure_allocator()
        with torch.cuda.device(q.device):   # Triton launches on the current device
            launch(*arguments, **options)


def tuned_tma_config(q, k, v, out, lse, *, causal: bool, scale: float, warp_specialize: bool = False,
                     host_descriptors: bool = True) -> KernelConfig:
    """The configuration the TMA forward runs for these inputs on a GPU: tuned once per length bucket.

    The winner recorded for their :func:`~attn_course.flash.launch.tuning_key` (lengths rounded up
    to powers of two) if there is one; otherwise each candidate that
    :func:`~attn_course.flash.tma_configs.prune_tma_configs` keeps for this GPU (its
    :func:`~attn_course.flash.tma_configs.gpu_limits`) is timed with ``triton.testing.do_bench``
    on these inputs (each compiled on first use), and the fastest is recorded and returned. A
    candidate that fails to compile or to launch (more shared memory than the GPU has, a ``ptxas``
    error, a compiler pass that fails) is skipped with a warning, as Triton's autotuner skips it
    (:func:`~attn_course.flash.tma_configs.time_candidates`). The timing runs write ``out`` and
    ``lse``. In Triton's interpreter: the default, untimed.
    ``tests/flash/gpu_setup.py`` replaces this function on a GPU by the default for every test but
    the one that tests the tuning.

    Args:
        q, k, v, out, lse: checked inputs of :func:`attention_forward_tma`.
        causal, scale, warp_specialize, host_descriptors: as there (part of what is timed).

    Returns:
        A :class:`~attn_course.flash.configs.KernelConfig`, one of
        :func:`~attn_course.flash.tma_configs.tma_forward_configs`.

    Raises:
        RuntimeError: no candidate ran (the message lists each one's error).
    """
    head_dim = q.shape[-1]
    candidates = tma_forward_configs(head_dim)
    if is_interpreted(_tma_kernel()):
        return candidates[0]
    lengths = {"n_q": q.shape[2], "n_k": k.shape[2], "num_kv_groups": q.shape[1] // k.shape[1]}
    variant = "forward_tma" + ("+ws" if warp_specialize else "") + ("" if host_descriptors else "+device")
    key = tuning_key(variant, head_dim, causal, {"q": q, "k": k, "v": v, "out": out, **lengths})
    winner = tuned_config(key)
    if winner is None:
        kept = prune_tma_configs(candidates, head_dim, **gpu_limits(q.device), element_bytes=q.element_size())
        times = time_candidates(kept, lambda config: launch_tma_forward(
            q, k, v, out, lse, causal=causal, scale=scale, config=config, warp_specialize=warp_specialize,
            host_descriptors=host_descriptors))
        winner = kept[times.index(min(times))]
        record_tuned(key, winner)
    return winner


def attention_forward_tma(q, k, v, out, lse, *, causal: bool = False, scale: float | None = None,
                          block_m: int | None = None, block_n: int | None = None, num_warps: int | None = None,
                          num_stages: int | None = None, warp_specialize: bool = False,
                          host_descriptors: bool | None = None):
    """Run the TMA forward kernel: attention output and each row's log-sum-exp, into ``out``, ``lse``.

    The counterpart of :func:`~attn_course.flash.triton_attention.attention_forward` for the TMA
    path; a launcher picks it when :func:`tma_forward_supported` says so. Runs on a GPU, or in
    Triton's interpreter (float16, float32) when that is Triton's mode. Causal query tiles are
    launched heaviest first (the last query tile, which sees the most keys, as program 0).

    Args:
        q: ``[B, H, N_q, d]``; k, v: ``[B, H_kv, N_k, d]`` with ``H % H_kv == 0`` (grouped-query),
            float16/bfloat16 on a GPU; last-dimension stride 1, other strides and data pointers
            multiples of 16 bytes.
        out: ``[B, H, N_q, d]`` in the input dtype, laid out by the same rules: written in full.
        lse: contiguous float32 ``[B, H, N_q]``: written in full.
        causal: bottom-right aligned: query ``i`` sees keys ``0 .. i + N_k - N_q`` (needs ``N_q <= N_k``).
        scale: softmax scale, default ``1 / sqrt(d)``.
        block_m, block_n: query and key rows per tile, powers of two, 16 to 256 (TMA's tile limit).
        num_warps, num_stages: warps per program and software pipelining depth. With none of the
            four given: :func:`tuned_tma_config` (tuned on a GPU, the default in the interpreter);
            with some, the others from :func:`tma_forward_config`.
        warp_specialize: the unmasked loop as ``tl.range(..., warp_specialize=True)``; off by
            default (see the module), only where :func:`warp_specialize_supported`.
        host_descriptors: build the descriptors on the host (``None``: where :func:`host_tensor_descriptor`
            exists), else in the kernel.

    Returns:
        ``(out, lse)``: ``out`` holds ``softmax(scale · q kᵀ) v``, ``lse[b, h, i] = log Σ_j exp(scale · q_i · k_j)``
        over the visible keys (natural log).

    Raises:
        TypeError: non-tensors, a non-bool ``causal``/``warp_specialize``/``host_descriptors``,
            non-int block sizes, an unsupported dtype.
        ValueError: mismatched shapes, empty inputs, causal with ``N_q > N_k``, a head dimension
            other than 16, 32, 64, 128, an ``lse`` of the wrong shape or dtype, a layout TMA cannot
            read (the message names the tensor), bad block sizes or launch options, an option this
            Triton lacks.
        RuntimeError: CPU tensors while Triton is in GPU mode.

    Example (on a Hopper GPU; not run as a doctest)::

            q = k = v = torch.randn(1, 2, 100, 64, device="cuda", dtype=torch.float16)
            out, lse = torch.empty_like(q), torch.empty(1, 2, 100, device="cuda")
            if tma_forward_supported(q, k, v, out):  # a Hopper GPU
                _ = attention_forward_tma(q, k, v, out, lse, causal=True)   # tuned for this bucket
    """
    where = "attention_forward_tma"
    scale = _check_tma_inputs(where, q, k, v, out, lse, causal, scale)
    _validate.boolean(where, "warp_specialize", warp_specialize)
    if warp_specialize and not warp_specialize_supported():
        raise ValueError(f"{where}: warp_specialize=True needs a Triton whose tl.range takes warp_specialize, "
                         "got one whose tl.range does not")
    if host_descriptors is None:
        host_descriptors = host_tensor_descriptor() is not None
    _validate.boolean(where, "host_descriptors", host_descriptors)
    if host_descriptors and host_tensor_descriptor() is None:
        raise ValueError(f"{where}: host_descriptors=True needs triton.tools.tensor_descriptor.TensorDescriptor, "
                         "which this Triton lacks")
    if not host_descriptors and not has_device_tensor_descriptors():
        raise ValueError(f"{where}: host_descriptors=False needs tl.make_tensor_descriptor, which this Triton lacks")
    sizes = {"block_m": block_m, "block_n": block_n, "num_warps": num_warps, "num_stages": num_stages}
    config = None                              # none of the four given: tuned
    if any(value is not None for value in sizes.values()):
        sizes = {name: tma_forward_config(q.shape[-1])[name] if value is None else value
                 for name, value in sizes.items()}
        config = KernelConfig(block_m=_power_of_two(where, "block_m", sizes["block_m"], 16, 256),
                              block_n=_power_of_two(where, "block_n", sizes["block_n"], 16, 256),
                              num_warps=_power_of_two(where, "num_warps", sizes["num_warps"], 1, 32),
                              num_stages=_validate.integer(where, "num_stages", sizes["num_stages"], minimum=1))
    launch_tma_forward(q, k, v, out, lse, causal=causal, scale=scale, config=config, warp_specialize=warp_specialize,
                       host_descriptors=host_descriptors)
    return out, lse
