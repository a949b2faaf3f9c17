"""python -m benchmarks flash --dry-run: the GPU benchmark's code, end to end on the CPU (Triton's interpreter)."""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import torch
from made_up_rows import DECODE_COLUMNS, GPU_COLUMNS, SUMMARY_COLUMNS, read_csv

import benchmarks
from benchmarks import flash_gpu
from benchmarks.flash_gpu.plan import plan_phases
from gpu_tools.bench_verdict import bench_verdict

REPO = pathlib.Path(benchmarks.__file__).parent.parent


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """``python -m benchmarks flash --dry-run``, once for the tests below (about 25 s)."""
    out = tmp_path_factory.mktemp("dry-run")
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "benchmarks", "flash", "--dry-run", "--out", str(out)],
                               capture_output=True, text=True, timeout=300, cwd=REPO)
    return out, completed, time.perf_counter() - started


@pytest.mark.slow   # about 25 s: Triton's interpreter
def test_dry_run_writes_every_file_with_its_columns(dry_run):
    out, completed, seconds = dry_run
    assert completed.returncode == 0, completed.stderr[-3000:]
    for name, columns in (("flash-gpu.csv", GPU_COLUMNS), ("flash-gpu-decode.csv", DECODE_COLUMNS),
                          ("flash-gpu-summary.csv", SUMMARY_COLUMNS)):
        found, rows = read_csv(out / name)
        assert found == columns, name
        assert rows and {row["torch_version"] for row in rows} == {torch.__version__}, name
        assert {row["gpu"] for row in rows} == {flash_gpu.machine_info("cpu").gpu}
    assert (out / "flash-gpu.png").stat().st_size > 1000 and (out / "flash-gpu-decode.png").stat().st_size > 1000
    facts = json.loads((out / "machine.json").read_text())
    assert facts["dry_run"] is True and facts["stopped"] == "complete" and facts["not_reached"] == 0
    assert facts["warm_up"]["jobs"] == 1 and facts["warm_up"]["failures"] == []
    assert facts["machine"]["torch_version"] == torch.__version__ and [p["kind"] for p in facts["plan"]] == [
        "attention", "decode", "attention", "attention", "attention", "attention", "attention"]   # the essential
    # profile, the default: FlexAttention's phases last
    assert facts["profile"] == "essential" and facts["compilations"] == flash_gpu.count_compilations(
        plan_phases(flash_gpu.GPU_SIZES, None, "essential"), flash_gpu.GPU_SIZES)      # an H200's count
    assert "torch " + torch.__version__ in completed.stdout
    assert "ours/FA2" in completed.stdout and "ours/cuDNN" in completed.stdout
    assert "kernel compilations of the essential profile on an H200" in completed.stdout


