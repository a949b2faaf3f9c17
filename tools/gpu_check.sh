#!/usr/bin/env bash
# One prepared run for a lent GPU machine, written to count the first time: at most 4 minutes on an
# H200, compile time included, everything it measures written to $OUT as it goes. It uses the
# machine's own Python, torch and Triton (no .venv, no registry there):
#
#   bash tools/gpu_check.sh                  the first contact (PROFILE=first): <= 240 s
#   PROFILE=long bash tools/gpu_check.sh     a second run: the slow kernel tests too and the whole
#                                            benchmark sweep (about 9 minutes)
#   PROFILE=facts bash tools/gpu_check.sh    step 1 only (seconds): what the machine has
#   results in $OUT (or ./gpu-results); PYTHON=... picks the interpreter
#
# Steps, each under its own timeout (first / long), each line of status.txt stamped with the time:
# 1. machine facts: nvidia-smi, Python, torch, Triton, CUDA, which packages  -> machine.txt   (<= 20 s)
#    and what Triton needs to build a kernel's launcher: a C compiler ($CC, else gcc, else clang) and
#    Python.h (python -m gpu_tools.launcher_check, which says which is missing) -> launcher.txt
# 2. the kernel tests on CUDA, in float16/bfloat16 on the GPU, in parallel shards (compiling is
#    CPU-bound and single-threaded; the machine has 16 cores); each kernel in its default
#    configuration (tests/flash/gpu_setup.py, loaded as a plugin: no autotuning but in its two
#    tests, the pointer kernels' autotuner and the TMA forward's tuning over its pruned candidates),
#    so each specialisation compiles once; every compilation is logged
#                                        -> tests-*.txt, compiles.jsonl  (<= 95 s / 240 s)
#    Meanwhile the benchmark's kernels compile into Triton's on-disk cache in the background
#    (its own warm-up jobs)                                         -> warm-up.txt
#    Without pytest: python -m benchmarks.selfcheck (the kernels against float64, plain Python)
# 3. the benchmark: python -m benchmarks flash --profile essential (fp16 and bf16, d = 64 and 128,
#    N in {4096, 16384}, causal and not, forward, backward, forward + backward; decoding; most
#    important rows first, each written as measured; on SIGTERM the summary is still written)
#                 -> bench.txt, flash-gpu*.csv, machine.json, *.png  (<= 120 s / 315 s)
# Worst case, first profile: 20 + 100 + 120 = 240 s; the estimate behind it is at TIMEOUTS below. Exit status: 0 when every step passed, 1 when one failed or
# timed out, 2 without a GPU (then a CPU dry run shows what would run: the plan, the test
# selection as collected, and the benchmark's code path on the CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-results}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
py="${PYTHON:-python3}"
profile="${PROFILE:-first}"
# tests/ for tests/support, tests/flash for the gpu_setup plugin (-p loads it before pytest reads
# pyproject's pythonpath)
export PYTHONPATH="$PWD:$PWD/tests:$PWD/tests/flash${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
started=$SECONDS
say() { echo "== [$((SECONDS - started)) s] $*" | tee -a "$out/status.txt"; }
: > "$out/status.txt"

# TIMEOUTS, first profile: the estimate behind them (python -m gpu_tools.count_compiles counts the distinct
# kernel specialisations on the CPU; a cold sm_90 compile took 0.9 to 4.5 s here, 2 to 6 s assumed):
# - tests: 132 distinct compilations counted in the interpreter, 136 on a GPU (the TMA forward's
#   one tuning test compiles the 4 candidates kept at d = 64), 147 over the 12 shards (a few shared
#   ones compile in two; python -m gpu_tools.count_compiles --plan ... --shards 12 --most 8); the largest shard
#   needs 13: 26 to 78 s, plus about 10 s to start (torch, CUDA, collection) and a few seconds of
#   tests: 40 to 90 s, so 95 s. 12 processes on 16 cores, the warm-up niced.
# - benchmark warm-up, in the background meanwhile (niced: the 12 test processes keep their cores):
#   its own jobs for the essential rows, one process each (28 at the time of writing): ours' 60 to
#   66 compilations (the TMA forward's 24: its candidates kept for an H200, 4 at d = 64 and 2 at
#   d = 128, per dtype and mask) over 10 of them, 6 or 7 each (12 to 42 s after start-up, done
#   before the tests end), and FlexAttention's 54 graphs over 18 (stopped when the tests end, if
#   not done by then).
# - benchmark: its own warm-up then finds the caches warm (start-up only, about 15 s), then
#   measures the essential rows, ours against SDPA first and FlexAttention after, until 1.3 min
#   (no FlexAttention compile starts in its last 30 s, FLEX_COMPILE_MARGIN_S: one cannot be stopped);
#   killed at 115 s (the rows measured by then are in the CSVs; a kill after every row was written,
#   in the plots, is no failure: python -m gpu_tools.bench_verdict reads machine.json).
# Step 1's launcher check runs alongside its facts (both within 20 s); the verdict takes milliseconds.
# Worst case 20 + 100 + 120 = 240 s, whatever happens (each step is killed at its limit).
case $profile in
    first) test_timeout=95; bench_timeout=115; bench_minutes=1.3; bench_profile=essential; marks="not slow" ;;
    long) test_timeout=240; bench_timeout=300; bench_minutes=4.5; bench_profile=long; marks="slow or not slow" ;;
    facts) test_timeout=0; bench_timeout=0; bench_minutes=0; bench_profile=none; marks="" ;;
    *) echo "gpu_check: PROFILE must be first, long or facts, got '$profile'" >&2; exit 1 ;;
