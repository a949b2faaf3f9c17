"""``python -m attn_course.bench flash``: FlashAttention against the alternatives.

* On a CPU: seconds and peak memory against N for naive attention (the N × N weights are
  materialised), :func:`~attn_course.flash.tiled_attention` and PyTorch's
  ``scaled_dot_product_attention``. Naive memory grows as N², tiled memory as N.
* On a CUDA GPU: forward and forward+backward TFLOP/s of
  :func:`~attn_course.flash.flash_attention`, of SDPA with each available backend
  (flash, memory-efficient, cuDNN) and of naive attention, in float16 and bfloat16, head
  dims 64 and 128, N from 512 to 16384, causal or not.

Both write ``bench-results/flash-<cpu|gpu>.csv`` and a PNG plot of it.
"""

from __future__ import annotations

import functools
import math
import os
import platform

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course.attention import self_attention
from attn_course.bench import best_time
from attn_course.flash.tiled import tiled_attention
from attn_course.masks import causal_mask
from attn_course.memory import peak_memory

__all__ = ["attention_flops", "cpu_rows", "gpu_rows", "machine_description", "plot_rows"]


def attention_flops(batch: int, heads: int, n: int, head_dim: int, *, causal: bool, mode: str) -> float:
    """Floating-point operations of attention, by the FlashAttention papers' convention.

    Two matrix products of ``N × N × d`` multiply-adds each: ``4 · B · H · N² · d``; half
    of it when causal; the backward is counted as 2.5 forwards, so ``"forward+backward"``
    is 3.5 forwards.

    Raises:
        ValueError: an unknown mode or a non-positive size.
    """
    where = "attention_flops"
    for name, value in (("batch", batch), ("heads", heads), ("n", n), ("head_dim", head_dim)):
        _validate.integer(where, name, value, minimum=1)
    factors = {"forward": 1.0, "backward": 2.5, "forward+backward": 3.5}
    if mode not in factors:
        raise ValueError(f"{where}: mode must be one of {sorted(factors)}, got {mode!r}")
    flops = 4.0 * batch * heads * n * n * head_dim * factors[mode]
    return flops / 2 if causal else flops


