"""Ring attention against Ulysses across processes: bytes sent, memory per rank, time on the CPU.

``python -m benchmarks distributed [--quick] [--out FOLDER]`` measures, for ``P = 1, 2, 4``
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

Apart from these, :func:`measure_critical_path` measures what a balanced layout buys a synchronous
ring: per step, the most score elements any rank computes (the ring waits for it), summed over the
steps, against :func:`critical_path_formula` for the contiguous, zig-zag and striped layouts
(:func:`print_critical_path` prints the rows).
"""

from __future__ import annotations

from attn_course.measure.distributed.critical_path import (
    CriticalPathRow,
    critical_path_formula,
    measure_critical_path,
)
from attn_course.measure.distributed.formulas import METHODS, formula_bytes
from attn_course.measure.distributed.measurements import (
    MemoryRow,
    TimeRow,
    TrafficRow,
    measure_distributed,
    measure_rank_memory,
    measure_time,
    measure_traffic,
)
from attn_course.measure.distributed.report import (
    plot_distributed,
    print_critical_path,
    print_memory,
    print_time,
    print_traffic,
)

__all__ = ["METHODS", "TrafficRow", "MemoryRow", "TimeRow", "formula_bytes", "measure_traffic",
           "measure_rank_memory", "measure_time", "measure_distributed", "print_traffic", "print_memory",
           "print_time", "plot_distributed", "CriticalPathRow", "critical_path_formula", "measure_critical_path",
           "print_critical_path"]
