"""``flash_attention``: the Triton kernels of :mod:`attn_course.flash.kernels`, made differentiable.

With a CUDA GPU the kernels are compiled for it. Without one, the *same kernel source*
runs through Triton's interpreter, which executes each tile operation with NumPy on CPU
tensors: exact, slow, and good for learning and testing. Triton picks the mode once, when
it is imported, from ``TRITON_INTERPRET``; :mod:`attn_course` sets that variable on
machines without a GPU (see :mod:`attn_course._triton_mode`).

Launch configurations come from one table, :data:`CONFIGS`, with no autotuning: the
interpreter has no GPU driver to autotune with, and a fixed table is what the
ahead-of-time compile test (``tests/test_flash_compile.py``) checks against real GPUs.
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
    "kernel_config",
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


# (kernel, head_dim) -> config. Every entry is compiled for sm_80 and sm_90 by the tests, and
# its shared memory checked against those GPUs' limits.
CONFIGS: dict[tuple[str, int], KernelConfig] = {}
for _head_dim in SUPPORTED_HEAD_DIMS:
    _wide = _head_dim == 128
    CONFIGS["forward", _head_dim] = _config(128, 64, 8 if _wide else 4, 3)
    CONFIGS["backward_dkdv", _head_dim] = _config(64, 64, 8 if _wide else 4, 2 if _wide else 3)
    CONFIGS["backward_dq", _head_dim] = _config(64, 64, 8 if _wide else 4, 2 if _wide else 3)
KERNEL_NAMES = {
    "forward": "attention_forward_kernel",
    "backward_dkdv": "attention_backward_dkdv_kernel",
    "backward_dq": "attention_backward_dq_kernel",
}


def kernel_config(kernel: str, head_dim: int) -> KernelConfig:
    """The launch configuration of ``kernel`` (``"forward"``, ``"backward_dkdv"``,
    ``"backward_dq"``) for a head dimension in :data:`SUPPORTED_HEAD_DIMS`."""
    if kernel not in KERNEL_NAMES:
        raise ValueError(f"kernel_config: kernel must be one of {sorted(KERNEL_NAMES)}, got {kernel!r}")
    if (kernel, head_dim) not in CONFIGS:
        raise ValueError(f"kernel_config: head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim!r}")
    return CONFIGS[kernel, head_dim]


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


def _launch(kernels, kernel: str, grid_rows: int, batch_heads: int, *args, head_dim: int, causal: bool):
    config = kernel_config(kernel, head_dim)
    block = config.block_n if kernel == "backward_dkdv" else config.block_m
    grid = (_cdiv(grid_rows, block), batch_heads)
    getattr(kernels, KERNEL_NAMES[kernel])[grid](
        *args, HEAD_DIM=head_dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n, CAUSAL=causal,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def attention_forward(q, k, v, *, causal: bool = False, scale: float | None = None, out=None, lse=None):
    """Run the forward kernel: the attention output and each row's log-sum-exp.

    Args:
        q: ``[B, H, N_q, d]``; k, v: ``[B, H_kv, N_k, d]`` with ``H % H_kv == 0``; any strides.
        causal, scale: as in :func:`flash_attention`.
        out: optional ``[B, H, N_q, d]`` buffer to write into (tests pre-fill it with NaN to
            catch elements the kernel fails to write).
        lse: optional float32 ``[B, H, N_q]`` buffer, likewise.

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
    kernels = _kernels_for(q, where)
    _launch(kernels, "forward", n_q, batch * heads,
            q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            heads, heads // k.shape[1], n_q, n_k, scale, head_dim=head_dim, causal=causal)
    return out, lse


def attention_backward(grad_out, q, k, v, out, lse, *, causal: bool = False, scale: float | None = None,
                       grad_q=None, grad_k=None, grad_v=None):
    """Run the two backward kernels: gradients of the loss with respect to q, k and v.

    Args:
        grad_out: ``[B, H, N_q, d]``, the gradient of the loss with respect to ``out``.
        q, k, v, out, lse: the forward's inputs and results.
        causal, scale: as in the forward.
        grad_q, grad_k, grad_v: optional contiguous output buffers.

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
    kernels = _kernels_for(q, where)
    strides = (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride())
    kv_heads = k.shape[1]
    # dK/dV: one program per key tile of each key/value head, looping over its group's query heads.
    _launch(kernels, "backward_dkdv", n_k, batch * kv_heads,
            q, k, v, grad_out, lse_base2, delta, grad_k, grad_v, *strides,
            heads, heads // kv_heads, n_q, n_k, scale, head_dim=head_dim, causal=causal)
    _launch(kernels, "backward_dq", n_q, batch * heads,
            q, k, v, grad_out, lse_base2, delta, grad_q, *strides,
            heads, heads // kv_heads, n_q, n_k, scale, head_dim=head_dim, causal=causal)
    return grad_q, grad_k, grad_v


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        out, lse = attention_forward(q, k, v, causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grad_q, grad_k, grad_v = attention_backward(grad_out, q, k, v, out, lse, causal=ctx.causal, scale=ctx.scale)
        return grad_q, grad_k, grad_v, None, None


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
    return _FlashAttention.apply(q, k, v, causal, scale)
