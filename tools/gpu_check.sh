#!/usr/bin/env bash
# One prepared run for a lent GPU machine (see DEVELOPERS notes: the device tool gives ~15 min).
# It uses the machine's own Python, torch and Triton (no .venv, no registry there):
#   run: bash tools/gpu_check.sh        (results land in $OUT, or ./gpu-results)
# 1. what is there; 2. the FlashAttention tests on CUDA (fp16/bf16, compiled kernels);
# 3. the GPU benchmark, python -m attn_course.bench flash (attn_course/bench/flash.py: CSV + PNG).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-results}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TRITON_INTERPRET=0
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python -c "import sys, torch, triton; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$out/machine.txt"
if python -c "import pytest" 2> /dev/null; then
    timeout 300 python -m pytest -q -p no:cacheprovider --noconftest tests/test_flash_triton.py 2>&1 | tail -25 | tee "$out/tests.txt"
else
    echo "pytest is not installed here: skipping tests/test_flash_triton.py" | tee "$out/tests.txt"
fi
timeout 420 python -m attn_course.bench flash --out "$out" 2>&1 | tail -80 | tee "$out/bench.txt"