@pytest.mark.slow   # about 25 s: Triton's interpreter
def test_dry_run_measures_ours_naive_and_sdpa_and_skips_the_cuda_backends_with_a_reason(dry_run):
    out = dry_run[0]
    _, rows = read_csv(out / "flash-gpu.csv")
    sizes = flash_gpu.DRY_RUN
    configurations = len(sizes["dtypes"]) * len(sizes["head_dims"]) * 2 * len(sizes["essential_lengths"])
    configurations += len(sizes["gqa"]["lengths"])                   # grouped-query prefill: one dtype, causal
    assert len(rows) == configurations * 6 * 3
    by_method = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row)
    for method in ("ours (Triton)", "sdpa flash", "naive"):     # CPU SDPA has a flash backend
        assert {row["status"] for row in by_method[method]} == {"ok"}, method
        assert all(float(row["tflops"]) > 0 and float(row["max_difference"]) < 2e-2 for row in by_method[method])
    for method in ("sdpa efficient", "sdpa cudnn"):             # CUDA-only: recorded, not raised
        assert {row["status"] for row in by_method[method]} == {"skipped"}
        assert all("No viable backend" in row["reason"] or "RuntimeError" in row["reason"] for row in by_method[method])
    # Every row names the path and, where one ran, the configuration.
    assert {row["path"] for row in by_method["ours (Triton)"]} == {"pointer (interpreter)"}
    assert all(row["config"].startswith("forward BLOCK_M=128") for row in by_method["ours (Triton)"]
               if row["mode"] == "forward")
    assert all("dkdv BLOCK_M=" in row["config"] and "dq BLOCK_M=" in row["config"]
               for row in by_method["ours (Triton)"] if row["mode"] != "forward")
    assert {row["path"] for row in by_method["sdpa flash"]} == {"sdpa-flash"}
    # FlexAttention: eagerly on the CPU, forward only, the backward skipped with the reason.
    flex = by_method["flex compiled"]
    assert {(row["mode"], row["status"], row["path"]) for row in flex} == {
        ("forward", "ok", "flex-eager"), ("backward", "skipped", "flex-eager"),
        ("forward+backward", "skipped", "flex-eager")}
    assert all("no backward on the CPU" in row["reason"] for row in flex if row["status"] == "skipped")
    assert any("block_mask BLOCK_SIZE=" in row["config"] for row in flex if row["causal"] == "True")
    # Grouped-query prefill rows: H_kv < H, every method that ran matching SDPA.
    grouped = [row for row in rows if int(row["kv_heads"]) < int(row["heads"])]
    assert grouped and {row["causal"] for row in grouped} == {"True"}
    assert {row["status"] for row in grouped if row["method"] in ("ours (Triton)", "sdpa flash", "naive")} == {"ok"}
    # A backend refusing enable_gqa is tried again on K/V expanded inside the call (here it refuses all).
    assert {row["path"] for row in grouped if row["method"] == "sdpa cudnn"} == {"sdpa-cudnn (K/V expanded)"}
    assert all("enable_gqa=True refused" in row["reason"] for row in grouped if row["method"] == "sdpa cudnn")
    # The most important measurements come first: the longest N in the first dtype.
    assert (rows[0]["dtype"], rows[0]["n"]) == ("float16", str(max(sizes["essential_lengths"])))
    _, decode = read_csv(out / "flash-gpu-decode.csv")
    ours = [row for row in decode if row["method"].startswith("ours")]
    assert ours and {row["status"] for row in ours} == {"ok"} and all(float(r["kv_gbps"]) > 0 for r in ours)
    assert {row["path"] for row in ours} == {"flash-decoding"} and all("splits=" in row["config"] for row in ours)
    assert {row["n_q"] for row in decode} == {"1"}                   # one decode row set
    # The CUDA-graph branch's fallback: timed plainly, and the row says why.
    measured = [row for row in decode if row["status"] == "ok"]
    assert {row["timing"] for row in measured} == {"plain"}
    assert all(row["reason"].startswith("CPU dry run: no CUDA graphs") for row in measured)
    _, summary = read_csv(out / "flash-gpu-summary.csv")
    judged = [row for row in summary if row["target"]]
    assert judged and all(row["best_sdpa"] == "sdpa flash" and float(row["ratio"]) > 0 for row in judged)
    forward = [row for row in summary if row["kind"] == "attention" and row["mode"] == "forward"]
    assert forward and all(float(row["flex_ratio"]) > 0 for row in forward)


@pytest.mark.slow   # about 25 s: Triton's interpreter
def test_dry_run_stops_on_sigterm_and_still_writes_the_summary(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "benchmarks", "flash", "--dry-run", "--out",
                                str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            rows = tmp_path / "flash-gpu.csv"
            if rows.exists() and len(rows.read_text().splitlines()) > 16:    # a measured configuration or more
                break
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, output[-3000:]
    assert "terminated (SIGTERM)" in output
    facts = json.loads((tmp_path / "machine.json").read_text())
    assert facts["stopped"] == "SIGTERM" and facts["measured"] > 0
    _, summary = read_csv(tmp_path / "flash-gpu-summary.csv")
    assert summary


def test_a_tiny_budget_stops_the_run_and_says_what_was_not_reached(tmp_path):
    result = flash_gpu.run_gpu_benchmark(tmp_path, dry_run=True, max_minutes=1e-9, warm_up=False, progress=None)
    assert result.stopped == "max_minutes" and result.summary == []
    assert {r.reason for r in result.rows + result.decode} == {flash_gpu.TIME_BUDGET_SPENT}
    facts = json.loads((tmp_path / "machine.json").read_text())
    assert facts["stopped"] == "max_minutes" and facts["not_reached"] == len(result.rows) + len(result.decode)
    columns, rows = read_csv(tmp_path / "flash-gpu-summary.csv")
    assert columns == SUMMARY_COLUMNS and rows == []
    # Every row is written (as skipped): tools/gpu_check.sh counts a timeout (124) after this as no failure.
    assert bench_verdict(124, tmp_path)[0] is False and bench_verdict(124, tmp_path / "elsewhere")[0] is True
