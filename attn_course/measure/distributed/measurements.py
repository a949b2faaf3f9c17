"""Ring attention against Ulysses on ``P`` processes: bytes sent per rank against
:func:`~attn_course.distributed.schedule.formula_bytes`, peak memory per rank, and time as ratios to ``P = 1``."""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Sequence

import torch

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.distributed.layout import check_divisible, unshard
from attn_course.distributed.schedule import LAYOUT, METHODS, formula_bytes
from attn_course.measure.distributed.ranks import Task, collect, inputs

__all__ = ["MemoryRow", "TimeRow", "TrafficRow", "measure_distributed", "measure_rank_memory", "measure_time",
           "measure_traffic"]


@dataclasses.dataclass(frozen=True)
class TrafficRow:
    """Bytes one rank sends for one attention layer (:func:`measure_traffic`).

    Attributes:
        method, scaling: one of ``METHODS``; the sweep, ``"N fixed"`` or ``"N ∝ P"`` (``N / P`` fixed).
        world_size, n, n_local, batch, heads, head_dim, kv_heads: ``P``, ``N``, ``N / P``, ``B``, ``H``, ``d``
            (float32), ``H_kv`` (``H`` without grouped-query attention).
        forward_bytes, forward_formula: counted at the communication helpers (``count_traffic``, the largest
            over the ranks), and ``formula_bytes``.
        wire_forward_bytes: the same bytes read off the tensors handed to ``torch.distributed``
            (``tap_process_group``, the largest), knowing no algorithm.
        total_bytes, total_formula, wire_total_bytes: the same for forward + backward.
        matches: on every rank the two counts and the formula agree exactly, forward and total, and no
            other collective moved data.
    """

    method: str
    scaling: str
    world_size: int
    n: int
    n_local: int
    batch: int
    heads: int
    head_dim: int
    kv_heads: int
    forward_bytes: int
    wire_forward_bytes: int
    forward_formula: int
    total_bytes: int
    wire_total_bytes: int
    total_formula: int
    matches: bool


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    """Peak bytes one rank allocates in a forward pass (:func:`measure_rank_memory`).

    Attributes:
        method, world_size, n, n_local: one of ``METHODS``, ``P``, ``N`` and ``N / P``.
        peak_bytes: the largest over the ranks, counted storage by storage (``peak_memory``: the rank's
            input shards are not counted, its output is). With ``P > 1`` a buffer that the communication
            backend's thread lets go can be freed just before or just after the peak, so the count can
            differ by one such buffer from run to run.
        shard_bytes: one ``[B, H, N/P, d]`` float32 shard, for scale.
        scores_bytes: the score matrix the method holds at once in this implementation:
            ``B·H·(N/P)²·4`` per block for ring, ``B·(H/P)·N²·4`` for Ulysses.
    """

    method: str
    world_size: int
    n: int
    n_local: int
    peak_bytes: int
    shard_bytes: int
    scores_bytes: int


@dataclasses.dataclass(frozen=True)
class TimeRow:
    """Best wall-clock time of a forward pass (:func:`measure_time`).

    Attributes:
        method, world_size, n: one of ``METHODS``, ``P`` and ``N``.
        seconds: best of the repeats, on the slowest rank (ranks start together after a barrier).
        median_seconds, min_seconds, max_seconds: over the repeats, each repeat's time being that of
            its slowest rank: the spread to read ``seconds`` against.
        ratio_to_one_rank: ``seconds`` over the same method's ``seconds`` at ``P = 1`` (None without one).
        oversubscribed: ``P`` processes on fewer CPU cores than ``P``.
        max_difference: largest ``|output - self_attention|`` over the gathered output.
    """

    method: str
    world_size: int
    n: int
    seconds: float
    median_seconds: float
    min_seconds: float
    max_seconds: float
    ratio_to_one_rank: float | None
    oversubscribed: bool
    max_difference: float


