"""The FlashAttention forward kernel again, with Q, K, V and Out moved by tensor descriptors (TMA).

Same algorithm, same results as :func:`~attn_course.flash.kernels.attention_forward_kernel`;
only the way tiles travel between global memory (HBM) and the chip changes. There, each
``tl.load`` builds a ``[rows, d]`` grid of addresses and a bounds mask, and every thread
fetches its own elements. Here, each program describes the matrix it reads once, a
*tensor descriptor* ``(base, shape, strides, block_shape)``, and then asks for a tile by its
corner: ``k_desc.load([key_start, 0])``. On Hopper GPUs (sm_90: H100, H200) the compiler turns
that into one TMA instruction (``cp.async.bulk.tensor``): a copy engine moves the whole tile into
shared memory while the warps compute, and fills rows outside ``shape`` with zeros, so the loads
need no mask and the stores write no row past the end.

One descriptor per (batch, head) over the 2-D ``[N, d]`` matrix of that head, not one over the
flattened ``[B·H·N, d]`` tensor as Triton's fused-attention tutorial does: then a tile that runs
past ``N`` is zero-filled instead of reading the next head's rows, so any ``N`` works and the
inputs may have any (aligned) strides.

TMA's rules become the launcher's checks (:func:`tma_forward_supported`): the last dimension
contiguous (stride 1), the other strides and the base addresses multiples of 16 bytes.
Descriptors built on the device live in a small global scratch buffer that Triton asks an
*allocator* for at launch (``triton.set_allocator``); :func:`attention_forward_tma` installs a
``torch.empty``-based one unless the user has set their own.

Triton's interpreter runs descriptors too (with the same alignment checks, and zero padding),
so the tests check this kernel on the CPU against float64 as they do the pointer kernel; that
TMA and ``wgmma`` are really used on sm_90 is checked by compiling ahead of time
(:func:`compile_tma_forward`), which needs no GPU.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from attn_course import _validate
from attn_course.flash.kernels import LN_2, LOG2_E

__all__ = [
    "TMA_ALIGNMENT",
    "attention_forward_tma",
    "attention_forward_tma_kernel",
    "compile_tma_forward",
    "has_device_tensor_descriptors",
    "tma_forward_config",
    "tma_forward_supported",
]

#: TMA needs base addresses and all strides but the last in multiples of this many bytes.
TMA_ALIGNMENT = 16
_SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
_GPU_DTYPES = (torch.float16, torch.bfloat16)
# The interpreter's tl.dot gives wrong results for bfloat16 (NumPy has no bfloat16).
_INTERPRETER_DTYPES = (torch.float16, torch.float32)
_TRITON_POINTER_TYPE = {"float16": "*fp16", "bfloat16": "*bf16"}


@triton.jit
def forward_key_tiles_tma(acc, row_max, row_sum, q, k_desc, v_desc, rows, n_k, causal_offset, scale_log2,
                          key_begin, key_end, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Steps 5-6 over key tiles ``key_begin .. key_end``; ``MASKED`` tiles mask scores for bounds and causality."""
    for key_start in range(key_begin, key_end, BLOCK_N):
        # 5. This tile of keys and values, by TMA. Rows past N_k arrive as zeros: no load mask.
        k = k_desc.load([key_start, 0])                                       # [BLOCK_N, d]
        v = v_desc.load([key_start, 0])                                       # [BLOCK_N, d]
        # The transpose is free: the matrix unit reads K from shared memory either way round.
        scores = tl.dot(q, tl.trans(k)) * scale_log2                          # [BLOCK_M, BLOCK_N], base 2
        if MASKED:
            # A zero-filled key scores 0, not -inf: keys past N_k must still be masked out here.
            keys = key_start + tl.arange(0, BLOCK_N)                          # [BLOCK_N]
            visible = keys[None, :] < n_k
            if CAUSAL:
                visible = visible & (keys[None, :] <= rows[:, None] + causal_offset)
            scores = tl.where(visible, scores, float("-inf"))
        # 6. Online softmax: raise the maximum, rescale what we had, add this tile.
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        correction = tl.exp2(row_max - new_max)          # exp(m_old - m_new); 0 on the first tile
        probabilities = tl.exp2(scores - new_max[:, None])                    # [BLOCK_M, BLOCK_N]
        row_sum = row_sum * correction + tl.sum(probabilities, 1)
        # acc · correction + P V in one instruction: the product accumulates into acc.
        acc = tl.dot(probabilities.to(v.dtype), v, acc * correction[:, None])  # [BLOCK_M, d]
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def attention_forward_tma_kernel(
    Q, K, V, Out, LSE,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    num_heads, num_kv_groups, n_q, n_k, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Grid ``(cdiv(N_q, BLOCK_M), B·H)``: one tile of BLOCK_M queries per program.

    The arguments are :func:`~attn_course.flash.kernels.attention_forward_kernel`'s without the
    strides of the last dimension, which TMA requires to be 1. ``LSE`` is float32 ``[B·H, N_q]``.
    """
    # 1. Which rows are mine: query tile `tile` of head `head` in batch `batch`; the keys and
    #    values are those of the head's group, `head // num_kv_groups` (grouped-query attention).
    tile = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // num_heads).to(tl.int64)   # int64: offsets can pass 2**31
    head = (batch_head % num_heads).to(tl.int64)
    kv_head = head // num_kv_groups
    query_start = tile * BLOCK_M
    rows = query_start + tl.arange(0, BLOCK_M)         # [BLOCK_M] query positions

    # Descriptors: this head's [N, d] matrices, read and written one tile at a time. Their shape
    # is what TMA checks bounds against, so a tile past the end reads zeros and writes nothing.
    q_desc = tl.make_tensor_descriptor(Q + batch * stride_qb + head * stride_qh, shape=[n_q, HEAD_DIM],
                                       strides=[stride_qn, 1], block_shape=[BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K + batch * stride_kb + kv_head * stride_kh, shape=[n_k, HEAD_DIM],
                                       strides=[stride_kn, 1], block_shape=[BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V + batch * stride_vb + kv_head * stride_vh, shape=[n_k, HEAD_DIM],
                                       strides=[stride_vn, 1], block_shape=[BLOCK_N, HEAD_DIM])
    o_desc = tl.make_tensor_descriptor(Out + batch * stride_ob + head * stride_oh, shape=[n_q, HEAD_DIM],
                                       strides=[stride_on, 1], block_shape=[BLOCK_M, HEAD_DIM])

    # 2. Load my queries once; they stay on chip for the whole loop. Rows past N_q are zeros.
    q = q_desc.load([query_start, 0])                                         # [BLOCK_M, d]
    scale_log2 = scale * LOG2_E

    # 3. Running statistics of the online softmax, in float32.
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)             # m (base 2)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)                           # l
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)                     # Σ p · v

    # 4. Which key tiles, in two stages, exactly as the pointer kernel. Query i sees key j iff
    #    j <= i + causal_offset. Stage 1: tiles of keys every row of mine sees (below the
    #    diagonal, and not the partial last tile): unmasked. Stage 2: the diagonal band and the
    #    partial last tile: masked. Causal: tiles after the band are all in the future.
    causal_offset = n_k - n_q
    full_tiles_end = (n_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        unmasked_end = tl.minimum(full_tiles_end, ((query_start + causal_offset + 1) // BLOCK_N) * BLOCK_N)
        key_end = tl.minimum(n_k, query_start + BLOCK_M + causal_offset)
    else:
        unmasked_end = full_tiles_end
        key_end = n_k
    # 5-6. Stream over the key tiles: scores, online softmax, accumulate P V.
    acc, row_max, row_sum = forward_key_tiles_tma(
        acc, row_max, row_sum, q, k_desc, v_desc, rows, n_k, causal_offset, scale_log2, 0, unmasked_end,
        BLOCK_N=BLOCK_N, MASKED=False, CAUSAL=CAUSAL)
    acc, row_max, row_sum = forward_key_tiles_tma(
        acc, row_max, row_sum, q, k_desc, v_desc, rows, n_k, causal_offset, scale_log2, unmasked_end, key_end,
        BLOCK_N=BLOCK_N, MASKED=True, CAUSAL=CAUSAL)

    # 7. Normalise once and write the output tile by TMA (rows past N_q are dropped, no mask),
    #    and the log-sum-exp for the backward pass (plain pointers: one float per row).
    out = acc / row_sum[:, None]                                              # [BLOCK_M, d]
    o_desc.store([query_start, 0], out.to(Out.dtype.element_ty))
    lse = (row_max + tl.log2(row_sum)) * LN_2                                  # natural log
    tl.store(LSE + batch_head.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)


# ----------------------------------------------------------------------------------------------
# Launch code
# ----------------------------------------------------------------------------------------------

def has_device_tensor_descriptors() -> bool:
    """Whether this Triton builds tensor descriptors inside kernels (``tl.make_tensor_descriptor``,
    Triton 3.3 and later) and takes an allocator for their scratch memory (``triton.set_allocator``)."""
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
    if head_dim not in _SUPPORTED_HEAD_DIMS:
        raise ValueError(f"tma_forward_config: head_dim must be one of {_SUPPORTED_HEAD_DIMS}, got {head_dim!r}")
    return {"block_m": 128, "block_n": 64, "num_warps": 8 if head_dim == 128 else 4, "num_stages": 3}


def _runs_in_interpreter() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(attention_forward_tma_kernel, InterpretedFunction)


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
    if not has_device_tensor_descriptors() or _runs_in_interpreter():
        return False
    if not all(t.is_cuda and t.device == q.device and t.dtype == q.dtype and t.dim() == 4 for t in tensors.values()):
        return False
    if q.dtype not in _GPU_DTYPES or q.shape[-1] not in _SUPPORTED_HEAD_DIMS:
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
        triton.set_allocator(_scratch_allocator)
        _allocator_installed = True


_allocator_installed = False


def _power_of_two(where: str, name: str, value, minimum: int, maximum: int) -> int:
    value = _validate.integer(where, name, value, minimum=minimum)
    if value > maximum or value & (value - 1):
        raise ValueError(f"{where}: {name} must be a power of two from {minimum} to {maximum}, got {value}")
    return value


def _check_tma_inputs(where, q, k, v, out, lse, causal, scale) -> float:
    """Shapes, dtypes and layouts; return the scale."""
    _validate.four_d(where, q=q, k=k, v=v, out=out)
    _validate.tensor(where, "lse", lse)
    _validate.boolean(where, "causal", causal)
    if k.shape != v.shape:
        raise ValueError(f"{where}: v must have k's shape [B, H_kv, N_k, d], got k {_validate.shape_str(k)}, "
                         f"v {_validate.shape_str(v)}")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{where}: expected q [B, H, N_q, d] and k, v [B, H_kv, N_k, d] with the same B and d, "
                         f"got q {_validate.shape_str(q)}, k {_validate.shape_str(k)}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"{where}: the query heads H must be a multiple of the key/value heads H_kv "
                         f"(H % H_kv == 0), got q {_validate.shape_str(q)}, k {_validate.shape_str(k)}")
    if min(q.shape[:3]) == 0 or k.shape[2] == 0:
        raise ValueError(f"{where}: B, H, N_q and N_k must be at least 1, got q {_validate.shape_str(q)}, "
                         f"k {_validate.shape_str(k)}")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(f"{where}: causal needs N_q <= N_k (bottom-right aligned), got N_q={q.shape[2]}, "
                         f"N_k={k.shape[2]}")
    if q.shape[-1] not in _SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{where}: head dimension d must be one of {_SUPPORTED_HEAD_DIMS}, got {q.shape[-1]}")
    interpreted = _runs_in_interpreter()
    allowed = _INTERPRETER_DTYPES if interpreted else _GPU_DTYPES
    if q.dtype not in allowed:
        place = "in Triton's interpreter" if interpreted else "on a CUDA GPU"
        raise TypeError(f"{where}: dtype must be one of {[str(d) for d in allowed]} {place}, got {q.dtype}")
    if not interpreted and not q.is_cuda:
        raise RuntimeError(f"{where}: got {q.device} tensors, but Triton was imported in GPU mode; move them to CUDA")
    if out.shape != q.shape:
        raise ValueError(f"{where}: out must be shaped like q {_validate.shape_str(q)}, got {_validate.shape_str(out)}")
    if lse.shape != q.shape[:3] or lse.dtype != torch.float32 or not lse.is_contiguous() or lse.device != q.device:
        raise ValueError(f"{where}: lse must be contiguous float32 [B, H, N_q] = {list(q.shape[:3])} on {q.device}, "
                         f"got {_validate.shape_str(lse)} {lse.dtype} on {lse.device}")
    for name, tensor in (("q", q), ("k", k), ("v", v), ("out", out)):
        problem = _layout_problem(name, tensor)
        if problem:
            raise ValueError(f"{where}: {problem} (TMA's layout rules; .contiguous() gives one that fits)")
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else _validate.positive_finite(where, "scale", scale)


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

    Example:
        >>> q = k = v = torch.randn(1, 2, 100, 64, device="cuda", dtype=torch.float16)  # doctest: +SKIP
        >>> out, lse = torch.empty_like(q), torch.empty(1, 2, 100, device="cuda")  # doctest: +SKIP
        >>> if tma_forward_supported(q, k, v, out):  # a Hopper GPU  # doctest: +SKIP
        ...     _ = attention_forward_tma(q, k, v, out, lse, causal=True, **tma_forward_config(64))
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
    grid = (triton.cdiv(n_q, block_m), batch * heads)
    launch = attention_forward_tma_kernel[grid]
    arguments = (q, k, v, out, lse, *strides, heads, heads // k.shape[1], n_q, n_k, scale)
    options = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
                   num_warps=num_warps, num_stages=num_stages)
    if _runs_in_interpreter():
        launch(*arguments, **options)
    else:
        _ensure_allocator()
        with torch.cuda.device(q.device):   # Triton launches on the current device
            launch(*arguments, **options)
    return out, lse


# ----------------------------------------------------------------------------------------------
# Ahead-of-time compilation (no GPU needed)
# ----------------------------------------------------------------------------------------------

def compile_tma_forward(head_dim: int, dtype: str, causal: bool, *, capability: int = 90,
                        block_m: int | None = None, block_n: int | None = None,
                        num_warps: int | None = None, num_stages: int | None = None):
    """Compile :func:`attention_forward_tma_kernel` for ``sm_<capability>`` without a GPU.

    Args:
        head_dim: 16, 32, 64 or 128.
        dtype: ``"float16"`` or ``"bfloat16"``.
        causal: the ``CAUSAL`` specialisation.
        capability: CUDA compute capability times ten; 90 (H100/H200) is the one TMA is for.
        block_m, block_n, num_warps, num_stages: default to :func:`tma_forward_config`.

    Returns:
        Triton's compiled kernel: ``.asm["ptx"]`` the PTX, ``.metadata.shared`` shared memory in bytes.

    Raises:
        RuntimeError: Triton is in interpreter mode (run with ``TRITON_INTERPRET=0``).
        ValueError: an unsupported head dimension or dtype.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if _runs_in_interpreter():
        raise RuntimeError("compile_tma_forward: Triton is in interpreter mode; run with TRITON_INTERPRET=0")
    if dtype not in _TRITON_POINTER_TYPE:
        raise ValueError(f"compile_tma_forward: dtype must be one of {sorted(_TRITON_POINTER_TYPE)}, got {dtype!r}")
    config = tma_forward_config(head_dim)
    block_m = config["block_m"] if block_m is None else block_m
    block_n = config["block_n"] if block_n is None else block_n
    num_warps = config["num_warps"] if num_warps is None else num_warps
    num_stages = config["num_stages"] if num_stages is None else num_stages
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "CAUSAL": causal}
    signature, attributes = {}, {}
    for index, name in enumerate(attention_forward_tma_kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ("Q", "K", "V", "Out", "LSE"):
            signature[name] = "*fp32" if name == "LSE" else _TRITON_POINTER_TYPE[dtype]
            # What the JIT sees at run time: tma_forward_supported admits only 16-byte aligned data
            # (and torch.empty's LSE is aligned), and Triton specialises such pointers.
            attributes[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name == "scale" else "i32"
    source = ASTSource(fn=attention_forward_tma_kernel, signature=signature, constexprs=constexprs,
                       attrs=attributes)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})
