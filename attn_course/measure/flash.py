"""``python -m benchmarks flash`` on a CPU: FlashAttention's tiled algorithm against naive attention (which
materialises the N × N weights) and PyTorch's SDPA, time and peak memory against N, forward (:func:`cpu_rows`)
and forward + backward (:func:`training_rows`). On a CUDA GPU: :mod:`benchmarks.flash_gpu`, whose FLOP count
(:func:`attention_flops`) is here."""

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
from attn_course.measure.rows import check_rows, save_time_and_memory
from attn_course.measure.timing import best_time, timed

__all__ = ["CpuRow", "TrainingRow", "attention_flops", "cpu_rows", "plot_rows", "training_rows"]

DEFAULT_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
TRAINING_LENGTHS = (1024, 2048, 4096, 8192)
_MODES = {"forward": 1.0, "backward": 2.5, "forward+backward": 3.5}   # in forwards, as the papers count


@dataclasses.dataclass(frozen=True)
class CpuRow:
    """One (method, N) measurement of :func:`cpu_rows`, one head of ``N × d`` float32: ``method`` ``"naive"``,
    ``"tiled"`` or ``"sdpa"``; best ``seconds`` of one call; ``peak_mib`` allocated during it (inputs excluded);
    ``max_difference`` of the output from SDPA's."""

    method: str
    n: int
    seconds: float
    peak_mib: float
    max_difference: float


@dataclasses.dataclass(frozen=True)
class TrainingRow:
    """One (method, N) measurement of :func:`training_rows`: ``method`` ``"naive"`` or ``"tiled"``; ``seconds`` of
    the forward and backward pass; ``peak_mib`` allocated during both (inputs excluded, gradients included);
    ``max_grad_difference`` of dq, dk, dv from SDPA's."""

    method: str
    n: int
    seconds: float
    peak_mib: float
    max_grad_difference: float


def attention_flops(batch: int, heads: int, n: int, head_dim: int, *, causal: bool, mode: str) -> float:
    """Floating-point operations of attention, by the FlashAttention papers' convention.

    Two matrix products of ``N × N × d`` multiply-adds each, two FLOPs per multiply-add: ``4 · B · H · N² · d``;
    half of it when causal; the backward counts as 2.5 forwards, ``"forward+backward"`` as 3.5. Softmax FLOPs
    are not counted.

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
    _validate.integers(where, minimum=1, batch=batch, heads=heads, n=n, head_dim=head_dim)
    causal = _validate.boolean(where, "causal", causal)
    if not isinstance(mode, str):
        raise TypeError(f"{where}: mode must be a str, got {type(mode).__name__}")
    if mode not in _MODES:
        raise ValueError(f"{where}: mode must be one of {sorted(_MODES)}, got {mode!r}")
    flops = 4.0 * batch * heads * n * n * head_dim * _MODES[mode]
    return flops / 2 if causal else flops


def _methods(block: int) -> dict:
    return {"naive": lambda q, k, v: self_attention(q, k, v)[0],
            "tiled": lambda q, k, v: tiled_attention(q, k, v, block_q=block, block_k=block)}


def _check(where: str, lengths: object, seed: object, **sizes: object) -> tuple:
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1, nonempty=True)
    return lengths, *_validate.integers(where, minimum=1, **sizes), _validate.integer(where, "seed", seed, minimum=0)


def cpu_rows(lengths: Sequence[int] = DEFAULT_LENGTHS, *, head_dim: int = 64, block: int = 256,
             repeats: int = 2, seed: int = 0) -> list[CpuRow]:
    """Time and peak memory of naive, tiled and SDPA attention for one head, float32.

    Naive attention is skipped where its three N × N float32 buffers would not fit comfortably in the memory
    free now. Inputs come from a generator seeded with ``seed``; the global RNG is not touched.

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
    lengths, head_dim, block, repeats, seed = _check("cpu_rows", lengths, seed, head_dim=head_dim, block=block,
                                                     repeats=repeats)
    methods = {**_methods(block), "sdpa": F.scaled_dot_product_attention}
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

    Autograd keeps naive attention's N × N weights for its backward; :func:`~attn_course.flash.tiled_attention`
    keeps only the output and the log-sum-exp and recomputes the weights tile by tile. The gradient flowing into
    the output is random; the gradients are compared with SDPA's. Naive attention is skipped where its four
    N × N float32 buffers would not fit comfortably in the memory free now. Arguments and errors as
    :func:`cpu_rows` (one timed pass, no ``repeats``).

    Returns:
        One :class:`TrainingRow` per (N, method), N in the order given.

    Example:
        >>> rows = training_rows((64,), head_dim=8, block=16)
        >>> [row.method for row in rows], max(row.max_grad_difference for row in rows) < 1e-5
        (['naive', 'tiled'], True)
    """
    lengths, head_dim, block, seed = _check("training_rows", lengths, seed, head_dim=head_dim, block=block)
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        q, k, v, grad_out = (torch.randn(1, 1, n, head_dim, generator=generator) for _ in range(4))
        reference = [t.clone().requires_grad_() for t in (q, k, v)]
        F.scaled_dot_product_attention(*reference).backward(grad_out)
        for method, fn in _methods(block).items():
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
    """Save a PNG of :func:`cpu_rows`'s rows, time and peak memory against N, log-log; TypeError or ValueError for
    rows that are not a non-empty sequence of :class:`CpuRow`, a bad path or title; ImportError without matplotlib."""
    rows = check_rows("plot_rows", rows, (CpuRow,))
    save_time_and_memory("plot_rows", {method: [(r.n, r.seconds, r.peak_mib) for r in rows if r.method == method]
                                       for method in dict.fromkeys(r.method for r in rows)}, path, title=title)
