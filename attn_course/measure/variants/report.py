"""The variants' rows as a table and as a plot: time and peak memory against N."""

from __future__ import annotations

import os
from collections.abc import Sequence

from attn_course.measure.rows import check_rows, pyplot_for
from attn_course.measure.variants.names import VariantRow

__all__ = ["plot_variants", "print_variants"]


def print_variants(rows: Sequence[VariantRow]) -> None:
    """Print the rows of :func:`measure_variants` as a table: milliseconds and MiB.

    Args:
        rows: a non-empty sequence of :class:`VariantRow`.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`VariantRow`.
        ValueError: no rows.
    """
    rows = check_rows("print_variants", rows, (VariantRow,))
    print(f"{'variant':>22} {'mode':>7} {'N':>6} {'ms':>9} {'peak MiB':>9} {'state KiB':>10} {'max diff':>9}")
    for r in rows:
        peak = "n/a" if r.peak_bytes is None else f"{r.peak_bytes / 2**20:.2f}"
        print(f"{r.variant:>22} {r.mode:>7} {r.n:>6} {r.seconds * 1e3:>9.3f} {peak:>9} "
              f"{r.state_bytes / 2**10:>10.1f} {r.max_difference:>9.1e}")



def plot_variants(rows: Sequence[VariantRow], path: str | os.PathLike, *, title: str) -> None:
    """Save a PNG of :func:`measure_variants`'s prefill rows: time and peak memory against N, log-log.

    Args:
        rows: a non-empty sequence of :class:`VariantRow` (decode rows are left out of the plot).
        path: the PNG file to write.
        title: the figure's title, e.g. :func:`~attn_course.measure.timing.machine_description`.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`VariantRow`, ``path`` not a path, ``title`` not a str.
        ValueError: no rows.
        ImportError: matplotlib is not installed.
    """
    where = "plot_variants"
    rows = check_rows(where, rows, (VariantRow,))
    path, plt = pyplot_for(where, path, title)

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    prefill = [r for r in rows if r.mode == "prefill"]
    lengths = sorted({r.n for r in prefill})
    for index, variant in enumerate(dict.fromkeys(r.variant for r in prefill)):
        style = dict(marker="o", label=variant, color=f"C{index}")     # one colour per variant in both panels
        chosen = [r for r in prefill if r.variant == variant]
        axes[0].plot([r.n for r in chosen], [r.seconds for r in chosen], **style)
        measured = [r for r in chosen if r.peak_bytes]
        if measured:
            axes[1].plot([r.n for r in measured], [r.peak_bytes / 2**20 for r in measured], **style)
    for axis in axes:
        axis.set_xscale("log", base=2)
        axis.set_xticks(lengths, [str(n) for n in lengths])
        axis.minorticks_off()
    axes[0].set(yscale="log", xlabel="N", ylabel="seconds (best)", title="time (causal)")
    axes[1].set(yscale="log", xlabel="N", ylabel="peak MiB", title="peak memory (flex eager: not measurable)")
    axes[0].legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
