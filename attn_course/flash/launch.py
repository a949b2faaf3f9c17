"""What every FlashAttention kernel launcher shares: the kernels in the right mode, one input check,
the output buffers, the configuration check, and the launch itself (autotuned on a GPU).

The launchers are :mod:`~attn_course.flash.triton_attention` (forward, backward),
:mod:`~attn_course.flash.decode` (flash-decoding) and :mod:`~attn_course.flash.tma_attention`
(the forward over tensor descriptors). Their public functions call :func:`check_kernel_inputs` once,
so every kernel refuses the same inputs with the same words; their inner steps check nothing again.
"""

from __future__ import annotations

import sys

import torch

from attn_course import _validate
from attn_course.flash.accuracy import check_attention_inputs
from attn_course.flash.configs import (
    CONFIGS,
    GPU_DTYPES,
    INTERPRETER_DTYPES,
    KERNEL_MODULES,
    KERNEL_NAMES,
    SUPPORTED_HEAD_DIMS,
    KernelConfig,
    kernel_configs,
)
from attn_course.flash.triton_mode import define_kernels, is_interpreted, triton_installed

__all__ = ["CUDA_GRID_LIMITS", "ENABLE_FP_FUSION", "TUNED_LENGTHS", "autotuned_kernel", "cdiv", "check_config",
           "check_kernel_inputs", "check_output_buffers", "kernel_function", "launch", "length_bucket",
           "output_buffers", "program_grid", "record_tuned", "runs_in_interpreter", "tuned_config", "tuned_configs",
           "tuning_key"]

_mode_note_shown = False
_autotuned: dict[tuple[str, int], object] = {}
#: The winner of each tuning, by :func:`tuning_key`: the lengths bucketed, so that decoding one more
#: token, or a batch of another length in the same bucket, reuses it instead of timing every candidate
#: again (Triton's autotuner keys on exact values: 25 + 100 ms of benchmarking per candidate each time).
_tuned: dict[tuple, KernelConfig] = {}
#: The kernel arguments whose values are lengths: bucketed by :func:`length_bucket` in the tuning key.
TUNED_LENGTHS = ("n_q", "n_k")
#: Fused multiply-adds in the compiled kernels, passed explicitly: it is Triton's default up to 3.9,
#: which warns that ``TRITON_DEFAULT_FP_FUSION`` turns it off by default in 3.10, and the accuracy
#: rule the kernels are tested against (``attn_course.flash.accuracy``) was tuned with it on.
ENABLE_FP_FUSION = True
#: The most programs a CUDA grid takes along x, y and z (CUDA programming guide, "Technical
#: specifications per compute capability": 2**31 - 1 along x, 65,535 along y and z, every GPU since sm_30).
CUDA_GRID_LIMITS = (2**31 - 1, 65535, 65535)


def kernel_function(name: str):
    """The ``@triton.jit`` function ``name`` (a key of :data:`~attn_course.flash.configs.KERNEL_MODULES`),
    defined in this process's mode (see :func:`~attn_course.flash.triton_mode.define_kernels`).

    Raises:
        ValueError: an unknown kernel.
        ImportError: Triton is not installed.
        RuntimeError: Triton was imported in a mode that cannot run here.
    """
    if name not in KERNEL_MODULES:
        raise ValueError(f"kernel_function: name must be one of {sorted(KERNEL_MODULES)}, got {name!r}")
    return getattr(define_kernels(KERNEL_MODULES[name]), name)


def runs_in_interpreter() -> bool:
    """Whether the kernels run in Triton's interpreter: without a CUDA GPU (unless
    ``TRITON_INTERPRET=0``), or with ``TRITON_INTERPRET=1``."""
    return is_interpreted(kernel_function("attention_forward_kernel"))


