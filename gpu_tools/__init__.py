"""Tools for the FlashAttention kernels on real GPUs, apart from the course (which never imports them).

* :mod:`gpu_tools.aot`: compile every kernel for sm_80 and sm_90 without a GPU
  (``TRITON_INTERPRET=0 python -m gpu_tools.aot [--all | --spills]``);
* :mod:`gpu_tools.resources`: the registers, spills and shared memory of a compiled kernel, read
  with the ``ptxas`` Triton ships;
* :mod:`gpu_tools.count_compiles`: the compilations ``tools/gpu_check.sh`` triggers, counted in
  Triton's interpreter, and its test shards (``python -m gpu_tools.count_compiles --plan ...``).

The GPU benchmark is :mod:`benchmarks.flash_gpu`; its check without pytest :mod:`benchmarks.selfcheck`.
"""
