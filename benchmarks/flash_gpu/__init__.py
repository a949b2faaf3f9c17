"""``python -m benchmarks flash`` on a CUDA GPU: our Triton kernels against SDPA's backends and FlexAttention.

:func:`run_gpu_benchmark` measures attention over a whole sequence (:func:`gpu_rows`, TFLOP/s) and decoding
(:func:`decode_rows`, K/V GB/s), most important rows first, each written as it is measured and naming the
path and configuration that ran, and compares ours with the fastest SDPA backend (:func:`speedup_summary`);
``dry_run=True`` runs the same code on the CPU at tiny sizes, so that a first GPU run does not fail on a typo.
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
