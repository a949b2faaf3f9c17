#!/usr/bin/env bash
# One prepared run for a lent GPU machine: at most about 8 minutes, written to run unchanged the
# first time. It uses the machine's own Python, torch and Triton (no .venv, no registry there):
#
#   bash tools/gpu_check.sh            results in $OUT (or ./gpu-results); PYTHON=... picks the interpreter
#
# 1. machine facts (nvidia-smi, Python, torch, Triton, CUDA, which packages are there)  -> machine.txt
# 2. the kernel tests on CUDA, each file in its own process at once (compiling is CPU-bound),
#    <= 150 s: tests/flash/test_flash_triton.py, tests/flash/test_flash_triton_gqa_causal.py and, where
#    present, tests/flash/test_flash_decode.py, tests/flash/test_flash_configs.py (every autotuning
#    candidate) and tests/flash/test_flash_tma.py (not its slow sm_90 ahead-of-time build, which
#    needs no GPU)                                                            -> tests-*.txt
#    Without pytest: python -m benchmarks.selfcheck (the kernels against float64 by the
#    FlashAttention rule, plain Python)                                         -> selfcheck.txt
# 3. the benchmark, python -m benchmarks flash --max-minutes 4.5, killed at 300 s: it first
#    compiles ours in 10 parallel processes into Triton's cache (<= 120 s), then measures the most
#    important cases first (N >= 4096 in float16, decoding, bfloat16, short N last), writes each
#    row as it is measured and starts nothing after 4.5 min; on SIGTERM it still writes the summary
#                           -> bench.txt, flash-gpu.csv, -decode.csv, -summary.csv, machine.json, *.png
# Worst case: ~10 s + 150 s + 315 s. status.txt says what passed. Exit status: 0 when the tests
# (or the self-check) and the benchmark succeeded, 1 when one failed, 2 without a GPU (then the
# benchmark's CPU dry run runs instead, to show the code path works).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-results}"
mkdir -p "$out"
py="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
started=$SECONDS
say() { echo "== [$((SECONDS - started)) s] $*" | tee -a "$out/status.txt"; }
: > "$out/status.txt"

# --- 1. machine facts ---------------------------------------------------------------------------
{
    date -u
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi > "$out/nvidia-smi.txt" 2>&1      # the full table: in the file, not the log
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
    else
        echo "nvidia-smi: not found"
    fi
    echo "nproc: $(nproc)"
    timeout 120 "$py" - <<'EOF'
import importlib.metadata as metadata, platform, sys
print("python", sys.version.split()[0], platform.platform())
for name in ("torch", "triton", "numpy", "pytest", "hypothesis", "matplotlib", "transformers"):
    try:
        print(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"{name} not installed")
try:
    import torch
except ImportError as error:
    print("torch import failed:", error)
else:
    print("cuda available", torch.cuda.is_available(), "| torch CUDA", torch.version.cuda,
          "| cuDNN", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    if torch.cuda.is_available():
        print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
EOF
} 2>&1 | tee "$out/machine.txt"

gpu_state=$(timeout 120 "$py" -c "
import torch
print('cuda-ok' if torch.cuda.is_available() else 'torch.cuda.is_available() is False (torch ' + torch.__version__ + ')')
" 2>&1)
gpu_problem=""
grep -qx "cuda-ok" <<< "$gpu_state" || gpu_problem=$(tail -1 <<< "${gpu_state:-no output from $py}")
if [ -n "$gpu_problem" ]; then
    say "no GPU: $gpu_problem. The CUDA tests and the GPU benchmark need one; running the benchmark's CPU dry run instead"
    timeout -k 10 300 "$py" -m benchmarks flash --dry-run --out "$out" > "$out/bench.txt" 2>&1
    rc=$?
    tail -30 "$out/bench.txt"
    say "no GPU: CPU dry run exit status $rc (0: the GPU code path ran on the CPU); nothing was measured on a GPU"
    exit 2
fi
export TRITON_INTERPRET=0

# --- 2. the kernel tests on CUDA ----------------------------------------------------------------
failed=0
if "$py" -c "import pytest" 2> /dev/null; then
    pids=()
    files=()
    for file in tests/flash/test_flash_triton.py tests/flash/test_flash_triton_gqa_causal.py tests/flash/test_flash_decode.py \
                tests/flash/test_flash_tma.py tests/flash/test_flash_configs.py; do
        [ -f "$file" ] || { say "$file: not in this checkout"; continue; }
        name=$(basename "$file" .py)
        timeout -k 10 150 "$py" -m pytest -q -p no:cacheprovider --noconftest -m "not slow" "$file" \
            > "$out/tests-$name.txt" 2>&1 &
        pids+=($!)
        files+=("$file")
    done
    for index in "${!pids[@]}"; do
        wait "${pids[$index]}"
        rc=$?
        name=$(basename "${files[$index]}" .py)
        tail -4 "$out/tests-$name.txt"
        case $rc in
            0) say "${files[$index]}: passed" ;;
            124|137) say "${files[$index]}: TIMED OUT after 150 s (see tests-$name.txt)"; failed=1 ;;
            *) say "${files[$index]}: FAILED, exit status $rc (see tests-$name.txt)"; failed=1 ;;
        esac
    done
else
    say "pytest is not installed here: running python -m benchmarks.selfcheck instead of the test files"
    timeout -k 10 150 "$py" -m benchmarks.selfcheck cuda > "$out/selfcheck.txt" 2>&1
    rc=$?
    grep -E "^FAIL|cases passed" "$out/selfcheck.txt" | tail -30
    if [ $rc -eq 0 ]; then say "selfcheck: passed"; else say "selfcheck: FAILED, exit status $rc"; failed=1; fi
fi

# --- 3. the benchmark -----------------------------------------------------------------------------
say "benchmark: python -m benchmarks flash --max-minutes 4.5 (killed at 300 s)"
timeout -k 15 300 "$py" -m benchmarks flash --out "$out" --max-minutes 4.5 > "$out/bench.txt" 2>&1
rc=$?
# The log's key lines (all of it is in bench.txt): phases, the ours/SDPA rows that have a target
# (N >= 4096 forward and backward), decoding, the verdicts and the files written.
grep -E "^#|^## phase|^ +kind |MISSED$| ok$|^ +decode |^(forward|backward): ours|stopped by|terminated|Error" \
    "$out/bench.txt" | tail -110
case $rc in
    0) say "benchmark: done (rows not reached within the budget, if any, are status 'skipped' in the CSVs)" ;;
    *) say "benchmark: exit status $rc (124/137/1: stopped by the timeout; the CSVs hold the rows measured)"; failed=1 ;;
esac
say "gpu_check finished in $((SECONDS - started)) s; files in $out: $(cd "$out" && ls | tr '\n' ' ')"
exit $failed