esac
if [ "$profile" = facts ]; then
    say "gpu_check, profile facts: step 1 only"
else
    say "gpu_check, profile $profile: tests <= $test_timeout s, benchmark ($bench_profile) <= $bench_timeout s"
fi

# The test shards, "NAME|PYTEST ARGUMENTS", one process each, all at once. A process compiles its
# kernels one after another, so the first profile's shards are balanced by the compilations each
# needs (tools/gpu_check_shards.txt, written by python -m gpu_tools.count_compiles --plan: at most 13 each);
# the long profile runs one process per file, slow tests included.
test_files="tests/flash/test_flash_triton.py tests/flash/test_flash_triton_gqa_causal.py tests/flash/test_flash_decode.py
            tests/flash/test_flash_tma.py tests/flash/test_flash_configs.py"
shard_plan=tools/gpu_check_shards.txt
shards=()
if [ "$profile" = first ]; then
    while read -r name compilations specs; do
        case $name in ''|'#'*) continue ;; esac
        files=$(tr ' ' '\n' <<< "$specs" | sed 's/::.*//' | sort -u | tr '\n' ' ')
        shards+=("$name|$files--gpu-shard-plan $shard_plan --gpu-shard $name")
    done < "$shard_plan"
else
    for file in $test_files; do
        shards+=("$(basename "$file" .py)|$file -k not sm90_build")   # sm90_build: no GPU needed, minutes
    done
fi

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
    # Triton 3.6 compiles a C launcher (gcc or clang, against Python.h) per kernel signature: without
    # either, every launch fails. Standard library only, a test compile included (about a second),
    # alongside the facts below: step 1 stays within its 20 s.
    timeout 20 "$py" -m gpu_tools.launcher_check > "$out/launcher.txt" 2>&1 &
    launcher_pid=$!
    timeout 20 "$py" - "$out/gpu-state.txt" <<'EOF'
import importlib.metadata as metadata, platform, sys
print("python", sys.version.split()[0], platform.platform())
for name in ("torch", "triton", "numpy", "pytest", "hypothesis", "matplotlib", "transformers"):
    try:
        print(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"{name} not installed")
state = "no output"
try:
    import torch
except ImportError as error:
    state = f"torch import failed: {error}"
else:
    print("cuda available", torch.cuda.is_available(), "| torch CUDA", torch.version.cuda,
          "| cuDNN", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    if torch.cuda.is_available():
        print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability(),
              "multiprocessors", torch.cuda.get_device_properties(0).multi_processor_count)
        state = "cuda-ok"
    else:
        state = f"torch.cuda.is_available() is False (torch {torch.__version__})"
open(sys.argv[1], "w").write(state + "\n")
EOF
    wait "$launcher_pid"
    echo "launcher check exit status $?" >> "$out/launcher.txt"
} 2>&1 | tee "$out/machine.txt"
gpu_state=$(cat "$out/gpu-state.txt" 2> /dev/null || echo "no answer from $py within 20 s")
say "machine facts: $gpu_state"
launcher=$(grep -m1 "^launcher toolchain" "$out/launcher.txt" || tail -3 "$out/launcher.txt" | tr '\n' ' ')
say "C compiler and Python headers for Triton's launchers: ${launcher:-no answer}"
launcher_ok=no
grep -q "^launcher check exit status 0$" "$out/launcher.txt" && launcher_ok=yes
if [ "$profile" = facts ]; then
    say "gpu_check (facts only) finished in $((SECONDS - started)) s; files in $out: $(cd "$out" && ls | tr '\n' ' ')"
    [ "$launcher_ok" = yes ] && exit 0
    exit 1
