"""What every rank runs under :func:`~attn_course.distributed.launch.launch` (which imports it by name):
chapter 10's rank program, :func:`attention_on_rank`, and the measurements' tasks, one launch per ``P``."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from attn_course import _validate
from attn_course.distributed.launch import launch
from attn_course.distributed.layout import shard
from attn_course.distributed.ring import ring_attention
from attn_course.distributed.schedule import LAYOUT
from attn_course.distributed.ulysses import ulysses_attention
from attn_course.distributed.wiretap import tap_process_group
from attn_course.measure.distributed.taps import count_ring_work, count_traffic
from attn_course.measure.memory import peak_memory
from attn_course.measure.timing import best_time

__all__ = ["Task", "attention_on_rank", "bench_rank", "collect", "inputs", "run_task"]


def attention_on_rank(rank: int, world_size: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      method: str = "ring", causal: bool = False, layout: str = "contiguous",
                      grad_out: torch.Tensor | None = None) -> dict:
    """Cut the full ``q``, ``k``, ``v`` to this rank's shards, attend across the ranks, and report.

    Args:
        rank, world_size: given by the launcher.
        q, k, v: the full tensors, the same on every rank: q ``[B, H, N, d]``, k and v
            ``[B, H_kv, N, d]`` (``H_kv = H``, or a divisor of it for grouped-query attention).
        method: ``"ring"`` (:func:`~attn_course.distributed.ring.ring_attention`) or ``"ulysses"``
            (:func:`~attn_course.distributed.ulysses.ulysses_attention`, contiguous layout only).
        causal, layout: a causal mask over the whole sequence; ``"contiguous"`` (ring: any layout).
        grad_out: the full ``[B, H, N, d_v]`` gradient of a loss with respect to the output; when given,
            the backward pass runs too and the gradient shards come back.

    Returns:
        A dict: ``"out"`` (this rank's ``[B, H, N/P, d_v]``), ``"grads"`` (``(dq, dk, dv)`` shards, or None),
        ``"forward_bytes"``, ``"backward_bytes"`` (sent, by :func:`~.taps.count_traffic`),
        ``"forward_wire_bytes"``, ``"backward_wire_bytes"`` (the same, by
        :func:`~attn_course.distributed.wiretap.tap_process_group`), ``"other_collectives"`` (any other
        data-moving collective called, by name), ``"work"`` (ring: the chunk pairs its forward computed,
        by :func:`~.taps.count_ring_work`; Ulysses: None).

    Raises:
        ValueError: an unknown method, Ulysses with a layout other than contiguous; otherwise as the two
            algorithms.
    """
    where = "attention_on_rank"
    if method not in ("ring", "ulysses"):
        raise ValueError(f"{where}: method must be one of ('ring', 'ulysses'), got {method!r}")
    if method == "ulysses" and layout != "contiguous":
        raise ValueError(f"{where}: Ulysses takes the contiguous layout (its causal work is balanced anyway), "
                         f"got layout={layout!r}")
    causal = _validate.boolean(where, "causal", causal)
    local = [shard(t, rank, world_size, layout).requires_grad_(grad_out is not None) for t in (q, k, v)]
    with count_traffic() as forward, tap_process_group() as forward_wire, count_ring_work() as work:
        if method == "ring":
            out = ring_attention(*local, causal=causal, layout=layout)               # [B, H, N/P, d_v]
        else:
            out = ulysses_attention(*local, causal=causal)
    report = dict(out=out.detach(), grads=None, forward_bytes=forward.bytes_sent, backward_bytes=0,
                  forward_wire_bytes=forward_wire.bytes_sent, backward_wire_bytes=0,
                  other_collectives=tuple(forward_wire.other_calls), work=work.forward if method == "ring" else None)
    if grad_out is not None:
        with count_traffic() as backward, tap_process_group() as backward_wire:
            (out * shard(grad_out, rank, world_size, layout)).sum().backward()
        report.update(grads=tuple(t.grad for t in local), backward_bytes=backward.bytes_sent,
                      backward_wire_bytes=backward_wire.bytes_sent,
                      other_collectives=report["other_collectives"] + tuple(backward_wire.other_calls))
    return report


@dataclasses.dataclass(frozen=True)
class Task:
    """One measurement for every rank of one launch: what to run (``kind``), with which method and sizes."""

    kind: str                # "traffic", "memory", "time" or "work" (ring's scores and seconds per step)
    method: str
    world_size: int
    n: int
    batch: int
    heads: int
    head_dim: int
    causal: bool
    repeats: int = 1
    scaling: str = ""
    kv_heads: int | None = None          # grouped-query attention: K/V heads (None: ``heads``)


def inputs(task: Task) -> tuple[torch.Tensor, ...]:
    """q, k, v, g, the same on every rank (seeded by the sizes): q and g ``[B, H, N, d]``, k and v
    ``[B, H_kv, N, d]``."""
    generator = torch.Generator().manual_seed(task.n * 1000 + task.heads * 10 + task.head_dim)
    kv_heads = task.heads if task.kv_heads is None else task.kv_heads
    return tuple(torch.randn(task.batch, heads, task.n, task.head_dim, generator=generator)
                 for heads in (task.heads, kv_heads, kv_heads, task.heads))


def run_task(rank: int, world_size: int, task: Task) -> dict:
    """Run ``task`` on this rank: :func:`attention_on_rank`'s report (with the backward), ``{peak}`` bytes,
    ``{seconds, samples, out}`` or ``{scores, seconds}`` per step."""
    method, layout = task.method.split()[0], LAYOUT[task.method]            # "ring zigzag": ring, zigzag
    if task.kind == "traffic":                      # chapter 10's rank program counts both passes
        q, k, v, g = inputs(task)                                                # full [B, H, N, d]
        return attention_on_rank(rank, world_size, q, k, v, method=method, causal=task.causal, layout=layout,
                                 grad_out=g)
    q, k, v = (shard(x, rank, world_size, layout) for x in inputs(task)[:3])   # [B, H, N/P, d]
    options = dict(causal=task.causal) if method == "ulysses" else dict(causal=task.causal, layout=layout)
    attend = ulysses_attention if method == "ulysses" else ring_attention
    if task.kind == "memory":
        _, peak = peak_memory(attend, q, k, v, **options)
        return dict(peak=peak)
    if task.kind == "work":                         # counted forwards, each after a barrier: the ranks start together
        works = []
        for _ in range(task.repeats):
            dist.barrier()
            with count_ring_work() as work:
                attend(q, k, v, **options)
            works.append(work)
        return dict(scores=works[0].forward_scores_by_step,     # the same at every repeat; the best time per step
                    seconds=[min(step) for step in zip(*(work.forward_seconds_by_step for work in works))])
    found = {}

    def forward(_):
        found["out"] = attend(q, k, v, **options)

    # Before each timed call, untimed, a barrier: the ranks start together. Exactly ``repeats`` calls on
    # every rank (no time budget: each is a collective the others join), all kept to report the spread.
    samples = [best_time(forward, 1, setup=dist.barrier) for _ in range(task.repeats)]
    return dict(seconds=min(samples), samples=samples, out=found["out"])


def bench_rank(rank: int, world_size: int, tasks: list[Task]) -> list[dict]:
    """Every task of this ``P`` on this rank, in order, after an untimed warm-up per method (lazy imports)."""
    for method in dict.fromkeys(t.method for t in tasks):
        run_task(rank, world_size, Task("traffic", method, world_size, 4 * world_size, 1, world_size, 2, False))
    return [run_task(rank, world_size, task) for task in tasks]


def collect(tasks: list[Task], timeout: float) -> list[list[dict]]:
    """Run the tasks, one launch per ``P`` (one thread per process); each task's results from every rank."""
    results: list[list[dict]] = [[] for _ in tasks]
    for world_size in dict.fromkeys(t.world_size for t in tasks):
        mine = [index for index, t in enumerate(tasks) if t.world_size == world_size]
        per_rank = launch(bench_rank, world_size, [tasks[index] for index in mine], timeout=timeout, threads=1)
        for position, index in enumerate(mine):
            results[index] = [ranks[position] for ranks in per_rank]           # one dict per rank
    return results
