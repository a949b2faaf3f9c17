"""What every rank runs: one launch per ``P`` runs all of that ``P``'s measurements, in order."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from attn_course.distributed.launch import launch
from attn_course.distributed.layout import shard
from attn_course.distributed.rank_programs import attention_on_rank
from attn_course.distributed.ulysses import ulysses_attention
from attn_course.measure.distributed.formulas import LAYOUT
from attn_course.measure.memory import peak_memory
from attn_course.measure.timing import best_time

__all__ = ["Task", "attend_function", "bench_rank", "collect", "inputs", "run_task"]


@dataclasses.dataclass(frozen=True)
class Task:
    """One measurement for every rank of one launch: what to run (``kind``), with which method and sizes."""

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
    kv_heads: int | None = None          # grouped-query attention: K/V heads (None: ``heads``)


def inputs(task: Task) -> tuple[torch.Tensor, ...]:
    """q, k, v, g, the same on every rank (seeded by the sizes): q and g ``[B, H, N, d]``, k and v
    ``[B, H_kv, N, d]``."""
    generator = torch.Generator().manual_seed(task.n * 1000 + task.heads * 10 + task.head_dim)
    kv_heads = task.heads if task.kv_heads is None else task.kv_heads
    q, k, v, g = (torch.randn(task.batch, heads, task.n, task.head_dim, generator=generator)
                  for heads in (task.heads, kv_heads, kv_heads, task.heads))
    return q, k, v, g


def attend_function(method: str):
    """``attend(q, k, v, causal)`` for the method."""
    if method == "ulysses":
        return lambda q, k, v, causal: ulysses_attention(q, k, v, causal=causal)
    from attn_course.distributed.ring import ring_attention  # here: the ring module is its own chapter step

    layout = LAYOUT[method]
    return lambda q, k, v, causal: ring_attention(q, k, v, causal=causal, layout=layout)


def run_task(rank: int, world_size: int, task: Task) -> dict:
    """Run ``task`` on this rank: ``{forward, total, wire_forward, wire_total, other_collectives}`` (bytes),
    ``{peak}`` bytes or ``{seconds, samples, out}``."""
    attend, layout = attend_function(task.method), LAYOUT[task.method]
    if task.kind == "traffic":                      # chapter 10's rank program counts both passes
        q, k, v, g = inputs(task)                                                # full [B, H, N, d]
        report = attention_on_rank(rank, world_size, q, k, v, method=task.method.split()[0], causal=task.causal,
                                   layout=layout, grad_out=g)
        return dict(forward=report["forward_bytes"], total=report["forward_bytes"] + report["backward_bytes"],
                    wire_forward=report["forward_wire_bytes"],
                    wire_total=report["forward_wire_bytes"] + report["backward_wire_bytes"],
                    other_collectives=report["other_collectives"])
    q, k, v = (shard(x, rank, world_size, layout) for x in inputs(task)[:3])   # [B, H, N/P, d]
    if task.kind == "memory":
        _, peak = peak_memory(attend, q, k, v, task.causal)
        return dict(peak=peak)
    found = {}

    def forward(_):
        found["out"] = attend(q, k, v, task.causal)

    # Before each timed call, untimed, a barrier: the ranks start together (timing, not the algorithm).
    # Exactly ``repeats`` calls on every rank (no time budget): each is a collective the others join.
    # Every call is kept, so that the spread can be reported next to the best.
    samples = [best_time(forward, 1, setup=dist.barrier) for _ in range(task.repeats)]
    return dict(seconds=min(samples), samples=samples, out=found["out"])


def bench_rank(rank: int, world_size: int, tasks: list[Task]) -> list[dict]:
    """Every task of this ``P`` on this rank, in order (one launch for all of them)."""
    attend_once = [run_task(rank, world_size, Task("traffic", m, world_size, 4 * world_size, 1, world_size, 2,
                                                     False)) for m in dict.fromkeys(t.method for t in tasks)]
    del attend_once                                          # a warm-up: first calls pay for lazy imports
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

