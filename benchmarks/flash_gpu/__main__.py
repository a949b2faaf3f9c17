"""``python -m benchmarks.flash_gpu --warm-up JOB``: one of :func:`~benchmarks.flash_gpu.warm_up.warm_triton_cache`'s
processes (run by :func:`~benchmarks.flash_gpu.run_gpu_benchmark`, not by hand)."""

import json
import sys

from benchmarks.flash_gpu.warm_up import warm_up_job

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--warm-up":
        sys.exit("usage: python -m benchmarks.flash_gpu --warm-up JOB_JSON (run by run_gpu_benchmark)")
    warm_up_job(json.loads(sys.argv[2]))
