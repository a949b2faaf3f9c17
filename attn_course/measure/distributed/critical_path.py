"""What a balanced layout buys a synchronous ring: its critical path, measured step by step.

At every step of ring attention each rank computes on the K/V block it holds and then waits for
the next one, so the ring moves at the pace of its slowest rank at that step. Counted in score
elements actually computed (a diagonal tile is computed whole, then masked), per (batch, head),
the critical path is

    critical path = Σ over steps s of (max over ranks r of the scores rank r computes at step s)

and, for causal attention over ``N`` tokens on ``P`` ranks (:func:`critical_path_formula`):

- contiguous: ``P · (N/P)² = N²/P``. At step ``s`` the ranks ``r >= s`` compute a full
  ``(N/P)²`` block (step 0: the diagonal, computed whole), the others idle;
- zig-zag: ``(2P + 1) · (N/2P)²``. Step 0: three ``(N/2P)²`` tiles on every rank, every later
  step two; so zig-zag is ``4P / (2P + 1)`` times faster than contiguous: 16/9 ≈ 1.78 at
  ``P = 4``, not the 4 that the ratio of the slowest to the fastest rank's pairs (4.00 against
  1.00) might suggest;
- striped: ``P · (N/P)²``, the same as contiguous in this implementation: every step is one
  ``(N/P)²`` masked tile, computed whole. About half of each tile is masked out, so a kernel that
  skipped the masked-out sub-tiles would do about half; this code does not.

:func:`measure_critical_path` runs the forward on real processes and reads each rank's scores per
step from :func:`~attn_course.distributed.ring.count_ring_work`; :func:`print_critical_path`
(in :mod:`~attn_course.measure.distributed.report`) prints the rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.distributed as dist

from attn_course import _validate
from attn_course.distributed.launch import launch
from attn_course.distributed.layout import LAYOUTS, chunk_count, shard
from attn_course.measure.distributed.formulas import positive_ints

__all__ = ["CriticalPathRow", "critical_path_formula", "critical_path_rank", "measure_critical_path"]


@dataclasses.dataclass(frozen=True)
class CriticalPathRow:
    """One layout's causal ring-attention forward on ``P`` ranks, step by step (:func:`measure_critical_path`).

    Attributes:
        layout: one of :data:`~attn_course.distributed.layout.LAYOUTS`.
        world_size, n: ``P`` and ``N``.
        scores_by_rank: ``[P ranks][P steps]``, the score elements each rank computed at each step,
            per (batch, head), a masked tile counted whole.
        step_max_scores: ``[P steps]``, the largest over the ranks at each step: the one the ring waits for.
        critical_path: their sum.
        formula: :func:`critical_path_formula` for this layout, ``N`` and ``P``.
        speedup_over_contiguous: the contiguous row's ``critical_path`` (same ``P`` and ``N``) over this
            one's; None when contiguous was not measured.
        step_max_seconds: ``[P steps]``, each rank's compute time at that step (best of the repeats),
            the largest over the ranks. Wall clock: on a machine with fewer cores than ``P`` it is noise.
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


def _divisible(where: str, n: int, world_size: int, layout: str) -> None:
    chunks = chunk_count(world_size, layout)
    if n % chunks:
        raise ValueError(f"{where}: N={n} must be divisible by {chunks} for the {layout} layout over P={world_size} "
                         f"ranks")


