"""``flash_attention``: the Triton kernels of :mod:`attn_course.flash.kernels` (forward, flash-decoding)
and :mod:`attn_course.flash.kernels_backward`, made differentiable.

With a CUDA GPU the kernels are compiled for it. Without one, the *same kernel source* runs
through Triton's interpreter, which executes each tile operation with NumPy on CPU tensors:
exact, slow, and good for learning and testing. The kernels are defined on first use, in the
mode this machine needs (:mod:`attn_course.flash.triton_mode`); importing changes nothing.

Launch configurations come from one table (:data:`~attn_course.flash.configs.CONFIGS`),
autotuned on a GPU. Each public function checks its inputs once, by one function
(:func:`~attn_course.flash.launch.check_kernel_inputs`), and calls unchecked cores (``_forward``,
``_backward``) from there on. On a Hopper GPU the forward takes the tensor-descriptor kernel
(:mod:`attn_course.flash.tma_attention`) by itself. For a few queries against a long cache
(``N_q <= 16``, decoding) :func:`flash_attention` uses flash-decoding (:mod:`attn_course.flash.decode`).
Where Triton is not installed (macOS, Windows), both public functions run the kernels' algorithm in
PyTorch instead (:mod:`attn_course.flash.without_triton`), after the same checks.
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.flash.configs import (
    DECODE_MAX_QUERIES,
    DELTA_BLOCK_M,
    SUPPORTED_HEAD_DIMS,
    KernelConfig,
    atomic_dq_config,
)
from attn_course.flash.decode import check_decode_inputs, launch_decode
from attn_course.flash.launch import (
    cdiv,
    check_config,
    check_kernel_inputs,
    check_output_buffers,
    kernel_function,
    launch,
    output_buffers,
    program_grid,
)
from attn_course.flash.tma_attention import launch_tma_forward, tma_forward_supported
from attn_course.flash.triton_mode import triton_installed
from attn_course.flash.without_triton import attention_without_triton

__all__ = ["attention_backward", "attention_backward_delta", "attention_forward", "decode_attention",
           "flash_attention"]


def attention_forward(q, k, v, *, causal: bool = False, scale: float | None = None, out=None, lse=None,
                      config: KernelConfig | None = None, tma: bool | None = None):
    """Run the forward kernel: the attention output and each row's log-sum-exp.

    Args:
        q: ``[B, H, N_q, d]``; k, v: ``[B, H_kv, N_k, d]`` with ``H % H_kv == 0``; any strides.
        causal, scale: as in :func:`flash_attention`.
        out: optional ``[B, H, N_q, d]`` buffer to write into (tests pre-fill it with NaN to
            catch elements the kernel fails to write).
        lse: optional float32 ``[B, H, N_q]`` buffer, likewise.
        config: one of :func:`~attn_course.flash.configs.kernel_configs` ``("forward", d)``; default: the autotuner's
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
    scale = check_kernel_inputs(where, q, k, v, causal, scale)
    check_output_buffers(where, q, out, lse)
    config = check_config(where, "config", config, "forward", q.shape[-1])
    if tma is not None:
        _validate.boolean(where, "tma", tma)
    if tma and not tma_forward_supported(q, k, v, out):
        raise ValueError(f"{where}: tma=True needs CUDA tensors on a Hopper GPU (capability 9.x), a Triton "
                         "with device-side tensor descriptors, and 16-byte aligned inputs with stride 1 "
                         "along d; these inputs do not qualify (tma=None chooses by itself)")
    return _forward(q, k, v, causal, scale, out, lse, config, tma)


