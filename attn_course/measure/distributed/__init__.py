"""Ring attention against Ulysses across processes, counted from outside (chapter 10; ``python -m benchmarks
distributed``): bytes sent per rank, peak memory, time and the causal ring's critical path, each against the
predictions of :mod:`attn_course.distributed.schedule`; :func:`attention_on_rank` is chapter 10's rank program."""

from attn_course.measure.distributed.critical_path import CriticalPathRow, measure_critical_path
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

__all__ = ["CriticalPathRow", "MemoryRow", "RingWork", "TimeRow", "Traffic", "TrafficRow", "attention_on_rank",
           "count_ring_work", "count_traffic", "measure_critical_path", "measure_distributed", "measure_rank_memory",
           "measure_time", "measure_traffic", "plot_distributed"]
