"""The distributed measurements as tables and as one figure."""

from __future__ import annotations

import os
from collections.abc import Sequence

from attn_course.measure.distributed.critical_path import CriticalPathRow
from attn_course.measure.distributed.measurements import MemoryRow, TimeRow, TrafficRow
from attn_course.measure.rows import check_rows, pyplot_for

__all__ = ["plot_distributed", "print_critical_path", "print_memory", "print_time", "print_traffic"]


def print_traffic(rows: Sequence[TrafficRow]) -> None:
    """Print :func:`measure_traffic`'s rows: bytes per rank counted, tapped at ``torch.distributed``, and by formula.

    Raises:
        TypeError, ValueError: ``rows`` not a non-empty sequence of :class:`TrafficRow`.
    """
    rows = check_rows("print_traffic", rows, (TrafficRow,))
    grouped = any(r.kv_heads != r.heads for r in rows)
    print(f"{'method':>12} {'sweep':>8} {'P':>3} {'N':>6} {'N/P':>5} " + (f"{'H/H_kv':>7} " if grouped else "")
          + f"{'fwd B':>9} {'tapped':>9} {'formula':>9} {'fwd+bwd B':>10} {'tapped':>10} {'formula':>9} {'exact':>6}")
    for r in rows:
        heads = f"{f'{r.heads}/{r.kv_heads}':>7} " if grouped else ""
        print(f"{r.method:>12} {r.scaling:>8} {r.world_size:>3} {r.n:>6} {r.n_local:>5} {heads}{r.forward_bytes:>9} "
              f"{r.wire_forward_bytes:>9} {r.forward_formula:>9} {r.total_bytes:>10} {r.wire_total_bytes:>10} "
              f"{r.total_formula:>9} {'yes' if r.matches else 'NO':>6}")


def print_memory(rows: Sequence[MemoryRow]) -> None:
    """Print :func:`measure_rank_memory`'s rows: peak KiB per rank and its ratio to one shard.

    Raises:
        TypeError, ValueError: ``rows`` not a non-empty sequence of :class:`MemoryRow`.
    """
    rows = check_rows("print_memory", rows, (MemoryRow,))
    print(f"{'method':>12} {'P':>3} {'N':>6} {'N/P':>5} {'peak KiB':>10} {'shard KiB':>10} {'peak/shard':>10} "
          f"{'scores KiB':>11}")
    for r in rows:
        print(f"{r.method:>12} {r.world_size:>3} {r.n:>6} {r.n_local:>5} {r.peak_bytes / 2**10:>10.1f} "
              f"{r.shard_bytes / 2**10:>10.1f} {r.peak_bytes / r.shard_bytes:>10.1f} {r.scores_bytes / 2**10:>11.1f}")


def print_time(rows: Sequence[TimeRow]) -> None:
    """Print :func:`measure_time`'s rows: milliseconds and the ratio to one rank.

    Raises:
        TypeError, ValueError: ``rows`` not a non-empty sequence of :class:`TimeRow`.
    """
    rows = check_rows("print_time", rows, (TimeRow,))
    print(f"{'method':>12} {'P':>3} {'N':>6} {'best ms':>9} {'median':>9} {'range ms':>17} {'vs P=1':>7} "
          f"{'max diff':>9}  note")
    for r in rows:
        ratio = "n/a" if r.ratio_to_one_rank is None else f"{r.ratio_to_one_rank:.2f}"
        note = f"oversubscribed: {r.world_size} processes on {os.cpu_count()} cores" if r.oversubscribed else ""
        spread = f"{r.min_seconds * 1e3:.2f}-{r.max_seconds * 1e3:.2f}"
        print(f"{r.method:>12} {r.world_size:>3} {r.n:>6} {r.seconds * 1e3:>9.2f} {r.median_seconds * 1e3:>9.2f} "
              f"{spread:>17} {ratio:>7} "
              f"{r.max_difference:>9.1e}  {note}")


def print_critical_path(rows: Sequence[CriticalPathRow]) -> None:
    """Print :func:`~attn_course.measure.distributed.critical_path.measure_critical_path`'s rows: per step the
    most score elements any rank computed, their sum (the critical path) against the formula, the path in
    units of ``N²/P``, the speed-up over contiguous and, per step, the slowest rank's milliseconds.

    Raises:
        TypeError, ValueError: ``rows`` not a non-empty sequence of :class:`CriticalPathRow`.
    """
    rows = check_rows("print_critical_path", rows, (CriticalPathRow,))
    width = max(len(" ".join(map(str, r.step_max_scores))) for r in rows)
    print(f"{'layout':>10} {'P':>3} {'N':>5}  {'max over ranks, per step':<{width}}  {'path':>9} {'formula':>9} "
          f"{'/(N²/P)':>7} {'speed-up':>8}  ms per step (slowest rank)")
    for r in rows:
        steps = " ".join(map(str, r.step_max_scores))
        speedup = "n/a" if r.speedup_over_contiguous is None else f"{r.speedup_over_contiguous:.2f}"
        unit = r.n * r.n / r.world_size
        ms = " ".join(f"{s * 1e3:.2f}" for s in r.step_max_seconds)
        print(f"{r.layout:>10} {r.world_size:>3} {r.n:>5}  {steps:<{width}}  {r.critical_path:>9} {r.formula:>9} "
              f"{r.critical_path / unit:>7.3f} {speedup:>8}  {ms}")


def plot_distributed(traffic: Sequence[TrafficRow], memory: Sequence[MemoryRow], timing: Sequence[TimeRow],
                     path: str | os.PathLike, *, title: str) -> None:
    """Save a PNG: forward bytes per rank against ``P`` (both sweeps, formulas as lines), peak memory per
    rank against ``N`` (one line per method and ``P``), and time ratios against ``P``.

    Args:
        traffic, memory, timing: the rows of the three measurements.
        path: the PNG file to write.
        title: the figure's title.

    Raises:
        TypeError, ValueError: rows that are not non-empty sequences of their row type, ``path`` not a
            path, ``title`` not a str.
        ImportError: matplotlib is not installed.
    """
    where = "plot_distributed"
    traffic = check_rows(where, traffic, (TrafficRow,))
    memory = check_rows(where, memory, (MemoryRow,))
    timing = check_rows(where, timing, (TimeRow,))
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