def _common(where, world_sizes, batch, heads, head_dim, methods, causal) -> tuple:
    """The arguments every measurement shares, checked: ``(world_sizes, batch, heads, head_dim, methods, causal)``."""
    world_sizes = _validate.integer_sequence(where, "world_sizes", world_sizes, minimum=1, nonempty=True)
    batch, heads, head_dim = _validate.integers(where, minimum=1, batch=batch, heads=heads, head_dim=head_dim)
    methods = _validate.labels(where, "methods", methods)
    if not methods:
        raise ValueError(f"{where}: methods must not be empty")
    for index, method in enumerate(methods):
        if method not in METHODS:
            raise ValueError(f"{where}: methods[{index}] must be one of {list(METHODS)}, got {method!r}")
    return world_sizes, batch, heads, head_dim, methods, _validate.boolean(where, "causal", causal)


def _check_shape(where: str, methods: list[str], world_size: int, n: int, heads: int,
                 kv_heads: int | None = None) -> None:
    """Refuse, by name, a (P, N, H, H_kv) a method cannot run: N not divisible by P (2P zig-zag), H_kv
    not a divisor of H, H_kv (H without grouped-query attention) not divisible by P (Ulysses)."""
    if kv_heads is not None and heads % kv_heads:
        raise ValueError(f"{where}: H={heads} must be divisible by H_kv={kv_heads} (grouped-query attention)")
    for method in methods:
        check_divisible(where, n, world_size, LAYOUT[method])
        if method == "ulysses" and (heads if kv_heads is None else kv_heads) % world_size:
            what = f"H={heads}" if kv_heads is None else f"H_kv={kv_heads}"
            raise ValueError(f"{where}: {what} must be divisible by P={world_size} for ulysses (whole heads per "
                             f"rank)")


def _traffic_tasks(where, world_sizes, n, n_per_rank, batch, heads, head_dim, methods, causal,
                   kv_heads=None) -> list[Task]:
    world_sizes, batch, heads, head_dim, methods, causal = _common(where, world_sizes, batch, heads, head_dim,
                                                                   methods, causal)
    n, n_per_rank = _validate.integers(where, minimum=1, n=n, n_per_rank=n_per_rank)
    if kv_heads is not None:
        kv_heads = _validate.integer(where, "kv_heads", kv_heads, minimum=1)
    tasks = []
    for scaling in ("N fixed", "N ∝ P"):
        for p in world_sizes:
            length = n if scaling == "N fixed" else n_per_rank * p
            _check_shape(where, methods, p, length, heads, kv_heads)
            tasks += [Task("traffic", m, p, length, batch, heads, head_dim, causal, scaling=scaling,
                           kv_heads=kv_heads) for m in methods]
    return tasks


def _traffic_rows(tasks: list[Task], results: list[list[dict]]) -> list[TrafficRow]:
    rows = []
    for task, ranks in zip(tasks, results):
        sizes = (task.batch, task.heads, task.n, task.head_dim, task.world_size)
        forward = formula_bytes(task.method, *sizes, kv_heads=task.kv_heads)
        total = formula_bytes(task.method, *sizes, backward=True, kv_heads=task.kv_heads)
        rows.append(TrafficRow(
            method=task.method, scaling=task.scaling, world_size=task.world_size, n=task.n,
            n_local=task.n // task.world_size, batch=task.batch, heads=task.heads, head_dim=task.head_dim,
            kv_heads=task.heads if task.kv_heads is None else task.kv_heads,
            forward_bytes=max(r["forward_bytes"] for r in ranks), forward_formula=forward,
            total_bytes=max(r["forward_bytes"] + r["backward_bytes"] for r in ranks), total_formula=total,
            matches=all((r["forward_bytes"], r["backward_bytes"]) == (r["forward_wire_bytes"], r["backward_wire_bytes"])
                        == (forward, total - forward) and not r["other_collectives"] for r in ranks),
            wire_forward_bytes=max(r["forward_wire_bytes"] for r in ranks),
            wire_total_bytes=max(r["forward_wire_bytes"] + r["backward_wire_bytes"] for r in ranks)))
    return rows


