"""Benchmarks: speed and memory claims of the course are measured here, not asserted in timed tests.

Run one as ``python -m attn_course.bench NAME`` (see :mod:`attn_course.bench.__main__`):

* ``kv-cache`` (:mod:`attn_course.bench.kv_cache`): generation with and without a KV cache.
* ``flash`` (:mod:`attn_course.bench.flash`): FlashAttention against naive attention and
  PyTorch's SDPA: time and peak memory on a CPU, TFLOP/s on a CUDA GPU.
* ``variants`` (:mod:`attn_course.bench.variants`): chapter 08's variants (softmax, sliding
  window, FlexAttention, linear attention) against N, the length where linear attention
  overtakes softmax, and the bytes each variant keeps per token.
* ``distributed`` (:mod:`attn_course.bench.distributed`): ring attention against Ulysses on
  ``P = 1, 2, 4`` processes: bytes sent per rank against the formulas, exact memory per rank,
  time as ratios to one rank.

:mod:`attn_course.bench.timing` holds what they share: the timer, the machine
description and the CSV writer. ``attn_course.bench.flash`` is not imported here: it loads
the FlashAttention package and Triton, which the KV-cache benchmark does not need.
"""

from attn_course.bench.kv_cache import KvCacheRow, kv_cache_speedup
from attn_course.bench.timing import best_time

__all__ = ["KvCacheRow", "best_time", "kv_cache_speedup"]
