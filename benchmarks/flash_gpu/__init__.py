"""``python -m benchmarks flash`` on a CUDA GPU: our Triton kernels against SDPA's backends and FlexAttention.

Two benchmarks, each row written to its CSV the moment it is measured, each naming the path and
the launch configuration that ran (:mod:`~benchmarks.flash_gpu.kernels_used`):

* **Attention over a whole sequence** (:func:`gpu_rows`, ``flash-gpu.csv``): forward, backward and
  forward+backward TFLOP/s of :func:`~attn_course.flash.flash_attention`, of
  ``scaled_dot_product_attention`` restricted to each of its CUDA backends, of
  ``torch.compile(flex_attention)`` and of naive attention (up to N = 4096), float16 and bfloat16,
  d = 128 and 64, causal or not; ``B = tokens / N`` sequences of ``H = model_dim / d`` heads, as in
  the FlashAttention papers; grouped-query prefill rows have H = 32 over H_kv = 8 (Llama 3 8B).
* **Decoding** (:func:`decode_rows`, ``flash-gpu-decode.csv``): N_q = 1 (and 16) new queries against a
  KV cache of N_k = 1024 … 65536 keys: memory-bound, so reported as milliseconds and K/V GB/s, each
  call replayed from a CUDA graph (Python's launch overhead is not what is measured).

A method that is unavailable or raises is a row with ``status="skipped"`` and the reason, never a
crash. :func:`speedup_summary` compares ours with the best SDPA backend and FlexAttention
(``flash-gpu-summary.csv``; goal: forward ≥ 1.0× and backward ≥ 0.8× at N ≥ 4096).
:func:`run_gpu_benchmark` runs a profile of :mod:`~benchmarks.flash_gpu.plan` in order of importance
under a time budget; ``dry_run=True`` runs the same code on the CPU at tiny sizes (the kernels in
Triton's interpreter), so that a first GPU run does not fail on a typo.

Modules: :mod:`~benchmarks.flash_gpu.plan` (what is measured, in which order),
:mod:`~benchmarks.flash_gpu.rows` (the machine, the rows, their CSVs),
:mod:`~benchmarks.flash_gpu.measuring` (the clock, the budget, one method in each mode),
:mod:`~benchmarks.flash_gpu.backends` (SDPA's backends, FlexAttention),
:mod:`~benchmarks.flash_gpu.kernels_used` (which of our kernels ran; the compile count),
:mod:`~benchmarks.flash_gpu.attention` and :mod:`~benchmarks.flash_gpu.decode` (the two benchmarks),
:mod:`~benchmarks.flash_gpu.report` (the summary, its table, the plots),
:mod:`~benchmarks.flash_gpu.warm_up` (Triton's and Inductor's caches, in parallel processes) and
:mod:`~benchmarks.flash_gpu.run` (the whole run).
"""

from benchmarks.flash_gpu.attention import gpu_rows
from benchmarks.flash_gpu.backends import sdpa_has_enable_gqa
from benchmarks.flash_gpu.decode import decode_rows
from benchmarks.flash_gpu.kernels_used import count_compilations
from benchmarks.flash_gpu.measuring import TIME_BUDGET_SPENT
from benchmarks.flash_gpu.plan import DECODE_KV_LENGTHS, DRY_RUN, GPU_LENGTHS, GPU_SIZES, PROFILES, plan_phases
from benchmarks.flash_gpu.report import plot_gpu_rows, speedup_summary, summary_table, target_verdicts
from benchmarks.flash_gpu.rows import DecodeRow, GpuRow, MachineInfo, SummaryRow, machine_info
from benchmarks.flash_gpu.run import GpuBenchmarkResult, run_gpu_benchmark

__all__ = ["DECODE_KV_LENGTHS", "DRY_RUN", "GPU_LENGTHS", "GPU_SIZES", "PROFILES", "TIME_BUDGET_SPENT", "DecodeRow",
           "GpuBenchmarkResult", "GpuRow", "MachineInfo", "SummaryRow", "count_compilations", "decode_rows", "gpu_rows",
           "machine_info", "plan_phases", "plot_gpu_rows", "run_gpu_benchmark", "sdpa_has_enable_gqa",
           "speedup_summary", "summary_table", "target_verdicts"]
