"""What a balanced layout buys a synchronous ring: its critical path, measured step by step on ``P`` processes
and compared with :func:`~attn_course.distributed.schedule.critical_path_formula`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from attn_course import _validate
from attn_course.distributed.layout import LAYOUTS, check_divisible, check_layout
from attn_course.distributed.schedule import LAYOUT, critical_path_formula
from attn_course.measure.distributed.ranks import Task, collect

__all__ = ["CriticalPathRow", "measure_critical_path"]


@dataclasses.dataclass(frozen=True)
class CriticalPathRow:
    """One layout's causal ring-attention forward on ``P`` ranks, step by step (:func:`measure_critical_path`).

    Attributes:
        layout, world_size, n: one of :data:`~attn_course.distributed.layout.LAYOUTS`, ``P`` and ``N``.
        scores_by_rank: ``[P ranks][P steps]``, the score elements each rank computed at each step,
            per (batch, head), a masked tile counted whole.
        step_max_scores: ``[P steps]``, the largest over the ranks at each step: the one the ring waits for.
        critical_path: their sum.
        formula: ``critical_path_formula`` for this layout, ``N`` and ``P``.
        speedup_over_contiguous: the contiguous row's ``critical_path`` (same ``P`` and ``N``) over this
            one's; None when contiguous was not measured.
        step_max_seconds: ``[P steps]``, the largest over the ranks of each rank's best compute time at that
            step (wall clock: noise on a machine with fewer cores than ``P``).
    """

    layout: str
    world_size: int
    n: int
    scores_by_rank: tuple[tuple[int, ...], ...]
    step_max_scores: tuple[int, ...]
    critical_path: int
    formula: int
    speedup_over_contiguous: float | None
    step_max_seconds: tuple[float, ...]


def _slowest(per_rank: Sequence[Sequence[float]]) -> list:
    """``[P ranks][P steps]`` to ``[P steps]``: at each step, the rank the ring waits for."""
    return [max(step) for step in zip(*per_rank)]


def _rows(tasks: list[Task], results: list[list[dict]]) -> list[CriticalPathRow]:
    rows = []
    for task, ranks in zip(tasks, results):                         # ranks[rank]: scores and seconds per step
        layout, scores = LAYOUT[task.method], tuple(tuple(r["scores"]) for r in ranks)
        slowest = tuple(_slowest(scores))
        rows.append(CriticalPathRow(
            layout=layout, world_size=task.world_size, n=task.n, scores_by_rank=scores, step_max_scores=slowest,
            critical_path=sum(slowest), formula=critical_path_formula(task.n, task.world_size, layout),
            speedup_over_contiguous=None, step_max_seconds=tuple(_slowest([r["seconds"] for r in ranks]))))
    contiguous = {row.world_size: row.critical_path for row in rows if row.layout == "contiguous"}
    return [dataclasses.replace(row, speedup_over_contiguous=contiguous[row.world_size] / row.critical_path)
            if row.world_size in contiguous else row for row in rows]


def measure_critical_path(world_sizes: Sequence[int] = (2, 3, 4), *, n: int = 48, layouts: Sequence[str] = LAYOUTS,
                          batch: int = 1, heads: int = 1, head_dim: int = 8, repeats: int = 3,
                          timeout: float = 300.0) -> list[CriticalPathRow]:
    """The critical path of a causal ring-attention forward in each layout, measured on ``P`` processes.

    For every ``P`` one launch (gloo, one thread per process) runs the forward in every layout, each
    rank counting its score elements per step; a row takes each step's largest over the ranks, sums
    them, and sets the formula and the speed-up over contiguous beside them. Wall time per step is
    taken the same way; the counts, not the times, are what the formulas predict.

    Args:
        world_sizes: the ``P`` to run, e.g. ``(2, 3, 4)``.
        n: ``N``, divisible by ``2P`` for zig-zag (by ``P`` otherwise) for every ``P``.
        layouts: names from :data:`~attn_course.distributed.layout.LAYOUTS`, each once; include
            ``"contiguous"`` for the speed-ups.
        batch, heads, head_dim: ``B``, ``H``, ``d`` (they set the compute the times measure).
        repeats, timeout: counted forwards per layout (the best time per step counts); seconds per launch.

    Returns:
        One :class:`CriticalPathRow` per (``P``, layout), in that order.

    Raises:
        TypeError, ValueError: sizes that are not positive ints, an unknown or repeated layout, no
            layouts, an ``N`` that does not divide (named), a timeout that is not a positive number.

    Example (it starts processes, so it is not run as a doctest; tests/measure run it)::

            rows = measure_critical_path((4,), n=48)
            [(r.layout, r.step_max_scores) for r in rows]
            # [('contiguous', (144, 144, 144, 144)), ('zigzag', (108, 72, 72, 72)), ('striped', (144, 144, 144, 144))]
    """
    where = "measure_critical_path"
    world_sizes = _validate.integer_sequence(where, "world_sizes", world_sizes, minimum=1, nonempty=True)
    n = _validate.integer(where, "n", n, minimum=1)
    layouts = [check_layout(where, layout, f"layouts[{index}]")
               for index, layout in enumerate(_validate.labels(where, "layouts", layouts))]
    if not layouts or len(set(layouts)) != len(layouts):
        raise ValueError(f"{where}: layouts must name each layout once, and at least one, got {layouts}")
    batch, heads, head_dim, repeats = _validate.integers(where, minimum=1, batch=batch, heads=heads,
                                                          head_dim=head_dim, repeats=repeats)
    timeout = _validate.positive_finite(where, "timeout", timeout)
    for world_size, layout in ((p, layout) for p in world_sizes for layout in layouts):
        check_divisible(where, n, world_size, layout)
    method = {layout: name for name, layout in LAYOUT.items() if name != "ulysses"}    # "zigzag": "ring zigzag"
    tasks = [Task("work", method[layout], p, n, batch, heads, head_dim, True, repeats=repeats)
             for p in dict.fromkeys(world_sizes) for layout in layouts]
    return _rows(tasks, collect(tasks, timeout))
