"""Benchmarks for the people who run the course, outside the student package.

Run one as ``python -m benchmarks NAME`` from the repository root (see :mod:`benchmarks.__main__`):
the CPU measurements of :mod:`attn_course.measure` (``kv-cache``, ``flash``, ``variants``,
``distributed``), the GPU harness for the Triton kernels (:mod:`benchmarks.flash_gpu`, with
:mod:`benchmarks.selfcheck` checking them without pytest), and the grader's throughput
(:mod:`benchmarks.grading`).
"""
