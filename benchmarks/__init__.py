"""Benchmarks for the people who run the course, outside the student package: ``python -m benchmarks NAME``
(:mod:`benchmarks.__main__`), the GPU harness for the Triton kernels (:mod:`benchmarks.flash_gpu`), their
check without pytest (:mod:`benchmarks.selfcheck`) and the grader's throughput (:mod:`benchmarks.grading`)."""
