"""``flash_attention``: the Triton kernels of :mod:`attn_course.flash.kernels`, made differentiable.

With a CUDA GPU the kernels are compiled for it. Without one, the *same kernel source*
runs through Triton's interpreter, which executes each tile operation with NumPy on CPU
tensors: exact, slow, and good for learning and testing. Triton picks the mode once, when
it is imported, from ``TRITON_INTERPRET``; :mod:`attn_course` sets that variable on
machines without a GPU (see :mod:`attn_course._triton_mode`).

Launch configurations come from one table, :data:`CONFIGS`: a short list of candidates per
kernel and head dimension. On a GPU, ``triton.autotune`` times the candidates on the first
call for each shape and keeps the fastest; in Triton's interpreter (no GPU driver to time
with) the first candidate of the same list runs. The ahead-of-time compile test
(``tests/flash/test_flash_compile.py``) compiles every candidate for sm_80 and sm_90.

For a few queries against a long cache (``N_q <= 16``, decoding) :func:`flash_attention` uses
flash-decoding (:func:`attention_decode_forward`): the keys are split across programs and the
partial results merged by the log-sum-exp rule.
"""

from __future__ import annotations

import math
import sys
import types

import torch

from attn_course import _validate

__all__ = [
    "CONFIGS",
    "SUPPORTED_HEAD_DIMS",
    "KernelConfig",
    "attention_backward",
    "attention_forward",
    "flash_attention",
    "decode_attention",
    "attention_decode_forward",
    "decode_num_splits",
    "kernel_config",
    "kernel_configs",
    "load_kernels",
    "runs_in_interpreter",
]

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
GPU_DTYPES = (torch.float16, torch.bfloat16)
# The interpreter's tl.dot gives wrong results for bfloat16 (NumPy has no bfloat16).
INTERPRETER_DTYPES = (torch.float16, torch.float32)
_LOG2_E = 1.4426950408889634


class KernelConfig(types.SimpleNamespace):
    """Tile sizes and launch options of one kernel: ``block_m`` query rows and ``block_n`` key
    rows per tile, ``num_warps`` and ``num_stages`` (software pipelining depth) on a GPU."""


def _config(block_m: int, block_n: int, num_warps: int, num_stages: int) -> KernelConfig:
    return KernelConfig(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages)


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
    # dK/dV: block_n keys held per program, block_m queries streamed per step.
    "backward_dkdv": {
        16: [(64, 64, 4, 3)], 32: [(64, 64, 4, 3)],
        64: [(64, 64, 4, 3), (32, 128, 4, 3)],
        128: [(64, 64, 8, 2), (32, 128, 8, 2)],
    },
    # dQ: block_m queries held per program, block_n keys streamed per step.
    "backward_dq": {
        16: [(64, 64, 4, 3)], 32: [(64, 64, 4, 3)],
        64: [(64, 64, 4, 3), (128, 32, 4, 3)],
        128: [(64, 64, 8, 2), (128, 32, 8, 2)],
    },
    # Decode: block_m is set by the launcher from the rows (DECODE_BLOCK_M); block_n must
    # divide the kernels' DECODE_SPLIT_ALIGN (128).
    "decode": {
        16: [(16, 64, 4, 3)], 32: [(16, 64, 4, 3)],
        64: [(16, 64, 4, 3), (16, 128, 4, 3)],
        128: [(16, 64, 4, 3), (16, 128, 8, 2)],
    },
}
CONFIGS: dict[tuple[str, int], tuple[KernelConfig, ...]] = {
    (kernel, head_dim): tuple(_config(*candidate) for candidate in candidates)
    for kernel, by_head_dim in _CANDIDATES.items() for head_dim, candidates in by_head_dim.items()
}
KERNEL_NAMES = {
    "forward": "attention_forward_kernel",
    "backward_dkdv": "attention_backward_dkdv_kernel",
    "backward_dq": "attention_backward_dq_kernel",
    "decode": "attention_decode_kernel",
}
# Flash-decoding: at most this many queries; rows (query head, query) per decode program, the
# smaller when a group's G·N_q rows fit it; at most this many key splits.
DECODE_MAX_QUERIES = 16
DECODE_BLOCK_M = (16, 64)
DECODE_MAX_SPLITS = 128
_DECODE_SPLIT_ALIGN = 128      # kernels.DECODE_SPLIT_ALIGN