def measure_traffic(world_sizes: Sequence[int] = (1, 2, 4), *, n: int = 256, n_per_rank: int = 64, batch: int = 1,
                    heads: int = 8, head_dim: int = 16, methods: Sequence[str] = METHODS, causal: bool = True,
                    timeout: float = 300.0, kv_heads: int | None = None) -> list[TrafficRow]:
    """Bytes each rank sends for one attention layer, forward and forward + backward, against the formulas.

    Two sweeps over ``world_sizes``: ``N = n`` fixed, and ``N = n_per_rank · P`` (``N / P`` fixed, the paper's
    "N and P increased proportionally").

    Args:
        world_sizes, n, n_per_rank: the ``P`` to run; ``N`` of the first sweep, ``N / P`` of the second.
        batch, heads, head_dim: ``B``, ``H`` (divisible by every ``P`` for Ulysses), ``d``.
        methods, causal, timeout: names from ``METHODS``; causal attention (the bytes do not depend on it);
            seconds for each launch.
        kv_heads: ``H_kv`` for grouped-query attention (a divisor of ``H``; divisible by every ``P`` for
            Ulysses); None for ``H``.

    Returns:
        One :class:`TrafficRow` per (sweep, ``P``, method), in that order.

    Raises:
        TypeError, ValueError: sizes that are not positive ints, an unknown method, or a (``P``, ``N``, ``H``)
            a method cannot run (named).
    """
    timeout = _validate.positive_finite("measure_traffic", "timeout", timeout)
    tasks = _traffic_tasks("measure_traffic", world_sizes, n, n_per_rank, batch, heads, head_dim, methods, causal,
                           kv_heads)
    return _traffic_rows(tasks, collect(tasks, timeout))


def _memory_tasks(where, world_sizes, lengths, batch, heads, head_dim, methods, causal) -> list[Task]:
    world_sizes, batch, heads, head_dim, methods, causal = _common(where, world_sizes, batch, heads, head_dim,
                                                                   methods, causal)
    lengths = _validate.integer_sequence(where, "lengths", lengths, minimum=1, nonempty=True)
    tasks = []
    for p in world_sizes:
        for length in lengths:
            _check_shape(where, methods, p, length, heads)
            tasks += [Task("memory", m, p, length, batch, heads, head_dim, causal) for m in methods]
    return tasks