fi

test_command() {   # the pytest command line of one shard (its arguments after the '|')
    local arguments=${1#*|}
    local selection=${arguments%% -k *}
    local keyword=""
    [ "$selection" != "$arguments" ] && keyword=${arguments#* -k }
    # --noconftest: tests/conftest.py needs packages a bare GPU image may lack (hypothesis,
    # matplotlib); the kernel tests need none of it. -p gpu_setup: the pinned configurations.
    printf '%s\0' "$py" -m pytest -q -p no:cacheprovider --noconftest -p gpu_setup -m "$marks" --durations=10 \
        $selection ${keyword:+-k "$keyword"}
}

if [ "$gpu_state" != "cuda-ok" ]; then
    say "no GPU ($gpu_state): a CPU dry run instead. On a GPU this script would run:"
    say "  2. the kernel tests, ${#shards[@]} shards at once, each <= $test_timeout s, compilations logged to compiles.jsonl:"
    for shard in "${shards[@]}"; do
        say "     ${shard%%|*}: $(test_command "$shard" | tr '\0' ' ')"
    done
    say "     and the benchmark's warm-up compiling in the background"
    say "  3. $py -m benchmarks flash --profile $bench_profile --max-minutes $bench_minutes (killed at $bench_timeout s)"
    # What can be checked here: that the shards, together, hold every test of the selection exactly
    # once (collected, not run: the interpreter would take minutes), and the benchmark's code path.
    if [ "$profile" = first ]; then
        mapfile -d '' command < <(test_command "all|$test_files --gpu-shard-plan $shard_plan")
        timeout -k 5 120 "${command[@]}" --gpu-shard-coverage > "$out/shard-coverage.txt" 2>&1
        coverage=$(grep -E "^gpu_setup:|^  tests/" "$out/shard-coverage.txt" | head -20)
        say "  ${coverage:-no coverage line: see shard-coverage.txt}"
        # "gpu_setup: N tests, N in exactly one of the 12 shards", N > 0: every test runs once
        grep -q "^gpu_setup: \([1-9][0-9]*\) tests, \1 in exactly one" <<< "$coverage" || \
            say "  SHARDS DO NOT MATCH THE TESTS: rerun python -m gpu_tools.count_compiles --plan $shard_plan"
    fi
    bench_args=(--dry-run --out "$out" --profile "$bench_profile")
    say "benchmark CPU dry run: $py -m benchmarks flash ${bench_args[*]}"
    timeout -k 10 300 "$py" -m benchmarks flash "${bench_args[@]}" > "$out/bench.txt" 2>&1
    rc=$?
    tail -15 "$out/bench.txt"
    say "no GPU: CPU dry run exit status $rc (0: the GPU code path ran on the CPU); nothing was measured on a GPU"
    say "  the verdict a GPU run would get: $("$py" -m gpu_tools.bench_verdict "$rc" "$out")"
    say "gpu_check (dry run) finished in $((SECONDS - started)) s; files in $out: $(cd "$out" && ls | tr '\n' ' ')"
    exit 2
fi
export TRITON_INTERPRET=0

# --- 2. the kernel tests on CUDA (and the benchmark's compilations in the background) ------------
failed=0
if [ "$launcher_ok" != yes ]; then   # the kernel tests will fail; SDPA's benchmark rows are still worth having
    say "NO LAUNCHER TOOLCHAIN: every Triton kernel launch will fail (see launcher.txt); running on for SDPA's rows"
    failed=1
fi
warm_pid=""
# The benchmark's own warm-up jobs, started now so that its kernels compile while the tests run
# (into Triton's on-disk cache, where step 3 finds them). Only a head start: step 3 warms up anyway.
# setsid: its own process group, so that stopping it stops its compiling children too.
setsid nice -n 10 timeout -k 5 $((test_timeout + 20)) "$py" - "$bench_profile" > "$out/warm-up.txt" 2>&1 <<'EOF' &
import json, sys
from benchmarks.flash_gpu.plan import GPU_SIZES, WARM_UP_SECONDS, plan_phases
from benchmarks.flash_gpu.warm_up import warm_triton_cache, warm_up_jobs
jobs = warm_up_jobs(plan_phases(GPU_SIZES, None, sys.argv[1]), GPU_SIZES, False)   # the benchmark's own jobs
print(f"{len(jobs)} jobs", flush=True)
print(json.dumps(warm_triton_cache(jobs, timeout_s=WARM_UP_SECONDS, interpret=False)))
EOF
warm_pid=$!
if "$py" -c "import pytest" 2> /dev/null; then
    export GPU_CHECK_COMPILE_LOG="$out/compiles.jsonl"
    : > "$GPU_CHECK_COMPILE_LOG"
    pids=()
    names=()
    for shard in "${shards[@]}"; do
        name=${shard%%|*}
        mapfile -d '' command < <(test_command "$shard")
        timeout -k 5 "$test_timeout" "${command[@]}" > "$out/tests-$name.txt" 2>&1 &
        pids+=($!)
        names+=("$name")
    done
    for index in "${!pids[@]}"; do
        wait "${pids[$index]}"
        rc=$?
        name=${names[$index]}
        summary=$(grep -E "passed|failed|error" "$out/tests-$name.txt" | tail -1)
        case $rc in
            0) say "tests $name: passed ($summary)" ;;
            124|137) say "tests $name: TIMED OUT after $test_timeout s ($summary; see tests-$name.txt)"; failed=1 ;;
            *) say "tests $name: FAILED, exit status $rc ($summary; see tests-$name.txt)"; failed=1 ;;
        esac
    done
    unset GPU_CHECK_COMPILE_LOG
    say "compilations in the tests: $("$py" -c "