def check_kernel_inputs(where: str, q, k, v, causal, scale) -> float:
    """Validate the inputs of any FlashAttention kernel; return the softmax scale.

    Grouped-query ``k``/``v`` and bottom-right causal with ``N_q < N_k`` are allowed here (the
    course's eager attention check refuses both). Without a GPU the kernels run in Triton's
    interpreter, which takes float16 and float32 CPU tensors; on a GPU, float16 and bfloat16
    CUDA tensors. Where Triton is not installed, the same dtypes on each device go to the
    kernels' algorithm in PyTorch (:mod:`~attn_course.flash.without_triton`). The first call says
    once, on stderr, that the interpreter, or PyTorch, is in use.

    Args:
        where: the public function's name, for the messages.
        q: ``[B, H, N_q, d]``; k, v: ``[B, H_kv, N_k, d]`` with ``H % H_kv == 0``.
        causal: a bool; with it, ``N_q <= N_k``.
        scale: None (``1 / sqrt(d)``) or a positive finite number.

    Returns:
        The scale, a float.

    Raises:
        TypeError: non-tensors, a non-bool ``causal``, a dtype the kernels' mode does not take.
        ValueError: shapes that do not fit, ``d`` not in 16, 32, 64, 128, empty inputs, a bad scale.
        RuntimeError: CPU tensors while the kernels are compiled for a GPU.
    """
    scale = check_attention_inputs(where, q, k, v, causal, scale, value_dim_is_d=True)
    installed = triton_installed()
    interpreted = runs_in_interpreter() if installed else not q.is_cuda
    allowed = INTERPRETER_DTYPES if interpreted else GPU_DTYPES
    if q.dtype not in allowed:
        place = "in Triton's interpreter" if interpreted else "on a CUDA GPU"
        bfloat16_in_interpreter = interpreted and q.dtype == torch.bfloat16
        why = " (the interpreter's tl.dot cannot compute in bfloat16)" if bfloat16_in_interpreter else ""
        raise TypeError(f"{where}: dtype must be one of {[str(d) for d in allowed]} {place}, got {q.dtype}{why}")
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{where}: head dimension d must be one of {SUPPORTED_HEAD_DIMS}, got {q.shape[-1]}")
    if min(q.shape[:3]) == 0 or k.shape[2] == 0:
        raise ValueError(f"{where}: B, H, N_q and N_k must be at least 1, got q {_validate.shape_str(q)}, "
                         f"k {_validate.shape_str(k)}")
    if not interpreted and not q.is_cuda:
        raise RuntimeError(
            f"{where}: got {q.device} tensors, but the Triton kernels are compiled for a GPU (TRITON_INTERPRET=0, "
            "or a CUDA GPU is present). Move the tensors to CUDA, or start Python with TRITON_INTERPRET=1 to run "
            "the kernels in Triton's interpreter.")
    _note_mode(installed, interpreted)
    return scale


def _note_mode(installed: bool, interpreted: bool) -> None:
    global _mode_note_shown
    if _mode_note_shown or (installed and not interpreted):
        return
    _mode_note_shown = True
    if installed:
        print("attn_course.flash: no CUDA GPU, so the Triton kernels run in Triton's interpreter (the same "
              "kernel code, executed tile by tile with NumPy: exact but slow; keep N small).", file=sys.stderr)
    else:
        print("attn_course.flash: Triton is not installed (it ships for Linux), so the kernels' algorithm runs "
              "in PyTorch instead: chapter 06's tiled_attention, the same tiles and online softmax, not the "
              "compiled kernel.", file=sys.stderr)


