"""The GPU rows as PNGs: TFLOP/s against N, and K/V GB/s against N_k."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from attn_course import _validate
from attn_course.measure.rows import check_rows
from benchmarks.flash_gpu.rows import DecodeRow, GpuRow

__all__ = ["plot_gpu_rows"]


def plot_gpu_rows(rows: Sequence[GpuRow] | Sequence[DecodeRow], path: str | os.PathLike, *, title: str) -> None:
    """Save a PNG of :func:`gpu_rows` (TFLOP/s against N, one panel per dtype, d, mask, mode and
    grouped-query layout)
    or :func:`decode_rows` (K/V GB/s against N_k, one panel per dtype and N_q). Skipped rows
    are left out.

    Args:
        rows: a non-empty sequence of :class:`GpuRow`, or one of :class:`DecodeRow`.
        path: the PNG file to write.
        title: the figure's title; name the machine (:meth:`MachineInfo.title`).

    Raises:
        TypeError: rows of mixed or other types, ``path`` not a path, ``title`` not a str.
        ValueError: no rows.
        ImportError: matplotlib is not installed.
    """
    where = "plot_gpu_rows"
    rows = check_rows(where, rows, (GpuRow, DecodeRow))
    path = _validate.path(where, "path", path)
    if not isinstance(title, str):
        raise TypeError(f"{where}: title must be a str, got {type(title).__name__}")
    import matplotlib  # here, not at the top: a bare GPU image may lack it, and the CSV suffices

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    decode = isinstance(rows[0], DecodeRow)
    if decode:
        def panel_of(r):
            return (r.dtype, r.n_q)
        x_of, y_of, ylabel, xlabel = (lambda r: r.n_k), (lambda r: r.kv_gbps), "K/V GB/s", "N_k (KV cache length)"
    else:
        def panel_of(r):   # grouped-query rows get panels of their own
            return (r.dtype, r.head_dim, r.causal, r.mode, f"H={r.heads}/H_kv={r.kv_heads}" if r.kv_heads < r.heads
                    else "")
        x_of, y_of, ylabel, xlabel = (lambda r: r.n), (lambda r: r.tflops), "TFLOP/s", "N"
    panels = list(dict.fromkeys(panel_of(r) for r in rows))
    columns = min(len(panels), 2 if decode else 3)
    height = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(height, columns, squeeze=False, figsize=(4.5 * columns, 3.2 * height + 0.6))
    for axis, panel in zip(axes.flat, panels):
        chosen = [r for r in rows if panel_of(r) == panel and r.status == "ok"]
        for method in dict.fromkeys(r.method for r in chosen):
            points = sorted((x_of(r), y_of(r)) for r in chosen if r.method == method)
            axis.plot(*zip(*points), marker="o", label=method)
        if decode:
            name = f"{panel[0]} N_q={panel[1]}"
        else:
            name = f"{panel[0]} d={panel[1]} {'causal' if panel[2] else 'full'} {panel[3]} {panel[4]}".rstrip()
        axis.set_xscale("log", base=2)
        ticks = sorted({x_of(r) for r in rows})
        axis.set_xticks(ticks, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks], fontsize=7)
        axis.xaxis.set_minor_formatter(NullFormatter())
        axis.set(xlabel=xlabel, ylabel=ylabel, title=name)
        axis.title.set_fontsize(9)
        if chosen:
            axis.legend(fontsize=6)
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