def machine_description() -> str:
    """The processor or GPU, torch and Triton versions, for benchmark headers and plots."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:   # pragma: no cover - Triton is a Linux-only dependency
        triton_version = "not installed"
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        device = f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"
    return f"{device}; torch {torch.__version__}; Triton {triton_version}"


def _available_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):   # pragma: no cover - not Linux
        return 8 << 30


def cpu_rows(lengths=(512, 1024, 2048, 4096, 8192, 16384), *, head_dim: int = 64, block: int = 256,
             repeats: int = 2, seed: int = 0) -> list[dict]:
    """Time and peak memory of naive, tiled and SDPA attention for one head, float32.

    Naive attention is skipped at lengths whose N × N weights would not fit comfortably
    in the memory available now (it needs about three N × N float32 buffers).

    Args:
        lengths: sequence lengths N.
        head_dim: d.
        block: tile size of :func:`~attn_course.flash.tiled_attention`.
        repeats: best time of this many runs.
        seed: for the random q, k, v.

    Returns:
        One dict per (method, N): ``method``, ``n``, ``seconds``, ``peak_mib``,
        ``max_difference`` (against SDPA).
    """
    where = "cpu_rows"
    lengths = [_validate.integer(where, "lengths[i]", n, minimum=1) for n in lengths]
    repeats = _validate.integer(where, "repeats", repeats, minimum=1)
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
                continue
            with torch.no_grad():
                out, peak = peak_memory(fn, q, k, v)
                seconds = best_time(functools.partial(fn, q, k, v), repeats)
            rows.append({"method": method, "n": n, "seconds": seconds, "peak_mib": peak / 2**20,
                         "max_difference": (out - reference).abs().max().item()})
    return rows


def gpu_rows(lengths=(512, 1024, 2048, 4096, 8192, 16384), *, head_dims=(64, 128),
             dtypes=(torch.bfloat16, torch.float16), tokens: int = 16384, model_dim: int = 2048) -> list[dict]:
    """TFLOP/s of our Triton kernel, SDPA's backends and naive attention on the current GPU.

    Batch and heads follow the FlashAttention papers: ``B = tokens / N`` sequences of
    ``H = model_dim / d`` heads, so every row does the same work per token.

    Returns:
        One dict per measurement: ``method``, ``dtype``, ``head_dim``, ``causal``, ``n``,
        ``mode`` (forward or forward+backward), ``milliseconds``, ``tflops``.

    Raises:
        RuntimeError: no CUDA GPU.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("gpu_rows: needs a CUDA GPU; use cpu_rows on a CPU")
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
    rows = []
    for dtype in dtypes:
        for head_dim in head_dims:
            for causal in (False, True):
                for n in lengths:
                    batch, heads = max(1, tokens // n), model_dim // head_dim
                    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=dtype,
                                           requires_grad=True) for _ in range(3))
                    grad_out = torch.randn_like(q)
                    for method, fn in methods.items():
                        if method == "naive" and n > 8192:
                            continue   # the N × N matrices alone would take tens of GB
                        try:
                            fn(q, k, v, causal)
                        except RuntimeError:   # a backend that does not support this case
                            continue
                        for mode, milliseconds in _gpu_milliseconds(do_bench, fn, q, k, v, grad_out, causal).items():
                            flops = attention_flops(batch, heads, n, head_dim, causal=causal, mode=mode)
                            rows.append({"method": method, "dtype": str(dtype).replace("torch.", ""),
                                         "head_dim": head_dim, "causal": causal, "n": n, "mode": mode,
                                         "milliseconds": milliseconds, "tflops": flops / milliseconds / 1e9})
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


def plot_rows(rows: list[dict], path, *, title: str) -> None:
    """Save a PNG of the rows from :func:`cpu_rows` or :func:`gpu_rows` (log-log against N)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if "tflops" in rows[0]:
        panels = sorted({(r["dtype"], r["head_dim"], r["causal"], r["mode"]) for r in rows}, key=str)
        columns = 4
        figure, axes = plt.subplots(math.ceil(len(panels) / columns), columns, squeeze=False,
                                    figsize=(4 * columns, 3.2 * math.ceil(len(panels) / columns)))
        for axis, panel in zip(axes.flat, panels):
            chosen = [r for r in rows if (r["dtype"], r["head_dim"], r["causal"], r["mode"]) == panel]
            for method in dict.fromkeys(r["method"] for r in chosen):
                points = [(r["n"], r["tflops"]) for r in chosen if r["method"] == method]
                axis.plot(*zip(*points), marker="o", label=method)
            axis.set(xscale="log", xlabel="N", ylabel="TFLOP/s",
                     title=f"{panel[0]} d={panel[1]} {'causal' if panel[2] else 'full'} {panel[3]}")
        axes.flat[0].legend(fontsize=7)
        for axis in list(axes.flat)[len(panels):]:
            axis.set_visible(False)
    else:
        figure, axes = plt.subplots(1, 2, figsize=(10, 4))
        for method in dict.fromkeys(r["method"] for r in rows):
            chosen = [r for r in rows if r["method"] == method]
            axes[0].plot([r["n"] for r in chosen], [r["seconds"] for r in chosen], marker="o", label=method)
            axes[1].plot([r["n"] for r in chosen], [r["peak_mib"] for r in chosen], marker="o", label=method)
        axes[0].set(xscale="log", yscale="log", xlabel="N", ylabel="seconds (best)", title="time")
        axes[1].set(xscale="log", yscale="log", xlabel="N", ylabel="peak MiB", title="peak memory")
        axes[1].legend()
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