def kernel_configs(kernel: str, head_dim: int) -> tuple[KernelConfig, ...]:
    """The candidate launch configurations of ``kernel`` (``"forward"``, ``"backward_dkdv"``,
    ``"backward_dq"``, ``"decode"``) for a head dimension in :data:`SUPPORTED_HEAD_DIMS`, the
    default first. On a GPU the autotuner picks among them."""
    kernel_config(kernel, head_dim)        # validates both arguments
    return CONFIGS[kernel, head_dim]


def kernel_config(kernel: str, head_dim: int) -> KernelConfig:
    """The default launch configuration of ``kernel`` (``"forward"``, ``"backward_dkdv"``,
    ``"backward_dq"``, ``"decode"``) for a head dimension in :data:`SUPPORTED_HEAD_DIMS`: the
    one the interpreter runs, and the first the autotuner tries on a GPU."""
    if kernel not in KERNEL_NAMES:
        raise ValueError(f"kernel_config: kernel must be one of {sorted(KERNEL_NAMES)}, got {kernel!r}")
    if (kernel, head_dim) not in CONFIGS:
        raise ValueError(f"kernel_config: head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim!r}")
    return CONFIGS[kernel, head_dim][0]


def load_kernels() -> types.ModuleType:
    """The module :mod:`attn_course.flash.kernels`, importing Triton on first use.

    Raises:
        ImportError: Triton is not installed (it is a Linux-only dependency).
    """
    try:
        from attn_course.flash import kernels
    except ImportError as error:   # pragma: no cover - Triton ships for Linux only
        raise ImportError("flash_attention needs Triton, which is installed on Linux "
                          "(pip install triton); tiled_attention needs only PyTorch") from error
    return kernels


