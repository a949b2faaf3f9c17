"""Tools for the FlashAttention kernels on real GPUs, apart from the course (which never imports them):
compiling them ahead of time (:mod:`gpu_tools.aot`), reading their registers and spills
(:mod:`gpu_tools.resources`), counting the compilations ``tools/gpu_check.sh`` triggers and planning its
test shards (:mod:`gpu_tools.count_compiles`), and two checks that script runs with the GPU machine's bare
Python: whether Triton can build its kernel launchers there, a C compiler and ``Python.h``
(:mod:`gpu_tools.launcher_check`), and whether its benchmark step wrote every row
(:mod:`gpu_tools.bench_verdict`)."""
