"""Measurements the chapters show, each also ``python -m benchmarks NAME``: speed and memory claims are measured
here, not asserted in timed tests. :mod:`~attn_course.measure.timing` is the one timer,
:mod:`~attn_course.measure.memory` counts peak and free memory; ``measure.flash`` is not imported here (it loads
Triton, which the KV-cache measurement does not need)."""

from attn_course.measure.kv_cache import KvCacheRow, kv_cache_speedup
from attn_course.measure.timing import best_time

__all__ = ["KvCacheRow", "best_time", "kv_cache_speedup"]
