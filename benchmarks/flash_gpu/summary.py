"""Ours against the fastest SDPA backend, per configuration and mode, and whether the targets were met."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from attn_course import _validate
from attn_course.measure.rows import check_rows
from benchmarks.flash_gpu.machine import MachineInfo
from benchmarks.flash_gpu.rows import DecodeRow, GpuRow, SummaryRow
from benchmarks.flash_gpu.sizes import FLEX, LONG_FROM, TARGETS

__all__ = ["print_summary", "speedup_summary"]


def speedup_summary(rows: Sequence[GpuRow] = (), decode: Sequence[DecodeRow] = (), *,
                    long_from: int = LONG_FROM) -> list[SummaryRow]:
    """Ours against the fastest SDPA backend, per configuration and mode.

    Args:
        rows: rows of :func:`gpu_rows` (may be empty).
        decode: rows of :func:`decode_rows` (may be empty).
        long_from: the N from which the targets apply (forward ≥ 1.0, backward ≥ 0.8).

    Returns:
        One :class:`SummaryRow` per configuration and mode found, in the rows' order (attention
        first); configurations with no measured row at all are left out.

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
    summary = []
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(("attention", r.dtype, r.head_dim, r.heads, r.kv_heads, r.causal, r.n, r.n, r.mode),
                          []).append(r)
    for r in decode:
        groups.setdefault(("decode", r.dtype, r.head_dim, r.heads, r.kv_heads, False, r.n_q, r.n_k, "forward"),
                          []).append(r)
    for key, members in groups.items():
        measured = [r for r in members if r.status == "ok"]
        if not measured:
            continue
        kind, dtype, head_dim, heads, kv_heads, causal, n_q, n_k, mode = key
        ours = next((r for r in measured if r.method.startswith("ours")), None)
        sdpa = [r for r in measured if r.method.startswith("sdpa")]
        best = min(sdpa, key=lambda r: r.milliseconds) if sdpa else None
        ratio = best.milliseconds / ours.milliseconds if ours and best else None
        target = TARGETS.get(mode) if kind == "attention" and n_k >= long_from else None
        flex = next((r for r in measured if r.method == FLEX), None)
        flex_ratio = flex.milliseconds / ours.milliseconds if ours and flex else None
        note = "" if ratio is not None else ("ours did not run" if not ours else "no SDPA backend ran")
        summary.append(SummaryRow(kind=kind, dtype=dtype, head_dim=head_dim, heads=heads, kv_heads=kv_heads,
                                  causal=causal, n_q=n_q, n_k=n_k,
                                  mode=mode, ours_ms=ours.milliseconds if ours else None,
                                  best_sdpa=best.method if best else "",
                                  best_sdpa_ms=best.milliseconds if best else None,
                                  ratio=ratio, target=target,
                                  meets_target=None if target is None or ratio is None else ratio >= target,
                                  flex_ms=flex.milliseconds if flex else None, flex_ratio=flex_ratio, note=note,
                                  **{f.name: getattr(members[0], f.name) for f in
                                                dataclasses.fields(MachineInfo)}))
    return summary


def print_summary(summary: Sequence[SummaryRow]) -> None:
    """Print :func:`speedup_summary`'s rows as a table, then how many targets were met.

    Args:
        summary: a non-empty sequence of :class:`SummaryRow`.

    Raises:
        TypeError: not a sequence of :class:`SummaryRow`.
        ValueError: no rows.
    """
    summary = check_rows("print_summary", summary, (SummaryRow,))

    def number(value, form):   # "-" as wide as the number would be, so the columns stay aligned
        return format("-", ">" + form.split(".")[0]) if value is None else format(value, form)

    print(f"{'kind':>9} {'dtype':>8} {'d':>4} {'H/H_kv':>6} {'causal':>6} {'N_q':>5} {'N_k':>6} {'mode':>16} "
          f"{'ours ms':>9} {'best SDPA':>14} {'SDPA ms':>9} {'ours/SDPA':>9} {'flex ms':>9} {'ours/flex':>9} "
          f"{'target':>6}")
    for r in summary:
        verdict = "" if r.meets_target is None else (" ok" if r.meets_target else " MISSED")
        print(f"{r.kind:>9} {r.dtype:>8} {r.head_dim:>4} {f'{r.heads}/{r.kv_heads}':>6} {str(r.causal):>6} "
              f"{r.n_q:>5} {r.n_k:>6} {r.mode:>16} {number(r.ours_ms, '9.3f')} {r.best_sdpa or '-':>14} "
              f"{number(r.best_sdpa_ms, '9.3f')} {number(r.ratio, '8.2f')}x {number(r.flex_ms, '9.3f')} "
              f"{number(r.flex_ratio, '8.2f')}x {number(r.target, '6.1f')}{verdict}")
    for mode, target in TARGETS.items():
        judged = [r for r in summary if r.mode == mode and r.meets_target is not None]
        if judged:
            met = sum(r.meets_target for r in judged)
            worst = min(judged, key=lambda r: r.ratio)
            print(f"{mode}: ours >= {target}x SDPA's best in {met} of {len(judged)} configurations with a target "
                  f"(worst {worst.ratio:.2f}x: {worst.dtype} d={worst.head_dim} causal={worst.causal} N={worst.n_k})")