def _memory_rows(tasks: list[Task], results: list[list[dict]]) -> list[MemoryRow]:
    rows = []
    for task, ranks in zip(tasks, results):
        b, h, n, d, p = task.batch, task.heads, task.n, task.head_dim, task.world_size
        scores = b * (h // p) * n * n * 4 if task.method == "ulysses" else b * h * (n // p) ** 2 * 4
        rows.append(MemoryRow(method=task.method, world_size=p, n=n, n_local=n // p,
                              peak_bytes=max(r["peak"] for r in ranks), shard_bytes=b * h * (n // p) * d * 4,
                              scores_bytes=scores))
    return rows


def measure_rank_memory(world_sizes: Sequence[int] = (1, 2, 4), lengths: Sequence[int] = (256, 512, 1024), *,
                        batch: int = 1, heads: int = 8, head_dim: int = 16, methods: Sequence[str] = METHODS,
                        causal: bool = True, timeout: float = 300.0) -> list[MemoryRow]:
    """Peak bytes one rank allocates in a forward pass, for every ``P`` and ``N``: counted, not sampled
    (up to one communication buffer with ``P > 1``: :class:`MemoryRow`).

    Args:
        world_sizes, batch, heads, head_dim, methods, causal, timeout: as :func:`measure_traffic`.
        lengths: the ``N`` to run (divisible by ``2P`` for ``ring zigzag``).

    Returns:
        One :class:`MemoryRow` per (``P``, ``N``, method), in that order.

    Raises:
        TypeError, ValueError: as :func:`measure_traffic`.
    """
    tasks = _memory_tasks("measure_rank_memory", world_sizes, lengths, batch, heads, head_dim, methods, causal)
    timeout = _validate.positive_finite("measure_rank_memory", "timeout", timeout)
    return _memory_rows(tasks, collect(tasks, timeout))


def _time_tasks(where, world_sizes, n, batch, heads, head_dim, methods, causal, repeats) -> list[Task]:
    world_sizes, batch, heads, head_dim, methods, causal = _common(where, world_sizes, batch, heads, head_dim,
                                                                   methods, causal)
    n, repeats = _validate.integers(where, minimum=1, n=n, repeats=repeats)
    for p in world_sizes:
        _check_shape(where, methods, p, n, heads)
    return [Task("time", m, p, n, batch, heads, head_dim, causal, repeats=repeats)
            for p in world_sizes for m in methods]


def _time_rows(tasks: list[Task], results: list[list[dict]]) -> list[TimeRow]:
    cores = os.cpu_count() or 1
    # One time per repeat: the slowest rank's (the ranks started together after a barrier).
    samples = {(t.method, t.world_size, t.n): [max(times) for times in zip(*(r["samples"] for r in ranks))]
               for t, ranks in zip(tasks, results)}
    seconds = {key: min(times) for key, times in samples.items()}
    references: dict[tuple, torch.Tensor] = {}
    rows = []
    for task, ranks in zip(tasks, results):
        key = (task.n, task.batch, task.heads, task.head_dim, task.causal)
        if key not in references:
            q, k, v, _ = inputs(task)
            references[key] = self_attention(q, k, v, causal_mask(task.n) if task.causal else None)[0]
        out = unshard([r["out"] for r in ranks], LAYOUT[task.method])
        mine, one = seconds[task.method, task.world_size, task.n], seconds.get((task.method, 1, task.n))
        times = sorted(samples[task.method, task.world_size, task.n])
        rows.append(TimeRow(method=task.method, world_size=task.world_size, n=task.n, seconds=mine,
                            median_seconds=statistics.median(times), min_seconds=times[0], max_seconds=times[-1],
                            ratio_to_one_rank=None if one is None else mine / one,
                            oversubscribed=task.world_size > cores,
                            max_difference=float((out - references[key]).abs().max())))
    return rows


def measure_time(world_sizes: Sequence[int] = (1, 2, 4), *, n: int = 1024, batch: int = 1, heads: int = 8,
                 head_dim: int = 16, methods: Sequence[str] = METHODS, causal: bool = True, repeats: int = 3,
                 timeout: float = 300.0) -> list[TimeRow]:
    """Best time of a forward pass for every ``P`` (one thread per process), as ratios to ``P = 1``.

    Args:
        world_sizes, batch, heads, head_dim, methods, causal, timeout: as :func:`measure_traffic`; include
            ``P = 1`` for the ratios.
        n: ``N`` (divisible by ``2P`` for ``ring zigzag``).
        repeats: timings per (method, ``P``); the best counts.

    Returns:
        One :class:`TimeRow` per (``P``, method), with the output checked against ``self_attention``.

    Raises:
        TypeError, ValueError: as :func:`measure_traffic`, or ``repeats`` below 1.
    """
    tasks = _time_tasks("measure_time", world_sizes, n, batch, heads, head_dim, methods, causal, repeats)
    timeout = _validate.positive_finite("measure_time", "timeout", timeout)
    return _time_rows(tasks, collect(tasks, timeout))


def measure_distributed(world_sizes: Sequence[int] = (1, 2, 4), *, n: int = 256, n_per_rank: int = 64,
                        lengths: Sequence[int] = (256, 512, 1024), time_n: int = 1024, batch: int = 1,
                        heads: int = 8, head_dim: int = 16, methods: Sequence[str] = METHODS, causal: bool = True,
                        repeats: int = 3, timeout: float = 300.0
                        ) -> tuple[list[TrafficRow], list[MemoryRow], list[TimeRow]]:
    """:func:`measure_traffic`, :func:`measure_rank_memory` and :func:`measure_time` in one launch per ``P``.

    Args:
        world_sizes, n, n_per_rank, batch, heads, head_dim, methods, causal, timeout: as :func:`measure_traffic`.
        lengths, time_n, repeats: ``lengths`` of :func:`measure_rank_memory`, ``n`` and ``repeats`` of
            :func:`measure_time`.

    Returns:
        ``(traffic rows, memory rows, time rows)``.

    Raises:
        TypeError, ValueError: as the three functions.
    """
    where = "measure_distributed"
    timeout = _validate.positive_finite(where, "timeout", timeout)
    traffic = _traffic_tasks(where, world_sizes, n, n_per_rank, batch, heads, head_dim, methods, causal)
    memory = _memory_tasks(where, world_sizes, lengths, batch, heads, head_dim, methods, causal)
    timing = _time_tasks(where, world_sizes, time_n, batch, heads, head_dim, methods, causal, repeats)
    results = collect(traffic + memory + timing, timeout)
    a, b = len(traffic), len(traffic) + len(memory)
    return (_traffic_rows(traffic, results[:a]), _memory_rows(memory, results[a:b]),
            _time_rows(timing, results[b:]))

