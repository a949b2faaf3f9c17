"""``python -m attn_course.bench flash``: FlashAttention against the alternatives.

* On a CPU (:func:`cpu_rows`): seconds and peak memory against N for naive attention (the
  N × N weights are materialised), :func:`~attn_course.flash.tiled_attention` and PyTorch's
  ``scaled_dot_product_attention``. Naive memory grows as N², tiled memory as N.
* On a CPU, for training (:func:`training_rows`): peak memory of one forward and backward pass,
  naive attention (autograd keeps the N × N weights) against ``tiled_attention``, whose backward
  (:class:`~attn_course.flash.TiledAttentionFunction`) keeps only O and the log-sum-exp.
* On a CUDA GPU (:func:`gpu_rows`): forward and forward+backward TFLOP/s of
  :func:`~attn_course.flash.flash_attention`, of SDPA with each available backend
  (flash, memory-efficient, cuDNN) and of naive attention, in float16 and bfloat16, head
  dims 64 and 128, N from 512 to 16384, causal or not.

Rows are written to ``bench-results/flash-<cpu|gpu>.csv`` with a PNG plot (:func:`plot_rows`), the
training rows to ``flash-cpu-training.csv``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course.attention import self_attention
from attn_course.bench.timing import best_time, check_rows
from attn_course.flash.tiled import tiled_attention
from attn_course.masks import causal_mask
from attn_course.memory import peak_memory

__all__ = ["CpuRow", "GpuRow", "TrainingRow", "attention_flops", "cpu_rows", "gpu_rows", "plot_rows", "print_flash",
           "print_training", "training_rows"]

DEFAULT_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
TRAINING_LENGTHS = (1024, 2048, 4096, 8192)
_MODES = {"forward": 1.0, "backward": 2.5, "forward+backward": 3.5}   # in forwards, as the papers count


@dataclasses.dataclass(frozen=True)
class CpuRow:
    """One (method, N) measurement of :func:`cpu_rows`, one head of ``N × d`` float32.

    Attributes:
        method: ``"naive"``, ``"tiled"`` or ``"sdpa"``.
        n: sequence length N.
        seconds: best wall-clock time of one call.
        peak_mib: peak memory allocated during the call, in MiB (inputs excluded).
        max_difference: largest absolute difference of the output from SDPA's.
    """

    method: str
    n: int
    seconds: float
    peak_mib: float
    max_difference: float


@dataclasses.dataclass(frozen=True)
class GpuRow:
    """One measurement of :func:`gpu_rows`.

    Attributes:
        method: e.g. ``"ours (Triton)"``, ``"sdpa flash"``, ``"naive"``.
        dtype: ``"float16"`` or ``"bfloat16"``.
        head_dim: d.
        causal: whether the causal mask was applied.
        n: sequence length N.
        mode: ``"forward"`` or ``"forward+backward"``.
        milliseconds: median time from ``triton.testing.do_bench``.
        tflops: :func:`attention_flops` per second, in units of 10¹².
    """

    method: str
    dtype: str
    head_dim: int
    causal: bool
    n: int
    mode: str
    milliseconds: float
    tflops: float


@dataclasses.dataclass(frozen=True)
class TrainingRow:
    """One (method, N) measurement of :func:`training_rows`: a forward and a backward pass.

    Attributes:
        method: ``"naive"`` or ``"tiled"``.
        n: sequence length N.
        seconds: wall-clock time of the forward and backward pass.
        peak_mib: peak memory allocated during both passes, in MiB (inputs excluded, gradients included).
        max_grad_difference: largest absolute difference of dq, dk, dv from SDPA's.
    """

    method: str
    n: int
    seconds: float
    peak_mib: float
    max_grad_difference: float


def attention_flops(batch: int, heads: int, n: int, head_dim: int, *, causal: bool, mode: str) -> float:
    """Floating-point operations of attention, by the FlashAttention papers' convention.

    Two matrix products of ``N × N × d`` multiply-adds each, two FLOPs per multiply-add:
    ``4 · B · H · N² · d``; half of it when causal; the backward is counted as 2.5
    forwards, so ``"forward+backward"`` is 3.5 forwards. Softmax FLOPs are not counted.

    Args:
        batch, heads, n, head_dim: B, H, N and d of ``q``, ``k``, ``v`` ``[B, H, N, d]``.
        causal: count only the half of the scores below the diagonal.
        mode: ``"forward"``, ``"backward"`` or ``"forward+backward"``.

    Returns:
        The FLOP count, a float.

    Raises:
        TypeError: a size that is not an int, ``causal`` not a bool or ``mode`` not a str.
        ValueError: an unknown mode or a size below 1.

    Example:
        >>> attention_flops(1, 1, 1024, 64, causal=False, mode="forward") / 1e9
        0.268435456
    """
    where = "attention_flops"
    for name, value in (("batch", batch), ("heads", heads), ("n", n), ("head_dim", head_dim)):
        _validate.integer(where, name, value, minimum=1)
    causal = _validate.boolean(where, "causal", causal)
    if not isinstance(mode, str):
        raise TypeError(f"{where}: mode must be a str, got {type(mode).__name__}")
    if mode not in _MODES:
        raise ValueError(f"{where}: mode must be one of {sorted(_MODES)}, got {mode!r}")
    flops = 4.0 * batch * heads * n * n * head_dim * _MODES[mode]
    return flops / 2 if causal else flops


def _lengths(where: str, lengths: object) -> list[int]:
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1)
    if not lengths:
        raise ValueError(f"{where}: lengths must not be empty")
    return lengths


def _available_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):   # pragma: no cover - not Linux
        return 8 << 30


def cpu_rows(lengths: Sequence[int] = DEFAULT_LENGTHS, *, head_dim: int = 64, block: int = 256,
             repeats: int = 2, seed: int = 0) -> list[CpuRow]:
    """Time and peak memory of naive, tiled and SDPA attention for one head, float32.

    Naive attention is skipped at lengths whose N × N weights would not fit comfortably
    in the memory available now (it needs about three N × N float32 buffers). Inputs
    come from a generator seeded with ``seed``; the global RNG is not touched.

    Args:
        lengths: sequence lengths N, one group of rows each.
        head_dim: d of ``q``, ``k``, ``v`` ``[1, 1, N, d]``.
        block: tile size (queries and keys) of :func:`~attn_course.flash.tiled_attention`.
        repeats: best time of this many runs.
        seed: for the random ``q``, ``k``, ``v``; ``>= 0``.

    Returns:
        One :class:`CpuRow` per (N, method), N in the order given.

    Raises:
        TypeError: ``lengths`` not a sequence of ints, or another size not an int.
        ValueError: no lengths, a size below 1, or a negative seed.

    Example:
        >>> rows = cpu_rows((64,), head_dim=8, block=16, repeats=1)
        >>> [row.method for row in rows], max(row.max_difference for row in rows) < 1e-5
        (['naive', 'tiled', 'sdpa'], True)
    """
    where = "cpu_rows"
    lengths = _lengths(where, lengths)
    head_dim = _validate.integer(where, "head_dim", head_dim, minimum=1)
    block = _validate.integer(where, "block", block, minimum=1)
    repeats = _validate.integer(where, "repeats", repeats, minimum=1)
    seed = _validate.integer(where, "seed", seed, minimum=0)
    methods = {
        "naive": lambda q, k, v: self_attention(q, k, v)[0],
        "tiled": lambda q, k, v: tiled_attention(q, k, v, block_q=block, block_k=block),
        "sdpa": F.scaled_dot_product_attention,
    }
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        q, k, v = (torch.randn(1, 1, n, head_dim, generator=generator) for _ in range(3))
        reference = F.scaled_dot_product_attention(q, k, v)
        for method, fn in methods.items():
            if method == "naive" and 3 * 4 * n * n > _available_memory_bytes() // 2:
                continue   # swapping would measure the disk, not attention
            with torch.no_grad():
                out, peak = peak_memory(fn, q, k, v)
                seconds = best_time(functools.partial(fn, q, k, v), repeats)
            rows.append(CpuRow(method=method, n=n, seconds=seconds, peak_mib=peak / 2**20,
                               max_difference=(out - reference).abs().max().item()))
    return rows


def training_rows(lengths: Sequence[int] = TRAINING_LENGTHS, *, head_dim: int = 64, block: int = 256,
                  seed: int = 0) -> list[TrainingRow]:
    """Peak memory of training: one forward and backward pass, naive against tiled, one head, float32.

    Naive attention (:func:`~attn_course.attention.self_attention`) is backpropagated by autograd,
    which keeps its N × N weights; :func:`~attn_course.flash.tiled_attention` keeps only the
    output and the log-sum-exp and recomputes the weights tile by tile. The gradient flowing into
    the output is random; the gradients are compared with SDPA's. Naive attention is skipped
    where its four N × N float32 buffers would not fit comfortably in the memory available now.

    Args:
        lengths: sequence lengths N.
        head_dim: d of ``q``, ``k``, ``v`` ``[1, 1, N, d]``.
        block: tile size (queries and keys) of ``tiled_attention``.
        seed: for the random inputs; ``>= 0``. The global RNG is not touched.

    Returns:
        One :class:`TrainingRow` per (N, method), N in the order given.

    Raises:
        TypeError: ``lengths`` not a sequence of ints, or another size not an int.
        ValueError: no lengths, a size below 1, or a negative seed.

    Example:
        >>> rows = training_rows((64,), head_dim=8, block=16)
        >>> [row.method for row in rows], max(row.max_grad_difference for row in rows) < 1e-5
        (['naive', 'tiled'], True)
    """
    where = "training_rows"
    lengths = _lengths(where, lengths)
    head_dim = _validate.integer(where, "head_dim", head_dim, minimum=1)
    block = _validate.integer(where, "block", block, minimum=1)
    seed = _validate.integer(where, "seed", seed, minimum=0)
    methods = {
        "naive": lambda q, k, v: self_attention(q, k, v)[0],
        "tiled": lambda q, k, v: tiled_attention(q, k, v, block_q=block, block_k=block),
    }
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        q, k, v, grad_out = (torch.randn(1, 1, n, head_dim, generator=generator) for _ in range(4))
        reference = [t.clone().requires_grad_() for t in (q, k, v)]
        F.scaled_dot_product_attention(*reference).backward(grad_out)
        for method, fn in methods.items():
            if method == "naive" and 4 * 4 * n * n > _available_memory_bytes() // 2:
                continue
            inputs = [t.clone().requires_grad_() for t in (q, k, v)]

            def forward_backward(fn=fn, inputs=inputs, grad_out=grad_out):
                fn(*inputs).backward(grad_out)

            start = time.perf_counter()
            _, peak = peak_memory(forward_backward)
            seconds = time.perf_counter() - start
            difference = max((mine.grad - theirs.grad).abs().max().item() for mine, theirs in zip(inputs, reference))
            rows.append(TrainingRow(method=method, n=n, seconds=seconds, peak_mib=peak / 2**20,
                                    max_grad_difference=difference))
    return rows


def print_training(rows: Sequence[TrainingRow]) -> None:
    """Print the rows of :func:`training_rows`, then tiled attention's memory saving per N.

    Args:
        rows: a non-empty sequence of :class:`TrainingRow`.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`TrainingRow`.
        ValueError: no rows.
    """
    rows = check_rows("print_training", rows, (TrainingRow,))
    print(f"{'method':>6} {'N':>6} {'seconds':>9} {'peak MiB':>9} {'grad diff':>9}   (forward + backward)")
    for r in rows:
        print(f"{r.method:>6} {r.n:>6} {r.seconds:>9.3f} {r.peak_mib:>9.1f} {r.max_grad_difference:>9.1e}")
    for n in sorted({r.n for r in rows}):
        peaks = {r.method: r.peak_mib for r in rows if r.n == n}
        if "naive" in peaks and "tiled" in peaks:
            print(f"N={n}: forward+backward peak memory {peaks['naive'] / peaks['tiled']:.1f}x below naive "
                  f"({peaks['naive']:.1f} MiB against {peaks['tiled']:.1f} MiB)")


def gpu_rows(lengths: Sequence[int] = DEFAULT_LENGTHS, *, head_dims: Sequence[int] = (64, 128),
             dtypes: Sequence[torch.dtype] = (torch.bfloat16, torch.float16), tokens: int = 16384,
             model_dim: int = 2048, seed: int = 0) -> list[GpuRow]:
    """TFLOP/s of our Triton kernel, SDPA's backends and naive attention on the current GPU.

    Batch and heads follow the FlashAttention papers: ``B = tokens / N`` sequences (at
    least 1) of ``H = model_dim / d`` heads, so every row does the same work per token.
    A backend that does not support a case is left out of the rows; naive attention is
    left out above N = 8192. Inputs come from a CUDA generator seeded with ``seed``.

    Args:
        lengths: sequence lengths N.
        head_dims: d values; each must divide ``model_dim``.
        dtypes: floating dtypes, e.g. ``torch.float16``.
        tokens: B · N per measurement.
        model_dim: H · d per measurement.
        seed: for the random ``q``, ``k``, ``v`` and output gradient; ``>= 0``.

    Returns:
        One :class:`GpuRow` per (dtype, d, causal, N, method, mode).

    Raises:
        TypeError: a size or sequence of the wrong type, or a dtype that is not a floating
            ``torch.dtype``.
        ValueError: empty lengths, a size below 1, a head dim that does not divide
            ``model_dim``, or a negative seed.
        RuntimeError: no CUDA GPU.
    """
    where = "gpu_rows"
    lengths = _lengths(where, lengths)
    head_dims = _validate.integer_sequence(where, "head_dims", head_dims, minimum=1)
    if isinstance(dtypes, (str, bytes)) or not isinstance(dtypes, Sequence):
        raise TypeError(f"{where}: dtypes must be a sequence of torch dtypes, got {type(dtypes).__name__}")
    for index, dtype in enumerate(dtypes):
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"{where}: dtypes[{index}] must be a floating torch.dtype, got {dtype!r}")
    tokens = _validate.integer(where, "tokens", tokens, minimum=1)
    model_dim = _validate.integer(where, "model_dim", model_dim, minimum=1)
    for index, head_dim in enumerate(head_dims):
        if model_dim % head_dim:
            raise ValueError(f"{where}: head_dims[{index}] must divide model_dim={model_dim}, got {head_dim}")
    seed = _validate.integer(where, "seed", seed, minimum=0)
    if not torch.cuda.is_available():
        raise RuntimeError(f"{where}: needs a CUDA GPU; use cpu_rows on a CPU")
    # Imported here: triton.testing and the launcher are only needed, and only work fast, on a GPU.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from attn_course.flash.triton_attention import flash_attention

    def sdpa_with(backend):
        def run(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    def naive(q, k, v, causal):   # the course's plain attention, as on the CPU
        return self_attention(q, k, v, causal_mask(q.shape[-2], device=q.device) if causal else None)[0]

    methods = {"ours (Triton)": lambda q, k, v, causal: flash_attention(q, k, v, causal=causal),
               "sdpa flash": sdpa_with(SDPBackend.FLASH_ATTENTION),
               "sdpa efficient": sdpa_with(SDPBackend.EFFICIENT_ATTENTION),
               "sdpa cudnn": sdpa_with(SDPBackend.CUDNN_ATTENTION),
               "naive": naive}
    generator = torch.Generator(device="cuda").manual_seed(seed)
    rows = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for causal in (False, True):
                for n in lengths:
                    batch, heads = max(1, tokens // n), model_dim // head_dim
                    q, k, v, grad_out = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=dtype,
                                                     generator=generator) for _ in range(4))
                    q, k, v = (t.requires_grad_() for t in (q, k, v))
                    for method, fn in methods.items():
                        if method == "naive" and n > 8192:
                            continue   # the N × N matrices alone would take tens of GB
                        try:
                            fn(q, k, v, causal)
                        except RuntimeError:   # a backend that does not support this case
                            continue
                        for mode, milliseconds in _gpu_milliseconds(do_bench, fn, q, k, v, grad_out, causal).items():
                            flops = attention_flops(batch, heads, n, head_dim, causal=causal, mode=mode)
                            rows.append(GpuRow(method=method, dtype=str(dtype).replace("torch.", ""),
                                               head_dim=head_dim, causal=causal, n=n, mode=mode,
                                               milliseconds=milliseconds, tflops=flops / milliseconds / 1e9))
                    del q, k, v, grad_out
                    torch.cuda.empty_cache()
    return rows


def _gpu_milliseconds(do_bench, fn, q, k, v, grad_out, causal) -> dict[str, float]:
    def forward():
        with torch.no_grad():
            fn(q, k, v, causal)

    def forward_backward():
        fn(q, k, v, causal).backward(grad_out)

    return {"forward": do_bench(forward, warmup=5, rep=30),
            "forward+backward": do_bench(forward_backward, warmup=5, rep=30)}


def print_flash(rows: Sequence[CpuRow] | Sequence[GpuRow]) -> None:
    """Print the rows of :func:`cpu_rows` or :func:`gpu_rows` as a table.

    CPU rows are followed by one line per N with tiled attention's memory saving over naive.

    Args:
        rows: a non-empty sequence of :class:`CpuRow`, or one of :class:`GpuRow`.

    Raises:
        TypeError: ``rows`` not a sequence of one of the two row types.
        ValueError: no rows.
    """
    rows = check_rows("print_flash", rows, (CpuRow, GpuRow))
    if isinstance(rows[0], GpuRow):
        print(f"{'method':>16} {'dtype':>9} {'d':>4} {'causal':>6} {'N':>6} {'mode':>17} {'TFLOP/s':>8}")
        for r in rows:
            print(f"{r.method:>16} {r.dtype:>9} {r.head_dim:>4} {str(r.causal):>6} {r.n:>6} "
                  f"{r.mode:>17} {r.tflops:>8.1f}")
        return
    print(f"{'method':>6} {'N':>6} {'seconds':>9} {'peak MiB':>9} {'max diff':>9}")
    for r in rows:
        print(f"{r.method:>6} {r.n:>6} {r.seconds:>9.3f} {r.peak_mib:>9.1f} {r.max_difference:>9.1e}")
    for n in sorted({r.n for r in rows}):
        peaks = {r.method: r.peak_mib for r in rows if r.n == n}
        if "naive" in peaks and "tiled" in peaks:
            print(f"N={n}: tiled peak memory {peaks['naive'] / peaks['tiled']:.1f}x below naive")


def plot_rows(rows: Sequence[CpuRow] | Sequence[GpuRow], path: str | os.PathLike, *, title: str) -> None:
    """Save a PNG of the rows from :func:`cpu_rows` or :func:`gpu_rows`, against N on a log axis.

    CPU rows give two panels (time and peak memory, log-log); GPU rows one panel of TFLOP/s
    per (dtype, d, causal, mode).

    Args:
        rows: a non-empty sequence of :class:`CpuRow`, or one of :class:`GpuRow`.
        path: the PNG file to write.
        title: the figure's title, e.g. :func:`~attn_course.bench.timing.machine_description`.

    Raises:
        TypeError: ``rows`` not a sequence of one row type, ``path`` not a path, ``title`` not a str.
        ValueError: no rows.
        ImportError: matplotlib is not installed.
    """
    where = "plot_rows"
    rows = check_rows(where, rows, (CpuRow, GpuRow))
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{where}: path must be a str or path, got {type(path).__name__}")
    if not isinstance(title, str):
        raise TypeError(f"{where}: title must be a str, got {type(title).__name__}")
    import matplotlib  # here, not at the top: a bare GPU image may lack it, and the CSV suffices

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if isinstance(rows[0], GpuRow):
        panels = sorted({(r.dtype, r.head_dim, r.causal, r.mode) for r in rows}, key=str)
        columns = 4
        figure, axes = plt.subplots(math.ceil(len(panels) / columns), columns, squeeze=False,
                                    figsize=(4 * columns, 3.2 * math.ceil(len(panels) / columns)))
        for axis, panel in zip(axes.flat, panels):
            chosen = [r for r in rows if (r.dtype, r.head_dim, r.causal, r.mode) == panel]
            for method in dict.fromkeys(r.method for r in chosen):
                points = [(r.n, r.tflops) for r in chosen if r.method == method]
                axis.plot(*zip(*points), marker="o", label=method)
            axis.set(xscale="log", xlabel="N", ylabel="TFLOP/s",
                     title=f"{panel[0]} d={panel[1]} {'causal' if panel[2] else 'full'} {panel[3]}")
        axes.flat[0].legend(fontsize=7)
        for axis in list(axes.flat)[len(panels):]:
            axis.set_visible(False)
    else:
        figure, axes = plt.subplots(1, 2, figsize=(10, 4))
        for method in dict.fromkeys(r.method for r in rows):
            chosen = [r for r in rows if r.method == method]
            axes[0].plot([r.n for r in chosen], [r.seconds for r in chosen], marker="o", label=method)
            axes[1].plot([r.n for r in chosen], [r.peak_mib for r in chosen], marker="o", label=method)
        axes[0].set(xscale="log", yscale="log", xlabel="N", ylabel="seconds (best)", title="time")
        axes[1].set(xscale="log", yscale="log", xlabel="N", ylabel="peak MiB", title="peak memory")
        axes[1].legend()
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