def output_buffers(q: torch.Tensor, out=None, lse=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's ``out [B, H, N_q, d]`` and ``lse [B, H, N_q]`` (float32): the ones given, else new ones."""
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if lse is None:
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    return out, lse


def check_output_buffers(where: str, q: torch.Tensor, out, lse) -> None:
    """A public launcher's optional ``out`` and ``lse``: None, or shaped, typed and placed for ``q``.

    Raises:
        TypeError: a buffer that is not a tensor.
        ValueError: ``out`` not shaped, typed and placed like ``q``; ``lse`` not contiguous float32 ``[B, H, N_q]``.
    """
    if out is not None:
        _validate.tensor(where, "out", out)
        if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
            raise ValueError(f"{where}: out must be shaped like q {_validate.shape_str(q)}, got "
                             f"{_validate.shape_str(out)} (and be {q.dtype} on {q.device}, got {out.dtype} on "
                             f"{out.device})")
    if lse is not None:
        _validate.tensor(where, "lse", lse)
        if lse.shape != q.shape[:3] or lse.dtype != torch.float32 or not lse.is_contiguous() or lse.device != q.device:
            raise ValueError(f"{where}: lse must be contiguous float32 [B, H, N_q] = {list(q.shape[:3])} on "
                             f"{q.device}, got {_validate.shape_str(lse)} {lse.dtype} on {lse.device}")


def check_config(where: str, name: str, config: object, kernel: str, head_dim: int) -> KernelConfig | None:
    """``config`` must be None (autotune on a GPU, the default in the interpreter) or one of
    :func:`~attn_course.flash.configs.kernel_configs` ``(kernel, head_dim)``.

    Raises:
        ValueError: anything else.
    """
    if config is None:
        return None
    candidates = kernel_configs(kernel, head_dim)
    if not isinstance(config, KernelConfig) or config not in candidates:
        raise ValueError(f"{where}: {name} must be None or one of kernel_configs({kernel!r}, {head_dim}) "
                         f"(the configurations compiled and checked ahead of time), got {config!r}")
    return config


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive integers."""
    return -(-a // b)


def autotuned_kernel(kernel: str, head_dim: int):
    """On a GPU: ``kernel`` wrapped in ``triton.autotune`` over its candidates, built once.

    The autotuner times every candidate on the first call for each key (lengths, group size,
    causality; Triton adds the tensors' dtypes). :func:`launch` calls it once per
    :func:`tuning_key` (lengths bucketed to powers of two) and launches the winner itself afterwards,
    so that a generation loop does not re-tune at every token. Decode configurations tune only
    ``BLOCK_N``: its ``BLOCK_M`` follows from the rows.
    """
    if (kernel, head_dim) not in _autotuned:
        import triton

        configs = [triton.Config(_block_sizes(kernel, c), num_warps=c.num_warps, num_stages=c.num_stages)
                   for c in CONFIGS[kernel, head_dim]]
        function = kernel_function(KERNEL_NAMES[kernel])
        _autotuned[kernel, head_dim] = triton.autotune(configs=configs, key=["n_q", "n_k", "num_kv_groups", "CAUSAL"])(
            function)
    return _autotuned[kernel, head_dim]


def _block_sizes(kernel: str, config: KernelConfig) -> dict[str, int]:
    """The tile sizes ``kernel`` takes from ``config``; decoding's ``BLOCK_M`` follows from its rows."""
    return {"BLOCK_N": config.block_n} if kernel == "decode" else {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n}


def length_bucket(n: int) -> int:
    """The length a tuning decision is shared across: the next power of two at or above ``n``, at
    least 16 (the smallest tile), so that lengths 1,025 to 2,048 share one tuning.

    Raises:
        TypeError, ValueError: ``n`` not an int >= 1.

    Example:
        >>> [length_bucket(n) for n in (1, 16, 17, 1000, 1024, 1025)]
        [16, 16, 32, 1024, 1024, 2048]
    """
    n = _validate.integer("length_bucket", "n", n, minimum=1)
    return max(16, 1 << (n - 1).bit_length())


def tuning_key(kernel: str, head_dim: int, causal: bool, arguments: dict) -> tuple:
    """What one tuning decision is reused for: the kernel, head dimension, causality, the tensors'
    dtypes, the other integer arguments Triton's autotuner would key on (``num_kv_groups``), and the
    lengths (:data:`TUNED_LENGTHS`) bucketed by :func:`length_bucket`.

    Args:
        arguments: the kernel's arguments by name (tensors, ints, floats).

    Example:
        >>> tuning_key("decode", 64, False, {"n_q": 1, "n_k": 1000, "num_kv_groups": 4, "scale": 0.125})
        ('decode', 64, False, (), (('n_k', 1024), ('n_q', 16), ('num_kv_groups', 4)))
    """
    dtypes = tuple(str(value.dtype) for value in arguments.values() if isinstance(value, torch.Tensor))
    integers = tuple(sorted((name, length_bucket(value) if name in TUNED_LENGTHS else value)
                            for name, value in arguments.items()
                            if isinstance(value, int) and not isinstance(value, bool)
                            and (name in TUNED_LENGTHS or name == "num_kv_groups")))
    return (kernel, head_dim, causal, dtypes, integers)


def tuned_configs() -> dict[tuple, KernelConfig]:
    """The winners of this process's tunings so far, by :func:`tuning_key` (a copy): what
    :func:`launch` runs for inputs in each bucket. Empty in the interpreter, which never tunes."""
    return dict(_tuned)


def tuned_config(key: tuple) -> KernelConfig | None:
    """The winner recorded for ``key`` (a :func:`tuning_key`), or None: what a launcher that tunes
    by itself (:func:`~attn_course.flash.tma_attention.attention_forward_tma`) looks up first."""
    return _tuned.get(key)


def record_tuned(key: tuple, config: KernelConfig) -> None:
    """Record ``config`` as the winner for ``key`` (a :func:`tuning_key`), beside :func:`launch`'s own.

    Raises:
        TypeError: ``key`` not a tuple, ``config`` not a :class:`~attn_course.flash.configs.KernelConfig`.
    """
    if not isinstance(key, tuple):
        raise TypeError(f"record_tuned: key must be a tuple from tuning_key, got {type(key).__name__}")
    _validate.instance("record_tuned", "config", config, KernelConfig)
    _tuned[key] = config


def _config_of(best, kernel: str, head_dim: int) -> KernelConfig | None:
    """The candidate of ``CONFIGS`` that ``best`` (a ``triton.Config``) is, or None."""
    sizes = getattr(best, "kwargs", {}) or {}
    for candidate in CONFIGS[kernel, head_dim]:
        if (sizes.get("BLOCK_N") == candidate.block_n and sizes.get("BLOCK_M", candidate.block_m) == candidate.block_m
                and getattr(best, "num_warps", None) == candidate.num_warps
                and getattr(best, "num_stages", None) == candidate.num_stages):
            return candidate
    return None


def program_grid(tiles: int, batch_heads: int, extra: int = 1) -> tuple[int, int, int]:
    """The grid of a kernel that runs ``tiles`` programs for each of ``batch_heads`` (batch, head) pairs
    (or (batch, key/value head) pairs): all ``tiles · batch_heads`` along x, tile fastest, ``extra``
    along z. Program ``p`` runs tile ``p % tiles`` of pair ``p // tiles``: the order a
    ``(tiles, batch_heads)`` grid would give, without its y axis, which CUDA caps at 65,535 (fewer
    than ``B·H`` can be: 2048 sequences of 32 heads).

    Raises:
        TypeError, ValueError: an argument not an int >= 1, or a grid past :data:`CUDA_GRID_LIMITS`.

    Example:
        >>> program_grid(2, 2048 * 32)        # a decode step of 2048 sequences, 32 key/value heads, 2 splits
        (131072, 1, 1)
    """
    tiles, batch_heads, extra = _validate.integers("program_grid", minimum=1, tiles=tiles, batch_heads=batch_heads,
                                                   extra=extra)
    grid = (tiles * batch_heads, 1, extra)
    if any(size > limit for size, limit in zip(grid, CUDA_GRID_LIMITS)):
        raise ValueError(f"program_grid: CUDA takes at most {CUDA_GRID_LIMITS} programs along (x, y, z), got {grid} "
                         f"for {tiles} tiles of {batch_heads} (batch, head) pairs and {extra} along z")
    return grid


def launch(kernel: str, grid_rows: int, batch_heads: int, *args, head_dim: int, causal: bool,
           config: KernelConfig | None = None, extra_grid: int = 1, **constants) -> None:
    """Launch ``kernel`` over :func:`program_grid` ``(cdiv(grid_rows, tile), batch_heads, extra_grid)``.

    The tile along ``grid_rows`` is ``BLOCK_N`` for the dK/dV kernel (it owns keys), ``BLOCK_M``
    otherwise; the decode kernel's grid rows are its splits (tile 1). A given ``config``, or the
    interpreter, fixes the configuration; otherwise the autotuner picks it.
    """
    def tile(meta):
        if kernel == "decode":
            return 1
        return meta["BLOCK_N"] if kernel == "backward_dkdv" else meta["BLOCK_M"]

    if config is None and runs_in_interpreter():
        config = CONFIGS[kernel, head_dim][0]
    key = None
    if config is None:
        names = kernel_function(KERNEL_NAMES[kernel]).arg_names
        key = tuning_key(kernel, head_dim, causal, {**dict(zip(names, args)), **constants})
        config = _tuned.get(key)                     # tuned before for this bucket: launch its winner
    if config is not None:
        sizes = _block_sizes(kernel, config)
        grid = program_grid(cdiv(grid_rows, tile(sizes)), batch_heads, extra_grid)
        kernel_function(KERNEL_NAMES[kernel])[grid](
            *args, HEAD_DIM=head_dim, CAUSAL=causal, **sizes, **constants,
            num_warps=config.num_warps, num_stages=config.num_stages, enable_fp_fusion=ENABLE_FP_FUSION,
        )
    else:
        def grid(meta):
            return program_grid(cdiv(grid_rows, tile(meta)), batch_heads, extra_grid)

        tuner = autotuned_kernel(kernel, head_dim)
        tuner[grid](*args, HEAD_DIM=head_dim, CAUSAL=causal, enable_fp_fusion=ENABLE_FP_FUSION, **constants)
        winner = _config_of(getattr(tuner, "best_config", None), kernel, head_dim)
        if winner is not None:
            _tuned[key] = winner
