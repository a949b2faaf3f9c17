"""Ring attention against Ulysses across processes, counted from outside (chapter 10; ``python -m benchmarks
distributed``): for ``P`` ranks started by :func:`~attn_course.distributed.launch.launch` (gloo, one thread each),

- **bytes sent per rank** for one layer, forward and forward + backward, counted twice (:func:`count_traffic`
  at the communication helpers, :func:`~attn_course.distributed.wiretap.tap_process_group` at
  ``torch.distributed``), against :func:`formula_bytes`, with ``N`` fixed and with ``N / P`` fixed
  (:func:`measure_traffic`);
- **peak memory per rank**, exact bytes allocated in a forward pass (:func:`measure_rank_memory`);
- **time** of a forward pass, as ratios to ``P = 1`` (:func:`measure_time`; on fewer cores than ``P``
  the ranks share cores, and the rows say so);
- the **critical path** of a synchronous ring, per step, in each layout (:func:`measure_critical_path`,
  from :func:`count_ring_work`), against :func:`critical_path_formula`.

:func:`measure_distributed` runs the first three in one launch per ``P``; :func:`attention_on_rank` is
chapter 10's rank program; :func:`plot_distributed` draws the rows, and
``attn_course.teaching.tables.table(rows, columns=...)`` shows them as a table.
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
from attn_course.measure.distributed.plot import plot_distributed
from attn_course.measure.distributed.ranks import attention_on_rank
from attn_course.measure.distributed.taps import RingWork, Traffic, count_ring_work, count_traffic

__all__ = ["METHODS", "TrafficRow", "MemoryRow", "TimeRow", "formula_bytes", "measure_traffic",
           "measure_rank_memory", "measure_time", "measure_distributed", "plot_distributed", "CriticalPathRow",
           "critical_path_formula", "measure_critical_path", "attention_on_rank", "RingWork", "Traffic",
           "count_ring_work", "count_traffic"]