import json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
slow = sorted(lines, key=lambda line: -line['seconds'])[:1]
print(f'{len(lines)}, {sum(line[\"seconds\"] for line in lines):.0f} s of compiling in all', *(
    f'(longest {line[\"seconds\"]:.1f} s)' for line in slow))
" "$out/compiles.jsonl" 2>&1 | tail -1)"
else
    say "pytest is not installed here: running python -m benchmarks.selfcheck instead of the test files"
    timeout -k 5 "$test_timeout" "$py" -m benchmarks.selfcheck cuda > "$out/selfcheck.txt" 2>&1
    rc=$?
    grep -E "^FAIL|cases passed" "$out/selfcheck.txt" | tail -30
    if [ $rc -eq 0 ]; then say "selfcheck: passed"; else say "selfcheck: FAILED, exit status $rc"; failed=1; fi
fi
# The warm-up must not run while the benchmark measures: wait for it, or stop it.
if kill -0 "$warm_pid" 2> /dev/null; then
    sleep 5
    kill -TERM -- "-$warm_pid" 2> /dev/null
fi
wait "$warm_pid" 2> /dev/null
say "benchmark warm-up (background): $(tail -1 "$out/warm-up.txt" | cut -c1-300)"

# --- 3. the benchmark -----------------------------------------------------------------------------
bench_args=(--out "$out" --max-minutes "$bench_minutes" --profile "$bench_profile")
say "benchmark: $py -m benchmarks flash ${bench_args[*]} (killed at $bench_timeout s)"
timeout -k 5 "$bench_timeout" "$py" -m benchmarks flash "${bench_args[@]}" > "$out/bench.txt" 2>&1
rc=$?
# The log's key lines (all of it is in bench.txt): phases, the rows that have a target (N >= 4096
# forward and backward: ours against FlashAttention-2 and cuDNN, "ok" or "MISSES FA2+cuDNN"),
# decoding, the verdicts (a missed target is reported, not a failure) and the files written.
grep -E "^#|^## phase|^kind |MISSES [A-Za-z0-9+]+ *$| ok *$|^decode {2,}|^(forward|backward): ours|^targets missed|stopped by|terminated|Error" \
    "$out/bench.txt" | tail -80
# timeout ends the step with 124 also after every row is written (in the plots): machine.json says
# whether the run got through its plan (stopped: complete, or max_minutes with the rest as skipped rows).
verdict=$("$py" -m gpu_tools.bench_verdict "$rc" "$out") || failed=1
say "${verdict:-benchmark: exit status $rc, no verdict (python -m gpu_tools.bench_verdict failed)}"
say "gpu_check finished in $((SECONDS - started)) s; files in $out: $(cd "$out" && ls | tr '\n' ' ')"
exit $failed
