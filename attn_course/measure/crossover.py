"""Where causal linear attention overtakes causal softmax attention, in time and in memory (chapter 09)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from attn_course.measure.rows import check_rows
from attn_course.measure.variants import VariantRow, check_name

__all__ = ["Crossover", "crossover_from_rows", "first_below_one"]


@dataclasses.dataclass(frozen=True)
class Crossover:
    """Where causal linear attention overtakes causal softmax attention (:func:`crossover_from_rows`).

    Attributes:
        softmax, linear: the two variants compared; lengths: the grid of N measured, ascending.
        time_n: the smallest grid N from which linear attention is faster at every larger grid N; None if it
            is slower at the largest.
        time_n_interpolated: where the time curves cross, ``log(t_linear / t_softmax)`` interpolated linearly
            in ``log N`` between ``time_n`` and the grid N before it; None when ``time_n`` is None or the
            grid's first N.
        memory_n, memory_n_interpolated: the same for peak memory (exact bytes, so not noisy).
        seconds_ratio, memory_ratio: ``t_linear / t_softmax`` and ``peak_linear / peak_softmax`` at each N.
    """

    softmax: str
    linear: str
    lengths: tuple[int, ...]
    time_n: int | None
    time_n_interpolated: float | None
    memory_n: int | None
    memory_n_interpolated: float | None
    seconds_ratio: tuple[float, ...]
    memory_ratio: tuple[float, ...]

    def describe(self) -> str:
        """One sentence per quantity, e.g. ``"time: linear chunked faster than softmax sdpa from N = 1024 ..."``."""
        lines = []
        for what, first, between, ratios in (("time", self.time_n, self.time_n_interpolated, self.seconds_ratio),
                                             ("memory", self.memory_n, self.memory_n_interpolated,
                                              self.memory_ratio)):
            verb = "faster" if what == "time" else "smaller"
            if first is None:
                lines.append(f"{what}: {self.linear} is not {verb} than {self.softmax} for N <= "
                             f"{self.lengths[-1]} (ratio at the largest N: {ratios[-1]:.2f})")
            elif between is None:
                lines.append(f"{what}: {self.linear} is {verb} than {self.softmax} already at the "
                             f"smallest N measured, {first} (ratio {ratios[0]:.2f})")
            else:
                lines.append(f"{what}: {self.linear} is {verb} than {self.softmax} from N = {first} "
                             f"(curves cross near N ≈ {between:.0f})")
        return "\n".join(lines)


def first_below_one(lengths: list[int], values: list[float]) -> tuple[int | None, float | None]:
    """``(N, crossing)``: the smallest grid N from which every ratio is below 1 and where ``log ratio`` crosses 0,
    linear in ``log N``; ``(None, None)`` if the last ratio is not below 1, ``(lengths[0], None)`` if every is.
    Chapter 09's crossover (linear against softmax attention) and chapter 13's (sparse against dense) both read it.

    Raises:
        ValueError: ``lengths`` and ``values`` empty or of different lengths.
    """
    if not lengths or len(lengths) != len(values):
        raise ValueError(f"first_below_one: lengths and values must be equally long and not empty, got "
                         f"{len(lengths)} lengths and {len(values)} values")
    index = len(values)
    while index > 0 and values[index - 1] < 1:
        index -= 1
    if index == len(values):
        return None, None
    if index == 0:
        return lengths[0], None
    (n0, r0), (n1, r1) = (lengths[index - 1], values[index - 1]), (lengths[index], values[index])
    x0, x1, y0, y1 = math.log(n0), math.log(n1), math.log(r0), math.log(r1)
    return lengths[index], math.exp(x0 + (x1 - x0) * y0 / (y0 - y1))


def crossover_from_rows(rows: Sequence[VariantRow], *, softmax: str = "softmax sdpa",
                        linear: str = "linear chunked") -> Crossover:
    """The :class:`Crossover` of ``linear`` against ``softmax`` in rows already measured.

    Args:
        rows: from :func:`~attn_course.measure.variants.measure_variants`, both variants at two or more common N.
        softmax: ``"softmax sdpa"`` or ``"softmax self_attention"``.
        linear: ``"linear chunked"`` or ``"linear recurrent"``.

    Returns:
        A :class:`Crossover` over the N where both were measured, ascending.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`VariantRow`.
        ValueError: an unknown variant name, or fewer than two N with both variants.

    Example:
        >>> rows = [VariantRow(name, "prefill", n, seconds, peak, 0, 0.0) for name, n, seconds, peak in (
        ...     ("softmax sdpa", 100, 1.0, 10), ("linear chunked", 100, 2.0, 40),
        ...     ("softmax sdpa", 400, 4.0, 40), ("linear chunked", 400, 2.0, 160))]
        >>> crossover = crossover_from_rows(rows)
        >>> crossover.time_n, round(crossover.time_n_interpolated), crossover.memory_n
        (400, 200, None)
    """
    where = "crossover_from_rows"
    rows = check_rows(where, rows, (VariantRow,))
    softmax = check_name(where, "softmax", softmax, ("softmax sdpa", "softmax self_attention"))
    linear = check_name(where, "linear", linear, ("linear chunked", "linear recurrent"))
    found = {(r.variant, r.n): r for r in rows if r.mode == "prefill"}
    lengths = sorted(n for (name, n) in found if name == softmax and (linear, n) in found)
    if len(lengths) < 2:
        raise ValueError(f"{where}: rows must hold {softmax!r} and {linear!r} at two or more common N, "
                         f"got {lengths}")
    seconds = [found[linear, n].seconds / found[softmax, n].seconds for n in lengths]
    memory = [found[linear, n].peak_bytes / found[softmax, n].peak_bytes for n in lengths]
    time_n, time_between = first_below_one(lengths, seconds)
    memory_n, memory_between = first_below_one(lengths, memory)
    return Crossover(softmax=softmax, linear=linear, lengths=tuple(lengths), time_n=time_n,
                     time_n_interpolated=time_between, memory_n=memory_n, memory_n_interpolated=memory_between,
                     seconds_ratio=tuple(seconds), memory_ratio=tuple(memory))
