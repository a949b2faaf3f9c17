"""``python -m benchmarks flash`` on a CUDA GPU: our Triton kernels against SDPA's backends and FlexAttention.

Two benchmarks, each row written to its CSV the moment it is measured, each naming the path and
the launch configuration that ran (``path``, ``config``; :mod:`~benchmarks.flash_gpu.kernels_used`):

* **Attention over a whole sequence** (:func:`gpu_rows`, ``flash-gpu.csv``): forward, backward and
  forward+backward TFLOP/s of :func:`~attn_course.flash.flash_attention`, of
  ``scaled_dot_product_attention`` restricted to each of its CUDA backends (flash,
  memory-efficient, cuDNN), of ``torch.compile(flex_attention)`` (the Triton attention a PyTorch
  user would pick: Inductor generates its kernel; its compilation is in ``first_call_s``, not in
  the timing) and of naive attention (:func:`~attn_course.core.attention.self_attention`, which
  materialises the N × N weights in float32; up to N = 4096), for float16 and bfloat16, d = 128
  and 64, causal or not. ``B = tokens / N`` sequences of ``H = model_dim / d`` heads, so every N
  does the same work per token, as in the FlashAttention papers; grouped-query prefill rows have
  H = 32 query heads over H_kv = 8 key/value heads (Llama 3 8B).
* **Decoding** (:func:`decode_rows`, ``flash-gpu-decode.csv``): N_q = 1 (and 16) new queries
  against a KV cache of N_k = 1024 … 65536 keys, B = 4, H = 32 query heads and H_kv = 8 key/value
  heads, d = 128. Decoding reads the whole cache to do ``4 · H · N_q · N_k · d`` FLOPs: about
  ``N_q · H / H_kv / 2`` FLOPs per byte, far below the hundreds a GPU needs to be compute-bound,
  so it is **memory-bound** and is reported as milliseconds and as achieved GB/s of K/V read
  (the cache's bytes over the time; the H200's HBM peaks near 4.8 TB/s). Each call is replayed
  from a CUDA graph, so that Python's launch overhead (tens of microseconds, more than the
  kernel below about 8k keys) is not what is measured.

A backend that is not available for a case, or raises, is a row with ``status="skipped"`` and the
reason (SDPA's own warnings included), never a crash. :func:`speedup_summary` gives ours against
the best SDPA backend and against FlexAttention per configuration (``flash-gpu-summary.csv``): the
goal is forward ≥ 1.0× and backward ≥ 0.8× SDPA's best at N ≥ 4096. Every row carries the GPU,
driver, CUDA, torch and Triton versions (:class:`MachineInfo`); ``machine.json`` holds more facts
about the run, the kernel compilations its profile triggers among them.

:func:`run_gpu_benchmark` runs a profile (:data:`PROFILES`): ``"essential"``, the first-contact
check's rows (float16 and bfloat16, d = 64 and 128, N = 4096 and 16384, both masks, all modes;
one decode row set; one grouped-query prefill row set), or ``"long"``, the whole sweep, in order
of importance, and stops starting new measurements after ``max_minutes``; what it did not reach
is recorded as skipped. ``dry_run=True`` runs the very same code on the CPU at tiny sizes (the
kernels in Triton's interpreter, float16 and float32, FlexAttention eagerly and forward only,
decoding without CUDA graphs, a wall-clock timer instead of ``triton.testing.do_bench``) so that
a first GPU run does not fail on a typo.

One idea per module: :mod:`~benchmarks.flash_gpu.sizes` (what is measured),
:mod:`~benchmarks.flash_gpu.machine`, :mod:`~benchmarks.flash_gpu.rows` (the CSV columns),
:mod:`~benchmarks.flash_gpu.clock` (the timer, from :mod:`attn_course.measure.timing`, and
CUDA-graph replay), :mod:`~benchmarks.flash_gpu.measuring` (one method in each mode, a skipped row
on failure), :mod:`~benchmarks.flash_gpu.backends` (SDPA's backends, FlexAttention, our decode),
:mod:`~benchmarks.flash_gpu.kernels_used` (which of our kernels and configurations ran, and the
compile count), :mod:`~benchmarks.flash_gpu.attention` and :mod:`~benchmarks.flash_gpu.decode`
(the two benchmarks), :mod:`~benchmarks.flash_gpu.summary`, :mod:`~benchmarks.flash_gpu.plots`,
:mod:`~benchmarks.flash_gpu.warm_up` (Triton's and Inductor's caches, in parallel processes),
:mod:`~benchmarks.flash_gpu.budget` (the deadline and SIGTERM),
:mod:`~benchmarks.flash_gpu.csv_stream` and :mod:`~benchmarks.flash_gpu.run` (the whole run,
in order of importance). :func:`~attn_course.measure.timing.gpu_milliseconds` is
``triton.testing.do_bench``; ``triton.testing.perf_report`` is not used: it sweeps one
x-axis into one plot per benchmark, while this run streams rows with a status, a reason and a
deadline, and plots one panel per configuration.
"""

from benchmarks.flash_gpu.attention import gpu_rows
from benchmarks.flash_gpu.backends import sdpa_has_enable_gqa
from benchmarks.flash_gpu.budget import TIME_BUDGET_SPENT
from benchmarks.flash_gpu.decode import decode_rows
from benchmarks.flash_gpu.kernels_used import count_compilations
from benchmarks.flash_gpu.machine import MachineInfo, machine_info
from benchmarks.flash_gpu.plots import plot_gpu_rows
from benchmarks.flash_gpu.rows import DecodeRow, GpuRow, SummaryRow
from benchmarks.flash_gpu.run import GpuBenchmarkResult, run_gpu_benchmark
from benchmarks.flash_gpu.sizes import DECODE_KV_LENGTHS, DRY_RUN, GPU_LENGTHS, GPU_SIZES, PROFILES
from benchmarks.flash_gpu.summary import print_summary, speedup_summary

__all__ = ["DECODE_KV_LENGTHS", "DRY_RUN", "GPU_LENGTHS", "GPU_SIZES", "PROFILES", "TIME_BUDGET_SPENT", "DecodeRow",
           "GpuBenchmarkResult", "GpuRow", "MachineInfo", "SummaryRow", "count_compilations", "decode_rows", "gpu_rows",
           "machine_info", "plot_gpu_rows", "print_summary", "run_gpu_benchmark", "sdpa_has_enable_gqa",
           "speedup_summary"]