def _forward(q, k, v, causal, scale, out=None, lse=None, config=None, tma=None):
    """:func:`attention_forward` on checked inputs: the TMA kernel where ``tma`` asks for it, or (None)
    where it is supported and no ``config`` is given; else the pointer kernel."""
    batch, heads, n_q, head_dim = q.shape
    out, lse = output_buffers(q, out, lse)
    if tma or (tma is None and config is None and tma_forward_supported(q, k, v, out)):
        launch_tma_forward(q, k, v, out, lse, causal=causal, scale=scale)   # tuned once per length bucket
        return out, lse
    launch("forward", n_q, batch * heads,
           q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
           heads, heads // k.shape[1], n_q, k.shape[2], scale, head_dim=head_dim, causal=causal, config=config)
    return out, lse


def attention_backward_delta(grad_out, out, lse):
    """What both backward kernels read per query row, computed by one small kernel.

    Args:
        grad_out, out: ``[B, H, N_q, d]``, the same dtype and device, any strides.
        lse: float32 ``[B, H, N_q]``, the forward's log-sum-exp (natural log).

    Returns:
        ``(delta, lse_base2)``, contiguous float32 ``[B, H, N_q]``: ``delta[b, h, i] =
        Σ_d grad_out[b, h, i, d] · out[b, h, i, d]`` (accumulated in float32) and ``lse · log2(e)``.

    Raises:
        TypeError: non-tensors; ValueError: mismatched shapes, dtypes or devices, or ``d`` unsupported.
    """
    _check_rows("attention_backward_delta", grad_out, out, lse)
    return _backward_delta(grad_out, out, lse)


def _check_rows(where: str, grad_out, out, lse) -> None:
    """``grad_out`` and ``out`` alike ``[B, H, N_q, d]`` with a supported ``d``; ``lse`` float32 ``[B, H, N_q]``."""
    _validate.four_d(where, grad_out=grad_out, out=out)
    _validate.tensor(where, "lse", lse)
    _validate.same_dtype_and_device(where, out=out, grad_out=grad_out)
    if grad_out.shape != out.shape:
        raise ValueError(f"{where}: grad_out must be shaped like out {_validate.shape_str(out)}, got "
                         f"{_validate.shape_str(grad_out)}")
    if out.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{where}: head dimension d must be one of {SUPPORTED_HEAD_DIMS}, got {out.shape[-1]}")
    if lse.shape != out.shape[:3] or lse.dtype != torch.float32 or lse.device != out.device:
        raise ValueError(f"{where}: lse must be float32 [B, H, N_q] = {list(out.shape[:3])} on {out.device}, got "
                         f"{_validate.shape_str(lse)} {lse.dtype} on {lse.device}")


def _backward_delta(grad_out, out, lse):
    """:func:`attention_backward_delta` on checked inputs."""
    batch, heads, n_q, head_dim = out.shape
    lse = lse.contiguous()
    delta = torch.empty(out.shape[:3], dtype=torch.float32, device=out.device)
    lse_base2 = torch.empty_like(delta)
    kernel_function("attention_backward_delta_kernel")[program_grid(cdiv(n_q, DELTA_BLOCK_M), batch * heads)](
        out, grad_out, lse, delta, lse_base2, *out.stride(), *grad_out.stride(), heads, n_q,
        HEAD_DIM=head_dim, BLOCK_M=DELTA_BLOCK_M, num_warps=4, num_stages=1)
    return delta, lse_base2


def attention_backward(grad_out, q, k, v, out, lse, *, causal: bool = False, scale: float | None = None,
                       grad_q=None, grad_k=None, grad_v=None, dkdv_config: KernelConfig | None = None,
                       dq_config: KernelConfig | None = None, deterministic: bool = True):
    """Run the backward kernels: gradients of the loss with respect to q, k and v.

    Args:
        grad_out: ``[B, H, N_q, d]``, the gradient of the loss with respect to ``out``.
        q, k, v, out, lse: the forward's inputs and results.
        causal, scale: as in the forward.
        grad_q, grad_k, grad_v: optional contiguous output buffers.
        dkdv_config, dq_config: one of :func:`~attn_course.flash.configs.kernel_configs` ``("backward_dkdv", d)`` and
            ``("backward_dq", d)``; default: autotuned on a GPU, the first in the interpreter.
        deterministic: ``True`` (default): dK/dV in one kernel, dQ in another, each gradient
            summed in a fixed order, so the same inputs give the same bits every run; seven
            matrix products per pair of tiles (the dQ kernel recomputes ``P`` and ``dP``).
            ``False``: FlashAttention-2's five, the dK/dV kernel adding each tile's share of dQ
            into a float32 buffer by atomic adds, whose order varies, so dQ's last bits may vary
            between runs. That path runs ``dkdv_config`` or :func:`~attn_course.flash.configs.atomic_dq_config`,
            never the autotuner, which would time it by running it several times and add dQ as
            often; ``dq_config`` is not used.

    Returns:
        ``(grad_q, grad_k, grad_v)``, contiguous, in the input dtype, shaped like ``q``, ``k``, ``v``;
        with grouped-query ``k``/``v``, ``grad_k``/``grad_v`` sum over each group's query heads.

    Raises:
        TypeError, ValueError: as :func:`flash_attention`, or mismatched ``grad_out``/``out``/buffers.
    """
    where = "attention_backward"
    scale = check_kernel_inputs(where, q, k, v, causal, scale)
    _check_rows(where, grad_out, out, lse)
    _validate.same_dtype_and_device(where, q=q, out=out)
    if out.shape != q.shape:
        raise ValueError(f"{where}: grad_out and out must be shaped like q {_validate.shape_str(q)}, got "
                         f"{_validate.shape_str(grad_out)} and {_validate.shape_str(out)}")
    for name, buffer, like in (("grad_q", grad_q, q), ("grad_k", grad_k, k), ("grad_v", grad_v, v)):
        if buffer is not None and (_validate.tensor(where, name, buffer).shape != like.shape
                                   or buffer.dtype != like.dtype or not buffer.is_contiguous()):
            raise ValueError(f"{where}: {name} must be contiguous, shaped and typed like its input, got "
                             f"{_validate.shape_str(buffer)} {buffer.dtype}")
    _validate.boolean(where, "deterministic", deterministic)
    dkdv_config = check_config(where, "dkdv_config", dkdv_config, "backward_dkdv", q.shape[-1])
    dq_config = check_config(where, "dq_config", dq_config, "backward_dq", q.shape[-1])
    return _backward(grad_out, q, k, v, out, lse, causal, scale, grad_q, grad_k, grad_v, dkdv_config, dq_config,
                     deterministic)


def _backward(grad_out, q, k, v, out, lse, causal, scale, grad_q=None, grad_k=None, grad_v=None, dkdv_config=None,
              dq_config=None, deterministic=True):
    """:func:`attention_backward` on checked inputs."""
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    # Δ_i = Σ_d dO_id · O_id = Σ_j P_ij dP_ij: the one per-row number the softmax's gradient needs,
    # and the log-sum-exp in base 2 (the kernels' exp2(s₂ - LSE₂) then needs no log2(e) per tile);
    # one kernel, no float32 copies of dO and O.
    delta, lse_base2 = _backward_delta(grad_out, out, lse)                      # [B, H, N_q] each
    grad_q = torch.empty(q.shape, dtype=q.dtype, device=q.device) if grad_q is None else grad_q
    grad_k = torch.empty(k.shape, dtype=k.dtype, device=k.device) if grad_k is None else grad_k
    grad_v = torch.empty(v.shape, dtype=v.dtype, device=v.device) if grad_v is None else grad_v
    strides = (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride())
    kv_heads = k.shape[1]
    if deterministic:
        dq_sums = grad_q                      # not read: the dQ kernel writes grad_q itself
    else:
        dq_sums = torch.zeros(q.shape, dtype=torch.float32, device=q.device)     # [B, H, N_q, d]
        dkdv_config = dkdv_config or atomic_dq_config(head_dim)
    # dK/dV: one program per key tile of each key/value head, looping over its group's query heads.
    launch("backward_dkdv", n_k, batch * kv_heads,
           q, k, v, grad_out, lse_base2, delta, grad_k, grad_v, dq_sums, *strides,
           heads, heads // kv_heads, n_q, n_k, scale, head_dim=head_dim, causal=causal, config=dkdv_config,
           ATOMIC_DQ=not deterministic)
    if deterministic:
        launch("backward_dq", n_q, batch * heads,
               q, k, v, grad_out, lse_base2, delta, grad_q, *strides,
               heads, heads // kv_heads, n_q, n_k, scale, head_dim=head_dim, causal=causal, config=dq_config)
    else:
        grad_q.copy_(dq_sums)
    return grad_q, grad_k, grad_v


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, decode, num_splits):
        if decode:   # the same output and log-sum-exp, so the same backward
            out, lse = launch_decode(q, k, v, causal=causal, scale=scale, num_splits=num_splits)
        else:
            out, lse = _forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grad_q, grad_k, grad_v = _backward(grad_out, q, k, v, out, lse, ctx.causal, ctx.scale)
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
    scale = check_kernel_inputs("flash_attention", q, k, v, causal, scale)
    if not triton_installed():
        return attention_without_triton(q, k, v, causal=causal, scale=scale)
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
    scale, num_splits = check_decode_inputs("decode_attention", q, k, v, causal, scale, num_splits)
    if not triton_installed():
        return attention_without_triton(q, k, v, causal=causal, scale=scale, num_splits=num_splits or 1)
    return _FlashAttention.apply(q, k, v, causal, scale, True, num_splits)
