"""The distributed measurements as one figure: bytes, memory and time per rank against ``P`` and ``N``."""

from __future__ import annotations

import os
from collections.abc import Sequence

from attn_course.measure.distributed.measurements import MemoryRow, TimeRow, TrafficRow
from attn_course.measure.rows import check_rows, pyplot_for

__all__ = ["plot_distributed"]


def plot_distributed(traffic: Sequence[TrafficRow], memory: Sequence[MemoryRow], timing: Sequence[TimeRow],
                     path: str | os.PathLike, *, title: str) -> None:
    """Save a PNG: forward bytes per rank against ``P`` (both sweeps, formulas as lines), peak memory per
    rank against ``N`` (one line per method and ``P``), and time ratios against ``P``.

    Args:
        traffic, memory, timing, path, title: the rows of the three measurements, the PNG, its title.

    Raises:
        TypeError, ValueError: rows that are not non-empty sequences of their row type, ``path`` not a
            path, ``title`` not a str.
        ImportError: matplotlib is not installed.
    """
    where = "plot_distributed"
    traffic, memory, timing = (check_rows(where, rows, (kind,)) for rows, kind in
                               ((traffic, TrafficRow), (memory, MemoryRow), (timing, TimeRow)))
    path, plt = pyplot_for(where, path, title)

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    methods = list(dict.fromkeys(r.method for r in traffic + memory + timing))
    colour = {m: f"C{i}" for i, m in enumerate(methods)}
    drawn = [m for m in methods if not (m in ("ring zigzag", "ring striped") and "ring" in methods)]  # as ring
    for scaling, style in (("N fixed", "-"), ("N ∝ P", "--")):
        for method in drawn:
            chosen = [r for r in traffic if r.method == method and r.scaling == scaling]
            if chosen:
                axes[0].plot([r.world_size for r in chosen], [r.forward_formula / 2**10 for r in chosen], style,
                             color=colour[method], label=f"{method}, {scaling} (formula)")
                axes[0].plot([r.world_size for r in chosen], [r.forward_bytes / 2**10 for r in chosen], "o",
                             color=colour[method])
    axes[0].set(xlabel="P (ranks)", ylabel="KiB sent per rank (forward)",
                title="bytes: lines formula, dots measured\n(ring zigzag and striped send what ring sends)")
    markers = ("o", "s", "^", "D", "v")
    for method in methods:
        for index, p in enumerate(sorted({r.world_size for r in memory})):
            chosen = [r for r in memory if r.method == method and r.world_size == p]
            if chosen:
                axes[1].plot([r.n for r in chosen], [r.peak_bytes / 2**20 for r in chosen],
                             marker=markers[index % len(markers)], color=colour[method], label=f"{method}, P={p}")
    axes[1].set(yscale="log", xlabel="N", ylabel="peak MiB per rank (forward)",
                title="memory per rank (exact)")
    for method in methods:
        chosen = [r for r in timing if r.method == method and r.ratio_to_one_rank is not None]
        if chosen:
            axes[2].plot([r.world_size for r in chosen], [r.ratio_to_one_rank for r in chosen], marker="o",
                         color=colour[method], label=method)
    axes[2].axhline(1.0, color="grey", linewidth=0.8)
    axes[2].set(xlabel="P (ranks)", ylabel="time / time at P=1", title=f"CPU time ({os.cpu_count()} cores)")
    for axis, rows in ((axes[0], traffic), (axes[2], timing)):
        ranks = sorted({r.world_size for r in rows})
        axis.set_xticks(ranks, [str(p) for p in ranks])
    lengths = sorted({r.n for r in memory})
    axes[1].set_xscale("log", base=2)
    axes[1].set_xticks(lengths, [str(n) for n in lengths])
    axes[1].minorticks_off()
    for axis in axes:
        axis.legend(fontsize=7)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
