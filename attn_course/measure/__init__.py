"""Measurements the chapters show: speed and memory claims are measured here, not asserted in timed tests.

Each also runs from the command line as ``python -m benchmarks NAME`` (see :mod:`benchmarks.__main__`):

* ``kv-cache`` (:mod:`attn_course.measure.kv_cache`): generation with and without a KV cache.
* ``flash`` (:mod:`attn_course.measure.flash`): FlashAttention against naive attention and
  PyTorch's SDPA: time and peak memory on a CPU (on a CUDA GPU, :mod:`benchmarks.flash_gpu`).
* ``variants`` (:mod:`attn_course.measure.variants`): chapter 09's variants (softmax, sliding
  window, FlexAttention, linear attention) against N, the length where linear attention
  overtakes softmax, and the bytes each variant keeps per token.
* ``distributed`` (:mod:`attn_course.measure.distributed`): ring attention against Ulysses on
  ``P = 1, 2, 4`` processes: bytes sent per rank against the formulas, exact memory per rank,
  time as ratios to one rank.

What they share: :mod:`attn_course.measure.timing` (the one timer: ``torch.utils.benchmark`` and
:mod:`timeit` on the CPU, ``triton.testing.do_bench`` on a GPU), :mod:`attn_course.measure.memory`
(peak and free memory) and :mod:`attn_course.measure.rows` (row checks and the CSV writer).
``attn_course.measure.flash`` is not imported here: it loads the FlashAttention package and
Triton, which the KV-cache benchmark does not need.
"""

from attn_course.measure.kv_cache import KvCacheRow, kv_cache_speedup
from attn_course.measure.timing import best_time

__all__ = ["KvCacheRow", "best_time", "kv_cache_speedup"]
