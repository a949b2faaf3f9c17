"""``python -m attn_course.measure flash``: FlashAttention against the alternatives.

* On a CPU (:func:`cpu_rows`): seconds and peak memory against N for naive attention (the
  N × N weights are materialised), :func:`~attn_course.flash.tiled_attention` and PyTorch's
  ``scaled_dot_product_attention``. Naive memory grows as N², tiled memory as N.
* On a CPU, for training (:func:`training_rows`): peak memory of one forward and backward pass,
  naive attention (autograd keeps the N × N weights) against ``tiled_attention``, whose backward
  (:class:`~attn_course.flash.TiledAttentionFunction`) keeps only O and the log-sum-exp.
* On a CUDA GPU: :mod:`benchmarks.flash_gpu` (forward and backward TFLOP/s of
  :func:`~attn_course.flash.flash_attention` against SDPA's backends and naive attention, and
  decoding against a long KV cache). :func:`attention_flops`, the FLOP count both use, is here.

CPU rows are written to ``bench-results/flash-cpu.csv`` with a PNG plot (:func:`plot_rows`), the
training rows to ``flash-cpu-training.csv``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.flash.tiled import tiled_attention
from attn_course.measure.memory import available_memory_bytes, peak_memory
from attn_course.measure.rows import check_rows, pyplot_for, save_time_and_memory
from attn_course.measure.timing import best_time, timed

__all__ = ["CpuRow", "TrainingRow", "attention_flops", "cpu_rows", "plot_rows", "training_rows"]

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
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1, nonempty=True)
    head_dim, block, repeats = _validate.integers(where, minimum=1, head_dim=head_dim, block=block, repeats=repeats)
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
            if method == "naive" and 3 * 4 * n * n > available_memory_bytes() // 2:
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

    Naive attention (:func:`~attn_course.core.attention.self_attention`) is backpropagated by autograd,
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
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1, nonempty=True)
    head_dim, block = _validate.integers(where, minimum=1, head_dim=head_dim, block=block)
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
            if method == "naive" and 4 * 4 * n * n > available_memory_bytes() // 2:
                continue
            inputs = [t.clone().requires_grad_() for t in (q, k, v)]

            def forward_backward(fn=fn, inputs=inputs, grad_out=grad_out):
                fn(*inputs).backward(grad_out)

            # One pass, timed and counted at once: a second would double the cost of the longest N.
            (_, peak), seconds = timed(peak_memory, forward_backward)
            difference = max((mine.grad - theirs.grad).abs().max().item() for mine, theirs in zip(inputs, reference))
            rows.append(TrainingRow(method=method, n=n, seconds=seconds, peak_mib=peak / 2**20,
                                    max_grad_difference=difference))
    return rows


def plot_rows(rows: Sequence[CpuRow], path: str | os.PathLike, *, title: str) -> None:
    """Save a PNG of the rows from :func:`cpu_rows`: time and peak memory against N, log-log
    (GPU rows: :func:`benchmarks.flash_gpu.plot_gpu_rows`).

    Args:
        rows: a non-empty sequence of :class:`CpuRow`.
        path: the PNG file to write.
        title: the figure's title, e.g. :func:`~attn_course.measure.timing.machine_description`.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`CpuRow`, ``path`` not a path, ``title`` not a str.
        ValueError: no rows.
        ImportError: matplotlib is not installed.
    """
    where = "plot_rows"
    rows = check_rows(where, rows, (CpuRow,))
    path, plt = pyplot_for(where, path, title)
    series = {method: [(r.n, r.seconds, r.peak_mib) for r in rows if r.method == method]
              for method in dict.fromkeys(r.method for r in rows)}
    save_time_and_memory(series, path, plt, title=title)