def runs_in_interpreter() -> bool:
    """Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` when Triton was
    imported; :mod:`attn_course` sets it on machines without a CUDA GPU)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(load_kernels().attention_forward_kernel, InterpretedFunction)


_interpreter_note_shown = False


def _kernels_for(tensor: torch.Tensor, where: str) -> types.ModuleType:
    global _interpreter_note_shown
    kernels = load_kernels()
    if runs_in_interpreter():
        if not _interpreter_note_shown:
            _interpreter_note_shown = True
            print("attn_course.flash: no CUDA GPU, so the Triton kernels run in Triton's interpreter (the same "
                  "kernel code, executed tile by tile with NumPy: exact but slow; keep N small).",
                  file=sys.stderr)
    elif not tensor.is_cuda:
        raise RuntimeError(
            f"{where}: got {tensor.device} tensors, but Triton was imported in GPU mode. Move the "
            "tensors to CUDA, or, to run the kernels in Triton's interpreter, start Python with "
            "TRITON_INTERPRET=1 (or import attn_course before anything that imports Triton)."
        )
    return kernels


def _check_inputs(where: str, q, k, v, causal, scale) -> float:
    """Validate the kernels' inputs; return the scale. Grouped-query ``k``/``v`` and bottom-right
    causal with ``N_q < N_k`` are allowed here (the shared attention check refuses both)."""
    _validate.four_d(where, q=q, k=k, v=v)
    _validate.boolean(where, "causal", causal)
    if k.shape != v.shape:
        raise ValueError(f"{where}: v must have k's shape [B, H_kv, N_k, d] (d_v = d in this kernel), got k "
                         f"{_validate.shape_str(k)}, v {_validate.shape_str(v)}")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{where}: expected q [B, H, N_q, d] and k, v [B, H_kv, N_k, d] with the same B and d, "
                         f"got q {_validate.shape_str(q)}, k {_validate.shape_str(k)}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"{where}: the number of query heads H must be a multiple of the key/value heads "
                         f"H_kv (grouped-query attention), expected q [B, H, N_q, d] and k [B, H_kv, N_k, d] "
                         f"with H % H_kv == 0, got q {_validate.shape_str(q)}, k {_validate.shape_str(k)}")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(f"{where}: causal needs N_q <= N_k (the queries are the last N_q of the N_k "
                         f"positions, bottom-right aligned), got N_q={q.shape[2]}, N_k={k.shape[2]}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else _validate.positive_finite(where, "scale", scale)
    interpreted = runs_in_interpreter()
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
    return scale


_autotuned: dict[tuple[str, int], object] = {}


def _autotuned_kernel(kernels, kernel: str, head_dim: int):
    """On a GPU: ``kernel`` wrapped in ``triton.autotune`` over its candidates, built once.

    The autotuner times every candidate on the first call for each key (lengths, group size,
    causality; Triton adds the tensors' dtypes) and reuses the winner afterwards. Decode
    configurations tune only ``BLOCK_N``: its ``BLOCK_M`` follows from the rows.
    """
    if (kernel, head_dim) not in _autotuned:
        import triton

        def sizes(c):
            return {"BLOCK_N": c.block_n} if kernel == "decode" else {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n}

        configs = [triton.Config(sizes(c), num_warps=c.num_warps, num_stages=c.num_stages)
                   for c in CONFIGS[kernel, head_dim]]
        function = getattr(kernels, KERNEL_NAMES[kernel])
        _autotuned[kernel, head_dim] = triton.autotune(configs=configs, key=["n_q", "n_k", "num_kv_groups", "CAUSAL"])(
            function)
    return _autotuned[kernel, head_dim]


def _check_config(where: str, name: str, config: object, kernel: str, head_dim: int) -> KernelConfig | None:
    """``config`` must be None (autotune on a GPU, the default in the interpreter) or a candidate."""
    if config is None:
        return None
    candidates = kernel_configs(kernel, head_dim)
    if not isinstance(config, KernelConfig) or config not in candidates:
        raise ValueError(f"{where}: {name} must be None or one of kernel_configs({kernel!r}, {head_dim}) "
                         f"(the configurations compiled and checked ahead of time), got {config!r}")
    return config


def _launch(kernels, kernel: str, grid_rows: int, batch_heads: int, *args, head_dim: int, causal: bool,
            config: KernelConfig | None = None, extra_grid: int = 1, **constants):
    """Launch ``kernel`` over ``(cdiv(grid_rows, tile), batch_heads, extra_grid)`` programs.

    The tile along ``grid_rows`` is ``BLOCK_N`` for the dK/dV kernel (it owns keys), ``BLOCK_M``
    otherwise; the decode kernel's grid rows are its splits (tile 1). A given ``config``, or the
    interpreter, fixes the configuration; otherwise the autotuner picks it.
    """
    def tile(meta):
        if kernel == "decode":
            return 1
        return meta["BLOCK_N"] if kernel == "backward_dkdv" else meta["BLOCK_M"]

    if config is None and runs_in_interpreter():
        config = kernel_config(kernel, head_dim)
    if config is not None:
        sizes = {"BLOCK_N": config.block_n} if kernel == "decode" else {"BLOCK_M": config.block_m,
                                                                       "BLOCK_N": config.block_n}
        grid = (_cdiv(grid_rows, tile(sizes)), batch_heads, extra_grid)
        getattr(kernels, KERNEL_NAMES[kernel])[grid](
            *args, HEAD_DIM=head_dim, CAUSAL=causal, **sizes, **constants,
            num_warps=config.num_warps, num_stages=config.num_stages,
        )
    else:
        def grid(meta):
            return (_cdiv(grid_rows, tile(meta)), batch_heads, extra_grid)

        _autotuned_kernel(kernels, kernel, head_dim)[grid](*args, HEAD_DIM=head_dim, CAUSAL=causal, **constants)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def attention_forward(q, k, v, *, causal: bool = False, scale: float | None = None, out=None, lse=None,
                      config: KernelConfig | None = None, tma: bool | None = None):
    """Run the forward kernel: the attention output and each row's log-sum-exp.

    Args:
        q: ``[B, H, N_q, d]``; k, v: ``[B, H_kv, N_k, d]`` with ``H % H_kv == 0``; any strides.
        causal, scale: as in :func:`flash_attention`.
        out: optional ``[B, H, N_q, d]`` buffer to write into (tests pre-fill it with NaN to
            catch elements the kernel fails to write).
        lse: optional float32 ``[B, H, N_q]`` buffer, likewise.
        config: one of :func:`kernel_configs` ``("forward", d)``; default: the autotuner's
            choice on a GPU, the first candidate in the interpreter.
        tma: run the tensor-descriptor (TMA) kernel of :mod:`attn_course.flash.kernels_tma`:
            ``None`` (default) where it is supported (a Hopper GPU, a Triton with device-side
            descriptors, aligned inputs, no ``config`` given), ``False`` never, ``True`` always
            (an error where it is not supported).

    Returns:
        ``(out, lse)``: ``out`` in the input dtype, ``lse`` float32 with
        ``lse[b, h, i] = log Σ_j exp(scale · q_i · k_j)`` over the visible keys (natural log).

    Raises:
        TypeError, ValueError: as :func:`flash_attention`, or ``out``/``lse`` of the wrong shape.
    """
    where = "attention_forward"
    scale = _check_inputs(where, q, k, v, causal, scale)
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if lse is None:
        lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    if out.shape != q.shape or out.dtype != q.dtype or lse.shape != (batch, heads, n_q) or not lse.is_contiguous():
        raise ValueError(f"{where}: out must be like q and lse contiguous float32 [B, H, N_q], got out "
                         f"{_validate.shape_str(out)} {out.dtype}, lse {_validate.shape_str(lse)}")
    config = _check_config(where, "config", config, "forward", head_dim)
    kernels = _kernels_for(q, where)
    if tma is not None:
        _validate.boolean(where, "tma", tma)
    if tma is not False:
        from attn_course.flash import kernels_tma

        supported = kernels_tma.tma_forward_supported(q, k, v, out)
        if tma and not supported:
            raise ValueError(f"{where}: tma=True needs CUDA tensors on a Hopper GPU (capability 9.x), a Triton "
                             "with device-side tensor descriptors, and 16-byte aligned inputs with stride 1 "
                             "along d; these inputs do not qualify (tma=None chooses by itself)")
        if supported and (tma or config is None):
            return kernels_tma.attention_forward_tma(q, k, v, out, lse, causal=causal, scale=scale,
                                                     **kernels_tma.tma_forward_config(head_dim))
    _launch(kernels, "forward", n_q, batch * heads,
            q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            heads, heads // k.shape[1], n_q, n_k, scale, head_dim=head_dim, causal=causal, config=config)
    return out, lse


def attention_backward(grad_out, q, k, v, out, lse, *, causal: bool = False, scale: float | None = None,
                       grad_q=None, grad_k=None, grad_v=None, dkdv_config: KernelConfig | None = None,
                       dq_config: KernelConfig | None = None):
    """Run the two backward kernels: gradients of the loss with respect to q, k and v.

    Args:
        grad_out: ``[B, H, N_q, d]``, the gradient of the loss with respect to ``out``.
        q, k, v, out, lse: the forward's inputs and results.
        causal, scale: as in the forward.
        grad_q, grad_k, grad_v: optional contiguous output buffers.
        dkdv_config, dq_config: one of :func:`kernel_configs` ``("backward_dkdv", d)`` and
            ``("backward_dq", d)``; default: autotuned on a GPU, the first in the interpreter.

    Returns:
        ``(grad_q, grad_k, grad_v)``, contiguous, in the input dtype, shaped like ``q``, ``k``, ``v``;
        with grouped-query ``k``/``v``, ``grad_k``/``grad_v`` sum over each group's query heads.

    Raises:
        TypeError, ValueError: as :func:`flash_attention`, or mismatched ``grad_out``/``out``/buffers.
    """
    where = "attention_backward"
    scale = _check_inputs(where, q, k, v, causal, scale)
    _validate.same_dtype_and_device(where, q=q, grad_out=grad_out, out=out)
    if grad_out.shape != q.shape or out.shape != q.shape:
        raise ValueError(f"{where}: grad_out and out must be shaped like q {_validate.shape_str(q)}, got "
                         f"{_validate.shape_str(grad_out)} and {_validate.shape_str(out)}")
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    # Δ_i = Σ_d dO_id · O_id = Σ_j P_ij dP_ij: the one per-row number the softmax's gradient needs.
    delta = (grad_out.float() * out.float()).sum(dim=-1).contiguous()          # [B, H, N_q]
    # Base 2 once here, so that the kernels' exp2(s₂ - LSE₂) needs no log2(e) per tile.
    lse_base2 = (lse * _LOG2_E).contiguous()
    grad_q = torch.empty(q.shape, dtype=q.dtype, device=q.device) if grad_q is None else grad_q
    grad_k = torch.empty(k.shape, dtype=k.dtype, device=k.device) if grad_k is None else grad_k
    grad_v = torch.empty(v.shape, dtype=v.dtype, device=v.device) if grad_v is None else grad_v
    for name, buffer, like in (("grad_q", grad_q, q), ("grad_k", grad_k, k), ("grad_v", grad_v, v)):
        if buffer.shape != like.shape or buffer.dtype != like.dtype or not buffer.is_contiguous():
            raise ValueError(f"{where}: {name} must be contiguous, shaped and typed like its input, got "
                             f"{_validate.shape_str(buffer)} {buffer.dtype}")
    dkdv_config = _check_config(where, "dkdv_config", dkdv_config, "backward_dkdv", head_dim)
    dq_config = _check_config(where, "dq_config", dq_config, "backward_dq", head_dim)
    kernels = _kernels_for(q, where)
    strides = (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride())
    kv_heads = k.shape[1]
    # dK/dV: one program per key tile of each key/value head, looping over its group's query heads.
    _launch(kernels, "backward_dkdv", n_k, batch * kv_heads,
            q, k, v, grad_out, lse_base2, delta, grad_k, grad_v, *strides,
            heads, heads // kv_heads, n_q, n_k, scale, head_dim=head_dim, causal=causal, config=dkdv_config)
    _launch(kernels, "backward_dq", n_q, batch * heads,
            q, k, v, grad_out, lse_base2, delta, grad_q, *strides,
            heads, heads // kv_heads, n_q, n_k, scale, head_dim=head_dim, causal=causal, config=dq_config)
    return grad_q, grad_k, grad_v


def decode_num_splits(batch: int, kv_heads: int, n_k: int, row_chunks: int = 1, *,
                      multiprocessors: int = 1) -> int:
    """How many splits of the keys flash-decoding uses: enough programs for two per multiprocessor.

    Without splitting, decoding runs ``B · H_kv · row_chunks`` programs, each over all ``N_k``
    keys. Splitting by ``S`` multiplies the programs by ``S`` and divides each one's keys. ``S`` is
    the smallest number giving at least two programs per multiprocessor (so that each has one
    waiting while another loads), at most one split per 128 keys and at most
    :data:`DECODE_MAX_SPLITS`. Triton's interpreter runs programs one after another: there
    ``multiprocessors=1``, and splitting would only add a merge.

    Args:
        batch, kv_heads, n_k: ``B``, ``H_kv``, ``N_k``.
        row_chunks: programs per key/value head and split (``cdiv(G · N_q, BLOCK_M)``).
        multiprocessors: the GPU's streaming multiprocessors (132 on an H100 SXM or H200).

    Returns:
        ``S``, from 1 to ``min(DECODE_MAX_SPLITS, max(N_k // 128, 1))``.

    Raises:
        TypeError, ValueError: an argument that is not an integer ≥ 1.

    Example:
        >>> decode_num_splits(1, 8, 32768, multiprocessors=132)   # 8 programs → 33 splits each
        33
    """
    where = "decode_num_splits"
    batch, kv_heads, n_k, row_chunks, multiprocessors = (
        _validate.integer(where, name, value, minimum=1)
        for name, value in (("batch", batch), ("kv_heads", kv_heads), ("n_k", n_k), ("row_chunks", row_chunks),
                            ("multiprocessors", multiprocessors)))
    most = min(DECODE_MAX_SPLITS, max(n_k // _DECODE_SPLIT_ALIGN, 1))
    wanted = _cdiv(2 * multiprocessors, batch * kv_heads * row_chunks)
    return max(1, min(most, wanted))


def attention_decode_forward(q, k, v, *, causal: bool = False, scale: float | None = None,
                             num_splits: int | None = None, config: KernelConfig | None = None, out=None, lse=None):
    """Flash-decoding: the forward for a few queries against many keys, keys split across programs.

    Step 1 (:func:`~attn_course.flash.kernels.attention_decode_kernel`) runs
    ``S · B · H_kv · cdiv(G · N_q, BLOCK_M)`` programs; each attends the ``G · N_q`` (query head,
    query) rows of one key/value head to one split of the keys and writes a partial output and
    log-sum-exp. Step 2 (:func:`~attn_course.flash.kernels.attention_decode_merge_kernel`)
    merges the ``S`` partials of every row by the log-sum-exp rule.

    Args:
        q: ``[B, H, N_q, d]`` with ``N_q <= 16``; k, v: ``[B, H_kv, N_k, d]``, ``H % H_kv == 0``.
        causal, scale: as in :func:`flash_attention` (causal is bottom-right aligned).
        num_splits: ``S``, from 1 to ``min(128, max(N_k // 128, 1))``; default
            :func:`decode_num_splits` for this GPU (1 in the interpreter).
        config: one of :func:`kernel_configs` ``("decode", d)``; default: autotuned on a GPU.
        out, lse: optional output buffers, as in :func:`attention_forward`.

    Returns:
        ``(out, lse)`` as :func:`attention_forward` returns them.

    Raises:
        TypeError, ValueError: as :func:`flash_attention`, ``N_q > 16``, or a bad ``num_splits``.
    """
    where = "attention_decode_forward"
    scale = _check_inputs(where, q, k, v, causal, scale)
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    if n_q > DECODE_MAX_QUERIES:
        raise ValueError(f"{where}: flash-decoding takes at most {DECODE_MAX_QUERIES} queries (N_q), got "
                         f"q {_validate.shape_str(q)}; use attention_forward")
    config = _check_config(where, "config", config, "decode", head_dim)
    groups = heads // kv_heads
    block_m = DECODE_BLOCK_M[0] if groups * n_q <= DECODE_BLOCK_M[0] else DECODE_BLOCK_M[1]
    row_chunks = _cdiv(groups * n_q, block_m)
    most = min(DECODE_MAX_SPLITS, max(n_k // _DECODE_SPLIT_ALIGN, 1))
    if num_splits is None:
        multiprocessors = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
        num_splits = decode_num_splits(batch, kv_heads, n_k, row_chunks, multiprocessors=multiprocessors)
    else:
        num_splits = _validate.integer(where, "num_splits", num_splits, minimum=1)
        if num_splits > most:
            raise ValueError(f"{where}: num_splits must be at most min({DECODE_MAX_SPLITS}, max(N_k // "
                             f"{_DECODE_SPLIT_ALIGN}, 1)) = {most} for N_k={n_k} (splits are whole blocks of "
                             f"{_DECODE_SPLIT_ALIGN} keys), got {num_splits}")
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if lse is None:
        lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    if out.shape != q.shape or out.dtype != q.dtype or lse.shape != (batch, heads, n_q) or not lse.is_contiguous():
        raise ValueError(f"{where}: out must be like q and lse contiguous float32 [B, H, N_q], got out "
                         f"{_validate.shape_str(out)} {out.dtype}, lse {_validate.shape_str(lse)}")
    kernels = _kernels_for(q, where)
    partial_out = torch.empty((batch * heads, num_splits, n_q, head_dim), dtype=torch.float32, device=q.device)
    partial_lse = torch.empty((batch * heads, num_splits, n_q), dtype=torch.float32, device=q.device)
    _launch(kernels, "decode", num_splits, batch * kv_heads,
            q, k, v, partial_out, partial_lse, *q.stride(), *k.stride(), *v.stride(),
            heads, groups, n_q, n_k, scale, num_splits, head_dim=head_dim, causal=causal, config=config,
            extra_grid=row_chunks, BLOCK_M=block_m)
    kernels.attention_decode_merge_kernel[(batch * heads * n_q,)](
        partial_out, partial_lse, out, lse, *out.stride(), heads, n_q, num_splits,
        HEAD_DIM=head_dim, SPLITS=decode_merge_width(num_splits), num_warps=4)
    return out, lse


def decode_merge_width(num_splits: int) -> int:
    """The merge kernel's ``SPLITS``: ``num_splits`` rounded up to a power of two, at least 2."""
    return max(2, 1 << (num_splits - 1).bit_length())


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, decode, num_splits):
        if decode:   # the same output and log-sum-exp, so the same backward
            out, lse = attention_decode_forward(q, k, v, causal=causal, scale=scale, num_splits=num_splits)
        else:
            out, lse = attention_forward(q, k, v, causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grad_q, grad_k, grad_v = attention_backward(grad_out, q, k, v, out, lse, causal=ctx.causal, scale=ctx.scale)
        return grad_q, grad_k, grad_v, None, None, None, None


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """Exact attention ``softmax(scale · q kᵀ) v`` by the FlashAttention Triton kernels.

    The forward keeps only each row's log-sum-exp; the backward recomputes the attention
    weights tile by tile from it. Memory grows linearly with N, never N².

    Args:
        q: ``[B, H, N_q, d]``.
        k, v: ``[B, H_kv, N_k, d]`` with ``H % H_kv == 0``: ``H_kv = H`` is multi-head attention,
            ``1 < H_kv < H`` grouped-query and ``H_kv = 1`` multi-query attention (query head ``h``
            uses key/value head ``h // (H / H_kv)``, read in place, not copied). Any lengths ≥ 1;
            any strides.
        causal: bottom-right aligned, as after a KV cache: the queries are the last ``N_q`` of the
            ``N_k`` positions, so query ``i`` sees keys ``0..i + N_k - N_q`` (requires ``N_q <= N_k``;
            with ``N_q == N_k`` this is the usual ``0..i``).
        scale: defaults to ``1 / sqrt(d)``.

    Supported: ``d`` in 16, 32, 64, 128; float16 and bfloat16 on a CUDA GPU; float16 and
    float32 on the CPU, where the kernels run in Triton's interpreter (a note says so once).
    With ``N_q <= 16`` the forward is flash-decoding (:func:`decode_attention`).

    Returns:
        ``[B, H, N_q, d]``, differentiable with respect to ``q``, ``k`` and ``v``.

    Raises:
        TypeError, ValueError: non-tensors, an unsupported dtype or head dimension, tensors on
            different devices or with mismatched shapes, ``H`` not a multiple of ``H_kv``, empty
            inputs, ``causal`` with ``N_q > N_k``, a bad scale.

    Example:
        >>> q = k = v = torch.randn(1, 2, 100, 16)
        >>> out = flash_attention(q, k, v, causal=True)  # doctest: +SKIP
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> torch.allclose(out, ref, atol=1e-5)  # doctest: +SKIP
        True
    """
    scale = _check_inputs("flash_attention", q, k, v, causal, scale)
    return _FlashAttention.apply(q, k, v, causal, scale, q.shape[2] <= DECODE_MAX_QUERIES, None)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                     scale: float | None = None, num_splits: int | None = None) -> torch.Tensor:
    """:func:`flash_attention` by flash-decoding, for ``N_q <= 16`` queries against a long cache.

    One query per head gives the ordinary forward only ``B · H`` programs, too few to keep a
    GPU busy while each reads the whole cache. Flash-decoding splits the keys into ``S`` parts,
    attends to each part in its own program (all the query heads of a grouped-query group
    together, so the cache is read once per group) and merges the partial outputs by their
    log-sum-exps. :func:`flash_attention` takes this path by itself when ``N_q <= 16``.

    Args:
        q: ``[B, H, N_q, d]`` with ``N_q <= 16``.
        k, v: ``[B, H_kv, N_k, d]`` with ``H % H_kv == 0``.
        causal: bottom-right aligned, as in :func:`flash_attention` (``N_q <= N_k``).
        scale: defaults to ``1 / sqrt(d)``.
        num_splits: how many parts the keys are split into, 1 to ``min(128, max(N_k // 128, 1))``;
            default :func:`decode_num_splits` for this GPU (1 in the interpreter).

    Returns:
        ``[B, H, N_q, d]``, differentiable (the backward is :func:`flash_attention`'s).

    Raises:
        TypeError, ValueError: as :func:`flash_attention`, ``N_q > 16``, or a bad ``num_splits``.

    Example:
        >>> q = torch.randn(1, 8, 1, 64)                       # one new token, 8 query heads
        >>> k = v = torch.randn(1, 2, 1000, 64)                # a cache of 1000, 2 key/value heads
        >>> out = decode_attention(q, k, v, num_splits=4)      # doctest: +SKIP
        >>> out.shape                                          # doctest: +SKIP
        torch.Size([1, 8, 1, 64])
    """
    where = "decode_attention"
    scale = _check_inputs(where, q, k, v, causal, scale)
    if q.shape[2] > DECODE_MAX_QUERIES:
        raise ValueError(f"{where}: flash-decoding takes at most {DECODE_MAX_QUERIES} queries (N_q), got "
                         f"q {_validate.shape_str(q)}; use flash_attention")
    if num_splits is not None:
        num_splits = _validate.integer(where, "num_splits", num_splits, minimum=1)
    return _FlashAttention.apply(q, k, v, causal, scale, True, num_splits)