def critical_path_formula(n: int, world_size: int, layout: str) -> int:
    """The critical path of a causal ring-attention forward, in score elements per (batch, head).

    The sum over the ``P`` steps of the most scores any rank computes at that step, diagonal
    tiles counted whole: ``P · (N/P)²`` (contiguous, striped) or ``(2P + 1) · (N/2P)²`` (zig-zag).

    Args:
        n: ``N``, divisible by ``P`` (by ``2P`` for zig-zag).
        world_size: ``P >= 1``.
        layout: one of :data:`~attn_course.distributed.layout.LAYOUTS`.

    Returns:
        The critical path's score elements.

    Raises:
        TypeError, ValueError: sizes that are not ints ``>= 1`` or do not divide, an unknown layout.

    Example:
        >>> [critical_path_formula(48, 4, layout) for layout in ("contiguous", "zigzag", "striped")]
        [576, 324, 576]
    """
    where = "critical_path_formula"
    n = _validate.integer(where, "n", n, minimum=1)
    world_size = _validate.integer(where, "world_size", world_size, minimum=1)
    if layout not in LAYOUTS:
        raise ValueError(f"{where}: layout must be one of {LAYOUTS}, got {layout!r}")
    _divisible(where, n, world_size, layout)
    if layout == "zigzag":
        return (2 * world_size + 1) * (n // (2 * world_size)) ** 2         # 3 tiles at step 0, then 2 a step
    return world_size * (n // world_size) ** 2                               # one (N/P)² tile a step


def critical_path_rank(rank: int, world_size: int, layouts: tuple[str, ...], n: int, batch: int, heads: int,
                       head_dim: int, repeats: int) -> list[dict]:
    """What every rank runs under :func:`~attn_course.distributed.launch.launch`: for each layout, one untimed
    causal forward, then ``repeats`` counted ones, each after a barrier (the ranks start together).

    Args:
        rank, world_size: given by the launcher.
        layouts, n, batch, heads, head_dim, repeats: as :func:`measure_critical_path` (checked there).

    Returns:
        One dict per layout: ``"scores"`` (this rank's score elements per step) and ``"seconds"`` (per
        step, the best of the repeats).
    """
    from attn_course.distributed.ring import count_ring_work, ring_attention  # the ring is its own chapter step

    generator = torch.Generator().manual_seed(n)
    full = [torch.randn(batch, heads, n, head_dim, generator=generator) for _ in range(3)]      # q, k, v [B, H, N, d]
    found = []
    for layout in layouts:
        q, k, v = (shard(t, rank, world_size, layout) for t in full)                            # [B, H, N/P, d]
        ring_attention(q, k, v, causal=True, layout=layout)       # a warm-up: first calls pay for lazy imports
        works = []
        for _ in range(repeats):
            dist.barrier()
            with count_ring_work() as work:
                ring_attention(q, k, v, causal=True, layout=layout)
            works.append(work)
        seconds = [min(step) for step in zip(*(work.forward_seconds_by_step for work in works))]
        found.append(dict(scores=works[0].forward_scores_by_step, seconds=seconds))
    return found


def _slowest(per_rank: Sequence[Sequence[float]]) -> list:
    """``[P ranks][P steps]`` to ``[P steps]``: at each step, the rank the ring waits for."""
    return [max(step) for step in zip(*per_rank)]


def _rows(layouts: list[str], n: int, measured: dict[int, list[list[dict]]]) -> list[CriticalPathRow]:
    rows = []
    for world_size, ranks in measured.items():                      # ranks[rank][layout index]
        paths = {}
        for index, layout in enumerate(layouts):
            scores = tuple(tuple(r[index]["scores"]) for r in ranks)
            slowest = tuple(_slowest(scores))
            paths[layout] = (scores, slowest, tuple(_slowest([r[index]["seconds"] for r in ranks])))
        contiguous = sum(paths["contiguous"][1]) if "contiguous" in paths else None
        for layout, (scores, slowest, seconds) in paths.items():
            rows.append(CriticalPathRow(
                layout=layout, world_size=world_size, n=n, scores_by_rank=scores, step_max_scores=slowest,
                critical_path=sum(slowest), formula=critical_path_formula(n, world_size, layout),
                speedup_over_contiguous=None if contiguous is None else contiguous / sum(slowest),
                step_max_seconds=seconds))
    return rows


def measure_critical_path(world_sizes: Sequence[int] = (2, 3, 4), *, n: int = 48, layouts: Sequence[str] = LAYOUTS,
                          batch: int = 1, heads: int = 1, head_dim: int = 8, repeats: int = 3,
                          timeout: float = 300.0) -> list[CriticalPathRow]:
    """The critical path of a causal ring-attention forward in each layout, measured on ``P`` processes.

    For every ``P`` one launch (gloo, one thread per process) runs the forward in every layout;
    each rank reports the score elements it computed at each step
    (:func:`~attn_course.distributed.ring.count_ring_work`). A row takes, per step, the largest
    over the ranks (the synchronous ring waits for it), sums them, and sets the formula
    (:func:`critical_path_formula`) and the speed-up over contiguous beside them. Wall time per
    step is recorded the same way; the counts, not the times, are what the formulas predict.

    Args:
        world_sizes: the ``P`` to run, e.g. ``(2, 3, 4)``.
        n: ``N``, divisible by ``2P`` for zig-zag (by ``P`` otherwise) for every ``P``.
        layouts: names from :data:`~attn_course.distributed.layout.LAYOUTS`, each once; include
            ``"contiguous"`` for the speed-ups.
        batch, heads, head_dim: ``B``, ``H``, ``d`` (the counts are per (batch, head); these set the
            compute the times measure).
        repeats: counted forwards per layout; each rank's best time per step counts.
        timeout: seconds for each launch.

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
    world_sizes = positive_ints(where, "world_sizes", world_sizes)
    n = _validate.integer(where, "n", n, minimum=1)
    layouts = _validate.labels(where, "layouts", layouts)
    if not layouts:
        raise ValueError(f"{where}: layouts must not be empty")
    for index, layout in enumerate(layouts):
        if layout not in LAYOUTS:
            raise ValueError(f"{where}: layouts[{index}] must be one of {LAYOUTS}, got {layout!r}")
    if len(set(layouts)) != len(layouts):
        raise ValueError(f"{where}: layouts must name each layout once, got {layouts}")
    batch, heads, head_dim, repeats = (_validate.integer(where, name, value, minimum=1) for name, value in (
        ("batch", batch), ("heads", heads), ("head_dim", head_dim), ("repeats", repeats)))
    timeout = _validate.positive_finite(where, "timeout", timeout)
    for world_size in world_sizes:
        for layout in layouts:
            _divisible(where, n, world_size, layout)
    measured = {p: launch(critical_path_rank, p, tuple(layouts), n, batch, heads, head_dim, repeats,
                          timeout=timeout, threads=1) for p in dict.fromkeys(world_sizes)}
    return _rows(layouts, n, measured)
