"""What a run reports: ours against FlashAttention-2, cuDNN and the fastest SDPA backend per configuration
and mode (rows, a table, which targets were missed), and the rows as PNGs."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

from attn_course import _validate
from attn_course.measure.rows import check_rows
from benchmarks.flash_gpu.plan import FLEX, LONG_FROM, TARGET_REFERENCES, TARGETS
from benchmarks.flash_gpu.rows import DecodeRow, GpuRow, MachineInfo, SummaryRow

__all__ = ["plot_gpu_rows", "speedup_summary", "summary_table", "target_verdicts"]


def speedup_summary(rows: Sequence[GpuRow] = (), decode: Sequence[DecodeRow] = (), *,
                    long_from: int = LONG_FROM) -> list[SummaryRow]:
    """Ours against FlashAttention-2 and cuDNN (SDPA's flash and cuDNN backends), the fastest SDPA backend
    and FlexAttention, per configuration and mode; which target each row misses.

    Args:
        rows, decode: rows of :func:`gpu_rows` and of :func:`decode_rows` (either may be empty).
        long_from: the N from which the targets apply (forward ≥ 1.0, backward ≥ 0.8, against each of
            :data:`~benchmarks.flash_gpu.plan.TARGET_REFERENCES` apart).

    Returns:
        One :class:`SummaryRow` per configuration and mode with a measured row, in the rows' order.

    Raises:
        TypeError: rows of the wrong type, or ``long_from`` not an int.
        ValueError: ``long_from`` below 1.
    """
    where = "speedup_summary"
    rows = _validate.sequence(where, "rows", rows, of="GpuRow")
    rows = check_rows(where, rows, (GpuRow,)) if rows else []
    decode = _validate.sequence(where, "decode", decode, of="DecodeRow")
    decode = check_rows(where, decode, (DecodeRow,)) if decode else []
    long_from = _validate.integer(where, "long_from", long_from, minimum=1)
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(("attention", r.dtype, r.head_dim, r.heads, r.kv_heads, r.causal, r.n, r.n, r.mode),
                          []).append(r)
    for r in decode:
        groups.setdefault(("decode", r.dtype, r.head_dim, r.heads, r.kv_heads, False, r.n_q, r.n_k, "forward"),
                          []).append(r)
    summary = []
    for key, members in groups.items():
        measured = [r for r in members if r.status == "ok"]
        if not measured:
            continue
        config = dict(zip(("kind", "dtype", "head_dim", "heads", "kv_heads", "causal", "n_q", "n_k", "mode"), key))
        ours = next((r.milliseconds for r in measured if r.method.startswith("ours")), None)
        best = min((r for r in measured if r.method.startswith("sdpa")), key=lambda r: r.milliseconds, default=None)
        times = {name: next((r.milliseconds for r in measured if r.method == method), None)
                 for name, method in {**TARGET_REFERENCES, "best": best.method if best else None, "flex": FLEX}.items()}
        ratios = {name: ms / ours if ours is not None and ms is not None else None for name, ms in times.items()}
        target = TARGETS.get(config["mode"]) if config["kind"] == "attention" and config["n_k"] >= long_from else None
        missed = [name for name in TARGET_REFERENCES
                  if target is not None and ratios[name] is not None and ratios[name] < target]
        absent = [f"{name} ({method}) did not run" for name, method in TARGET_REFERENCES.items() if times[name] is None]
        note = "ours did not run" if ours is None else "; ".join(absent + ([] if best else ["no SDPA backend ran"]))
        summary.append(SummaryRow(
            **config, ours_ms=ours, fa2_ms=times["FA2"], fa2_ratio=ratios["FA2"], cudnn_ms=times["cuDNN"],
            cudnn_ratio=ratios["cuDNN"], best_sdpa=best.method if best else "",
            best_sdpa_ms=times["best"], ratio=ratios["best"], target=target, misses="+".join(missed),
            flex_ms=times["flex"], flex_ratio=ratios["flex"], note=note,
            **{f.name: getattr(members[0], f.name) for f in dataclasses.fields(MachineInfo)}))
    return summary


def summary_table(summary: Sequence[SummaryRow]):
    """:func:`speedup_summary`'s rows as a pandas ``DataFrame`` (:func:`~attn_course.teaching.tables.table`);
    its last column, where a target applies, ``ok`` or the references it misses (``MISSES cuDNN``).

    Raises:
        TypeError: not a sequence of :class:`SummaryRow`.
        ValueError: no rows.
        ImportError: pandas is not installed (a bare GPU image may lack it; the CSV holds the numbers).
    """
    from attn_course.teaching.tables import table  # here: pandas, which a bare GPU image may lack

    summary = check_rows("summary_table", summary, (SummaryRow,))
    shown = [{"kind": r.kind, "dtype": r.dtype, "d": r.head_dim, "H/H_kv": f"{r.heads}/{r.kv_heads}",
              "causal": r.causal, "N_q": r.n_q, "N_k": r.n_k, "mode": r.mode, "ours ms": r.ours_ms,
              "FA2 ms": r.fa2_ms, "ours/FA2": r.fa2_ratio, "cuDNN ms": r.cudnn_ms, "ours/cuDNN": r.cudnn_ratio,
              "best SDPA": r.best_sdpa or "-", "ours/best": r.ratio, "ours/flex": r.flex_ratio, "target": r.target,
              "met": _met(r)} for r in summary]
    return table(shown, digits=3)


def _met(r: SummaryRow) -> str:
    """The table's last column: ``""`` without a target or a reference, ``ok``, or ``MISSES`` and which."""
    if r.target is None or (r.fa2_ratio is None and r.cudnn_ratio is None):
        return ""
    return f"MISSES {r.misses}" if r.misses else "ok"


def target_verdicts(summary: Sequence[SummaryRow]) -> list[str]:
    """One line per mode with a target and per reference (FlashAttention-2, cuDNN): in how many
    configurations ours met it, and the worst ratio; then, if any was missed, that a missed target is
    reported, not a failure of the run."""
    lines = []
    for mode, target in TARGETS.items():
        for name, method in TARGET_REFERENCES.items():
            ratios = [(getattr(r, f"{name.lower()}_ratio"), r) for r in summary if r.mode == mode
                      and r.target is not None and getattr(r, f"{name.lower()}_ratio") is not None]
            if ratios:
                worst, row = min(ratios, key=lambda pair: pair[0])
                met = sum(ratio >= target for ratio, _ in ratios)
                lines.append(f"{mode}: ours >= {target}x {name} ({method}) in {met} of {len(ratios)} configurations "
                             f"with a target (worst {worst:.2f}x: {row.dtype} d={row.head_dim} causal={row.causal} "
                             f"N={row.n_k})")
    if any(r.misses for r in summary):
        lines.append("targets missed are reported, not failures: the run's exit status does not depend on them")
    return lines


def plot_gpu_rows(rows: Sequence[GpuRow] | Sequence[DecodeRow], path: str | os.PathLike, *, title: str) -> None:
    """Save a PNG of :func:`gpu_rows` (TFLOP/s against N, a panel per dtype, d, mask, mode and grouped-query
    layout) or of :func:`decode_rows` (K/V GB/s against N_k, a panel per dtype and N_q); skipped rows left out.

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
    _validate.instance(where, "title", title, str)
    import matplotlib  # here, not at the top: a bare GPU image may lack it, and the CSV suffices

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    decode = isinstance(rows[0], DecodeRow)
    if decode:
        def panel_of(r):   # its title
            return f"{r.dtype} N_q={r.n_q}"
        x_of, y_of, ylabel, xlabel = (lambda r: r.n_k), (lambda r: r.kv_gbps), "K/V GB/s", "N_k (KV cache length)"
    else:
        def panel_of(r):   # grouped-query rows get panels of their own
            grouped = f" H={r.heads}/H_kv={r.kv_heads}" if r.kv_heads < r.heads else ""
            return f"{r.dtype} d={r.head_dim} {'causal' if r.causal else 'full'} {r.mode}{grouped}"
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
        axis.set_xscale("log", base=2)
        ticks = sorted({x_of(r) for r in rows})
        axis.set_xticks(ticks, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks], fontsize=7)
        axis.xaxis.set_minor_formatter(NullFormatter())
        axis.set(xlabel=xlabel, ylabel=ylabel, title=panel)
        axis.title.set_fontsize(9)
        if chosen:
            axis.legend(fontsize=6)
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
