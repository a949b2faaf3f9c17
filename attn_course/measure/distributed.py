"""Ring attention against Ulysses across processes: bytes sent, memory per rank, time on the CPU.

``python -m attn_course.measure distributed [--quick] [--out FOLDER]`` measures, for ``P = 1, 2, 4``
ranks started by :func:`~attn_course.distributed.launch.launch` (gloo, one thread each):

- **bytes sent per rank** for one attention layer, forward and forward + backward
  (:func:`~attn_course.distributed.communication.count_traffic`), next to the formulas
  (:func:`formula_bytes`), with ``N`` fixed and with ``N`` growing in proportion to ``P``
  (:func:`measure_traffic`). Ring sends ``2 (P - 1)`` shards forward, Ulysses
  ``4 (P - 1) / P``: with ``N / P`` fixed, ring's bytes grow with ``P`` and Ulysses' stay
  nearly constant, the paper's claim;
- **peak memory per rank** against ``N`` and ``P``, exact bytes of the storages allocated
  (:func:`~attn_course.measure.memory.peak_memory`, forward, :func:`measure_rank_memory`). Ring holds
  ``[B, H, N/P, N/P]`` score blocks: its per-rank memory follows ``N / P`` (``(N/P)²`` for the
  scores); Ulysses gathers whole heads and its ordinary attention holds ``[B, H/P, N, N]``;
- **time** of a forward pass on the CPU for ``P = 1, 2, 4``, as ratios to ``P = 1``
  (:func:`measure_time`). On a machine with fewer cores than ``P`` the ranks share cores
  (``P = 4`` on 2 cores is oversubscribed, the rows say so): the ratios then show the cost of
  sharding and communication, not a speed-up.

All measurements of one ``P`` run in one launch (:func:`measure_distributed`), so the command
starts three groups of processes in all.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from attn_course import _validate
from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.distributed.launch import launch
from attn_course.distributed.layout import shard, unshard
from attn_course.distributed.rank_programs import attention_on_rank
from attn_course.distributed.ulysses import ulysses_attention, ulysses_bytes
from attn_course.measure.memory import peak_memory
from attn_course.measure.timing import check_rows

__all__ = ["METHODS", "TrafficRow", "MemoryRow", "TimeRow", "formula_bytes", "measure_traffic",
           "measure_rank_memory", "measure_time", "measure_distributed", "print_traffic", "print_memory",
           "print_time", "plot_distributed"]

# (name, layout): Ulysses needs the contiguous layout; ring runs with both.
METHODS = ("ulysses", "ring", "ring zigzag")
_LAYOUT = {"ulysses": "contiguous", "ring": "contiguous", "ring zigzag": "zigzag"}


@dataclasses.dataclass(frozen=True)
class TrafficRow:
    """Bytes one rank sends for one attention layer (:func:`measure_traffic`).

    Attributes:
        method: one of :data:`METHODS`.
        scaling: ``"N fixed"`` or ``"N ∝ P"`` (``N / P`` fixed), the sweep this row belongs to.
        world_size, n, n_local: ``P``, ``N`` and ``N / P``.
        batch, heads, head_dim: ``B``, ``H``, ``d`` (float32).
        forward_bytes, forward_formula: measured on every rank (the largest) and :func:`formula_bytes`.
        total_bytes, total_formula: the same for forward + backward.
        matches: every rank sent exactly the formula's bytes, forward and total.
    """

    method: str
    scaling: str
    world_size: int
    n: int
    n_local: int
    batch: int
    heads: int
    head_dim: int
    forward_bytes: int
    forward_formula: int
    total_bytes: int
    total_formula: int
    matches: bool


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    """Peak bytes one rank allocates in a forward pass (:func:`measure_rank_memory`).

    Attributes:
        method: one of :data:`METHODS`.
        world_size, n, n_local: ``P``, ``N`` and ``N / P``.
        peak_bytes: the largest over the ranks, exact (:func:`~attn_course.measure.memory.peak_memory`;
            the rank's input shards are not counted, its output is).
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
        method: one of :data:`METHODS`.
        world_size, n: ``P`` and ``N``.
        seconds: best of the repeats, on the slowest rank (ranks start together after a barrier).
        ratio_to_one_rank: ``seconds`` over the same method's ``seconds`` at ``P = 1`` (None without one).
        oversubscribed: ``P`` processes on fewer CPU cores than ``P``.
        max_difference: largest ``|output - self_attention|`` over the gathered output.
    """

    method: str
    world_size: int
    n: int
    seconds: float
    ratio_to_one_rank: float | None
    oversubscribed: bool
    max_difference: float


def formula_bytes(method: str, batch: int, heads: int, n: int, head_dim: int, world_size: int, *,
                  element_size: int = 4, backward: bool = False) -> int:
    """Bytes one rank sends for one attention layer, from the algorithm (``S = B·H·(N/P)·d`` elements a shard).

    - Ulysses: ``4 · (P - 1)/P · S`` forward (q, k, v, out), twice that forward + backward
      (:func:`~attn_course.distributed.ulysses.ulysses_bytes`);
    - ring (either layout): ``2 (P - 1) · S`` forward (K and V passed ``P - 1`` times); the
      backward passes K and V ``P - 1`` times again and dK, dV ``P`` times (home at the end):
      ``(4P - 2) · S`` more, so ``(6P - 4) · S`` in all. Nothing at ``P = 1``.

    Args:
        method: one of :data:`METHODS`.
        batch, heads, n, head_dim: ``B``, ``H``, the full ``N``, ``d`` (``d_v = d``).
        world_size: ``P``; ``N`` divisible by it (by ``2P`` for the zig-zag layout).
        element_size: bytes per element.
        backward: forward + backward instead of forward only.

    Returns:
        Bytes sent per rank (every rank sends the same).

    Raises:
        TypeError, ValueError: an unknown method, sizes that are not positive ints or do not divide.

    Example:
        >>> formula_bytes("ring", 1, 4, 64, 16, 4), formula_bytes("ulysses", 1, 4, 64, 16, 4)
        (24576, 12288)
    """
    where = "formula_bytes"
    method = _method(where, "method", method)
    if method == "ulysses":
        return ulysses_bytes(batch, heads, n, head_dim, world_size, element_size=element_size, backward=backward)
    batch, heads, n, head_dim, world_size, element_size = (
        _validate.integer(where, name, value, minimum=1) for name, value in (
            ("batch", batch), ("heads", heads), ("n", n), ("head_dim", head_dim), ("world_size", world_size),
            ("element_size", element_size)))
    _validate.boolean(where, "backward", backward)
    chunks = 2 * world_size if method == "ring zigzag" else world_size
    if n % chunks:
        raise ValueError(f"{where}: n={n} must be divisible by {chunks} for {method} over {world_size} ranks")
    if world_size == 1:
        return 0
    shard_bytes = batch * heads * (n // world_size) * head_dim * element_size
    return ((6 * world_size - 4) if backward else 2 * (world_size - 1)) * shard_bytes


# --- validation ---------------------------------------------------------------------------------------

def _method(where: str, name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{where}: {name} must be a str, got {type(value).__name__}")
    if value not in METHODS:
        raise ValueError(f"{where}: {name} must be one of {list(METHODS)}, got {value!r}")
    return value


def _methods(where: str, methods: object) -> list[str]:
    methods = _validate.sequence(where, "methods", methods, of="method names")
    if not methods:
        raise ValueError(f"{where}: methods must not be empty")
    return [_method(where, f"methods[{index}]", m) for index, m in enumerate(methods)]


def _positive_ints(where: str, name: str, values: object) -> list[int]:
    values = _validate.integer_sequence(where, name, values, minimum=1)
    if not values:
        raise ValueError(f"{where}: {name} must not be empty")
    return values


def _check_shape(where: str, methods: list[str], world_size: int, n: int, heads: int) -> None:
    """Refuse, by name, a (P, N, H) a method cannot run: N not divisible by P (2P zig-zag), H by P (Ulysses)."""
    for method in methods:
        chunks = 2 * world_size if _LAYOUT[method] == "zigzag" else world_size
        if n % chunks:
            raise ValueError(f"{where}: N={n} must be divisible by {chunks} for {method} over P={world_size} ranks")
        if method == "ulysses" and heads % world_size:
            raise ValueError(f"{where}: H={heads} must be divisible by P={world_size} for ulysses (whole heads per "
                             f"rank)")


# --- what every rank runs -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Task:
    kind: str                # "traffic", "memory" or "time"
    method: str
    world_size: int
    n: int
    batch: int
    heads: int
    head_dim: int
    causal: bool
    repeats: int = 1
    scaling: str = ""


def _inputs(task: _Task) -> tuple[torch.Tensor, ...]:
    """q, k, v, g ``[B, H, N, d]``, the same on every rank (seeded by the sizes)."""
    generator = torch.Generator().manual_seed(task.n * 1000 + task.heads * 10 + task.head_dim)
    return tuple(torch.randn(task.batch, task.heads, task.n, task.head_dim, generator=generator) for _ in range(4))


def _attend(method: str):
    """``attend(q, k, v, causal)`` for the method."""
    if method == "ulysses":
        return lambda q, k, v, causal: ulysses_attention(q, k, v, causal=causal)
    from attn_course.distributed.ring import ring_attention  # here: the ring module is its own chapter step

    layout = _LAYOUT[method]
    return lambda q, k, v, causal: ring_attention(q, k, v, causal=causal, layout=layout)


def _run_task(rank: int, world_size: int, task: _Task) -> dict:
    attend, layout = _attend(task.method), _LAYOUT[task.method]
    if task.kind == "traffic":                      # chapter 09's rank program counts both passes
        q, k, v, g = _inputs(task)                                                # full [B, H, N, d]
        report = attention_on_rank(rank, world_size, q, k, v, method=task.method.split()[0], causal=task.causal,
                                   layout=layout, grad_out=g)
        return dict(forward=report["forward_bytes"], total=report["forward_bytes"] + report["backward_bytes"])
    q, k, v = (shard(x, rank, world_size, layout) for x in _inputs(task)[:3])   # [B, H, N/P, d]
    if task.kind == "memory":
        _, peak = peak_memory(attend, q, k, v, task.causal)
        return dict(peak=peak)
    best = math.inf
    for _ in range(task.repeats):
        dist.barrier()                                      # the ranks start together (timing, not the algorithm)
        start = time.perf_counter()
        out = attend(q, k, v, task.causal)
        best = min(best, time.perf_counter() - start)
    return dict(seconds=best, out=out)


def _bench_rank(rank: int, world_size: int, tasks: list[_Task]) -> list[dict]:
    """Every task of this ``P`` on this rank, in order (one launch for all of them)."""
    attend_once = [_run_task(rank, world_size, _Task("traffic", m, world_size, 4 * world_size, 1, world_size, 2,
                                                     False)) for m in dict.fromkeys(t.method for t in tasks)]
    del attend_once                                          # a warm-up: first calls pay for lazy imports
    return [_run_task(rank, world_size, task) for task in tasks]


def _collect(tasks: list[_Task], timeout: float) -> list[list[dict]]:
    """Run the tasks, one launch per ``P`` (one thread per process); each task's results from every rank."""
    results: list[list[dict]] = [[] for _ in tasks]
    for world_size in dict.fromkeys(t.world_size for t in tasks):
        mine = [index for index, t in enumerate(tasks) if t.world_size == world_size]
        per_rank = launch(_bench_rank, world_size, [tasks[index] for index in mine], timeout=timeout, threads=1)
        for position, index in enumerate(mine):
            results[index] = [ranks[position] for ranks in per_rank]           # one dict per rank
    return results


# --- the three measurements -----------------------------------------------------------------------------

def _sizes(where: str, batch: object, heads: object, head_dim: object, causal: object) -> tuple[int, int, int, bool]:
    batch, heads, head_dim = (_validate.integer(where, name, value, minimum=1)
                              for name, value in (("batch", batch), ("heads", heads), ("head_dim", head_dim)))
    return batch, heads, head_dim, _validate.boolean(where, "causal", causal)


def _traffic_tasks(where, world_sizes, n, n_per_rank, batch, heads, head_dim, methods, causal) -> list[_Task]:
    world_sizes = _positive_ints(where, "world_sizes", world_sizes)
    n = _validate.integer(where, "n", n, minimum=1)
    n_per_rank = _validate.integer(where, "n_per_rank", n_per_rank, minimum=1)
    batch, heads, head_dim, causal = _sizes(where, batch, heads, head_dim, causal)
    methods = _methods(where, methods)
    tasks = []
    for scaling in ("N fixed", "N ∝ P"):
        for p in world_sizes:
            length = n if scaling == "N fixed" else n_per_rank * p
            _check_shape(where, methods, p, length, heads)
            tasks += [_Task("traffic", m, p, length, batch, heads, head_dim, causal, scaling=scaling) for m in methods]
    return tasks


def _traffic_rows(tasks: list[_Task], results: list[list[dict]]) -> list[TrafficRow]:
    rows = []
    for task, ranks in zip(tasks, results):
        sizes = (task.batch, task.heads, task.n, task.head_dim, task.world_size)
        forward, total = formula_bytes(task.method, *sizes), formula_bytes(task.method, *sizes, backward=True)
        rows.append(TrafficRow(
            method=task.method, scaling=task.scaling, world_size=task.world_size, n=task.n,
            n_local=task.n // task.world_size, batch=task.batch, heads=task.heads, head_dim=task.head_dim,
            forward_bytes=max(r["forward"] for r in ranks), forward_formula=forward,
            total_bytes=max(r["total"] for r in ranks), total_formula=total,
            matches=all((r["forward"], r["total"]) == (forward, total) for r in ranks)))
    return rows


def measure_traffic(world_sizes: Sequence[int] = (1, 2, 4), *, n: int = 256, n_per_rank: int = 64, batch: int = 1,
                    heads: int = 8, head_dim: int = 16, methods: Sequence[str] = METHODS, causal: bool = True,
                    timeout: float = 300.0) -> list[TrafficRow]:
    """Bytes each rank sends for one attention layer, forward and forward + backward, against the formulas.

    Two sweeps over ``world_sizes``: ``N = n`` fixed, and ``N = n_per_rank · P`` (``N / P``
    fixed, the paper's "N and P increased proportionally").

    Args:
        world_sizes: the ``P`` to run, e.g. ``(1, 2, 4)``.
        n: ``N`` of the first sweep.
        n_per_rank: ``N / P`` of the second sweep.
        batch, heads, head_dim: ``B``, ``H`` (divisible by every ``P`` for Ulysses), ``d``.
        methods: names from :data:`METHODS`.
        causal: causal attention (the bytes do not depend on it).
        timeout: seconds for each launch.

    Returns:
        One :class:`TrafficRow` per (sweep, ``P``, method), in that order.

    Raises:
        TypeError, ValueError: sizes that are not positive ints, an unknown method, or a (``P``,
            ``N``, ``H``) a method cannot run (named).

    Example:
        >>> rows = measure_traffic((2,), n=8, n_per_rank=4, heads=2, head_dim=4)   # doctest: +SKIP
        >>> all(row.matches for row in rows)                                       # doctest: +SKIP
        True
    """
    tasks = _traffic_tasks("measure_traffic", world_sizes, n, n_per_rank, batch, heads, head_dim, methods, causal)
    timeout = _validate.positive_finite("measure_traffic", "timeout", timeout)
    return _traffic_rows(tasks, _collect(tasks, timeout))


def _memory_tasks(where, world_sizes, lengths, batch, heads, head_dim, methods, causal) -> list[_Task]:
    world_sizes = _positive_ints(where, "world_sizes", world_sizes)
    lengths = _positive_ints(where, "lengths", lengths)
    batch, heads, head_dim, causal = _sizes(where, batch, heads, head_dim, causal)
    methods = _methods(where, methods)
    tasks = []
    for p in world_sizes:
        for length in lengths:
            _check_shape(where, methods, p, length, heads)
            tasks += [_Task("memory", m, p, length, batch, heads, head_dim, causal) for m in methods]
    return tasks


def _memory_rows(tasks: list[_Task], results: list[list[dict]]) -> list[MemoryRow]:
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
    """Peak bytes one rank allocates in a forward pass, for every ``P`` and ``N``: exact, not sampled.

    Args:
        world_sizes: the ``P`` to run.
        lengths: the ``N`` to run (divisible by ``2P`` for ``ring zigzag``).
        batch, heads, head_dim: ``B``, ``H`` (divisible by every ``P`` for Ulysses), ``d``.
        methods: names from :data:`METHODS`.
        causal: causal attention.
        timeout: seconds for each launch.

    Returns:
        One :class:`MemoryRow` per (``P``, ``N``, method), in that order.

    Raises:
        TypeError, ValueError: as :func:`measure_traffic`.

    Example:
        >>> rows = measure_rank_memory((1, 2), (16, 32), heads=2, head_dim=4)       # doctest: +SKIP
    """
    tasks = _memory_tasks("measure_rank_memory", world_sizes, lengths, batch, heads, head_dim, methods, causal)
    timeout = _validate.positive_finite("measure_rank_memory", "timeout", timeout)
    return _memory_rows(tasks, _collect(tasks, timeout))


def _time_tasks(where, world_sizes, n, batch, heads, head_dim, methods, causal, repeats) -> list[_Task]:
    world_sizes = _positive_ints(where, "world_sizes", world_sizes)
    n = _validate.integer(where, "n", n, minimum=1)
    batch, heads, head_dim, causal = _sizes(where, batch, heads, head_dim, causal)
    methods = _methods(where, methods)
    repeats = _validate.integer(where, "repeats", repeats, minimum=1)
    for p in world_sizes:
        _check_shape(where, methods, p, n, heads)
    return [_Task("time", m, p, n, batch, heads, head_dim, causal, repeats=repeats)
            for p in world_sizes for m in methods]


def _time_rows(tasks: list[_Task], results: list[list[dict]]) -> list[TimeRow]:
    cores = os.cpu_count() or 1
    seconds = {(t.method, t.world_size, t.n): max(r["seconds"] for r in ranks) for t, ranks in zip(tasks, results)}
    references: dict[tuple, torch.Tensor] = {}
    rows = []
    for task, ranks in zip(tasks, results):
        key = (task.n, task.batch, task.heads, task.head_dim, task.causal)
        if key not in references:
            q, k, v, _ = _inputs(task)
            references[key] = self_attention(q, k, v, causal_mask(task.n) if task.causal else None)[0]
        out = unshard([r["out"] for r in ranks], _LAYOUT[task.method])
        mine, one = seconds[task.method, task.world_size, task.n], seconds.get((task.method, 1, task.n))
        rows.append(TimeRow(method=task.method, world_size=task.world_size, n=task.n, seconds=mine,
                            ratio_to_one_rank=None if one is None else mine / one,
                            oversubscribed=task.world_size > cores,
                            max_difference=float((out - references[key]).abs().max())))
    return rows


def measure_time(world_sizes: Sequence[int] = (1, 2, 4), *, n: int = 1024, batch: int = 1, heads: int = 8,
                 head_dim: int = 16, methods: Sequence[str] = METHODS, causal: bool = True, repeats: int = 3,
                 timeout: float = 300.0) -> list[TimeRow]:
    """Best time of a forward pass for every ``P`` (one thread per process), as ratios to ``P = 1``.

    Args:
        world_sizes: the ``P`` to run; include 1 for the ratios.
        n: ``N`` (divisible by ``2P`` for ``ring zigzag``).
        batch, heads, head_dim: ``B``, ``H`` (divisible by every ``P`` for Ulysses), ``d``.
        methods: names from :data:`METHODS`.
        causal: causal attention.
        repeats: timings per (method, ``P``); the best counts.
        timeout: seconds for each launch.

    Returns:
        One :class:`TimeRow` per (``P``, method), with the output checked against ``self_attention``.

    Raises:
        TypeError, ValueError: as :func:`measure_traffic`, or ``repeats`` below 1.

    Example:
        >>> rows = measure_time((1, 2), n=32, heads=2, head_dim=4, repeats=1)       # doctest: +SKIP
    """
    tasks = _time_tasks("measure_time", world_sizes, n, batch, heads, head_dim, methods, causal, repeats)
    timeout = _validate.positive_finite("measure_time", "timeout", timeout)
    return _time_rows(tasks, _collect(tasks, timeout))


def measure_distributed(world_sizes: Sequence[int] = (1, 2, 4), *, n: int = 256, n_per_rank: int = 64,
                        lengths: Sequence[int] = (256, 512, 1024), time_n: int = 1024, batch: int = 1,
                        heads: int = 8, head_dim: int = 16, methods: Sequence[str] = METHODS, causal: bool = True,
                        repeats: int = 3, timeout: float = 300.0
                        ) -> tuple[list[TrafficRow], list[MemoryRow], list[TimeRow]]:
    """:func:`measure_traffic`, :func:`measure_rank_memory` and :func:`measure_time` in one launch per ``P``.

    Args:
        world_sizes, n, n_per_rank, batch, heads, head_dim, methods, causal, timeout: as
            :func:`measure_traffic` (shared by all three).
        lengths: the ``N`` of :func:`measure_rank_memory`.
        time_n, repeats: ``n`` and ``repeats`` of :func:`measure_time`.

    Returns:
        ``(traffic rows, memory rows, time rows)``.

    Raises:
        TypeError, ValueError: as the three functions.
    """
    where = "measure_distributed"
    traffic = _traffic_tasks(where, world_sizes, n, n_per_rank, batch, heads, head_dim, methods, causal)
    memory = _memory_tasks(where, world_sizes, lengths, batch, heads, head_dim, methods, causal)
    timing = _time_tasks(where, world_sizes, time_n, batch, heads, head_dim, methods, causal, repeats)
    timeout = _validate.positive_finite(where, "timeout", timeout)
    results = _collect(traffic + memory + timing, timeout)
    a, b = len(traffic), len(traffic) + len(memory)
    return (_traffic_rows(traffic, results[:a]), _memory_rows(memory, results[a:b]),
            _time_rows(timing, results[b:]))


# --- tables and the plot --------------------------------------------------------------------------------

def print_traffic(rows: Sequence[TrafficRow]) -> None:
    """Print :func:`measure_traffic`'s rows: bytes per rank measured and by formula.

    Raises:
        TypeError, ValueError: ``rows`` not a non-empty sequence of :class:`TrafficRow`.
    """
    rows = check_rows("print_traffic", rows, (TrafficRow,))
    print(f"{'method':>12} {'sweep':>8} {'P':>3} {'N':>6} {'N/P':>5} {'fwd B':>9} {'formula':>9} "
          f"{'fwd+bwd B':>10} {'formula':>9} {'exact':>6}")
    for r in rows:
        print(f"{r.method:>12} {r.scaling:>8} {r.world_size:>3} {r.n:>6} {r.n_local:>5} {r.forward_bytes:>9} "
              f"{r.forward_formula:>9} {r.total_bytes:>10} {r.total_formula:>9} {'yes' if r.matches else 'NO':>6}")


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
    print(f"{'method':>12} {'P':>3} {'N':>6} {'ms':>9} {'vs P=1':>7} {'max diff':>9}  note")
    for r in rows:
        ratio = "n/a" if r.ratio_to_one_rank is None else f"{r.ratio_to_one_rank:.2f}"
        note = f"oversubscribed: {r.world_size} processes on {os.cpu_count()} cores" if r.oversubscribed else ""
        print(f"{r.method:>12} {r.world_size:>3} {r.n:>6} {r.seconds * 1e3:>9.2f} {ratio:>7} "
              f"{r.max_difference:>9.1e}  {note}")


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
    path = _validate.path(where, "path", path)
    if not isinstance(title, str):
        raise TypeError(f"{where}: title must be a str, got {type(title).__name__}")
    import matplotlib  # here, not at the top: the CSVs suffice where matplotlib is missing

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    methods = list(dict.fromkeys(r.method for r in traffic + memory + timing))
    colour = {m: f"C{i}" for i, m in enumerate(methods)}
    drawn = [m for m in methods if not (m == "ring zigzag" and "ring" in methods)]   # same bytes as ring
    for scaling, style in (("N fixed", "-"), ("N ∝ P", "--")):
        for method in drawn:
            chosen = [r for r in traffic if r.method == method and r.scaling == scaling]
            if chosen:
                axes[0].plot([r.world_size for r in chosen], [r.forward_formula / 2**10 for r in chosen], style,
                             color=colour[method], label=f"{method}, {scaling} (formula)")
                axes[0].plot([r.world_size for r in chosen], [r.forward_bytes / 2**10 for r in chosen], "o",
                             color=colour[method])
    axes[0].set(xlabel="P (ranks)", ylabel="KiB sent per rank (forward)",
                title="bytes: lines formula, dots measured\n(ring zigzag sends what ring sends)")
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
