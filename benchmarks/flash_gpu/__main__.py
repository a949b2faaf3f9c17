"""``--count-compilations PROFILE``: the kernel compilations the GPU benchmark's profile triggers on an H200,
counted without running anything; ``--warm-up JOB``: one of the warm-up's processes (not run by hand)."""

import json
import sys

USAGE = ("usage: python -m benchmarks.flash_gpu --count-compilations {essential,long}\n"
         "       python -m benchmarks.flash_gpu --warm-up JOB_JSON (run by run_gpu_benchmark)")

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--count-compilations":
        from benchmarks.flash_gpu.kernels_used import count_compilations, describe_compilations
        from benchmarks.flash_gpu.plan import GPU_SIZES, PROFILES, plan_phases

        if sys.argv[2] not in PROFILES:
            sys.exit(f"--count-compilations: the profile must be one of {list(PROFILES)}, got {sys.argv[2]!r}\n{USAGE}")
        counts = count_compilations(plan_phases(GPU_SIZES, None, sys.argv[2]), GPU_SIZES)
        print(describe_compilations(counts, sys.argv[2], dry_run=True))
        print(json.dumps(counts))
    elif len(sys.argv) == 3 and sys.argv[1] == "--warm-up":
        from benchmarks.flash_gpu.warm_up import warm_up_job

        warm_up_job(json.loads(sys.argv[2]))
    else:
        sys.exit(USAGE)
