"""Tools for the FlashAttention kernels on real GPUs, apart from the course (which never imports them):
compiling them ahead of time (:mod:`gpu_tools.aot`), reading their registers and spills
(:mod:`gpu_tools.resources`), counting the compilations ``tools/gpu_check.sh`` triggers and planning its
test shards (:mod:`gpu_tools.count_compiles`)."""
