"""attn_course.measure: the benchmarks run, report typed rows and write their CSVs (no timing assertions)."""

from __future__ import annotations

import ast
import csv
import dataclasses
import inspect
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import torch

import attn_course.measure
from attn_course.measure import flash, kv_cache, timing
from attn_course.models.tiny_language_model import LanguageModelConfig, TinyLanguageModel
from benchmarks import flash_gpu, selfcheck
from benchmarks.__main__ import main

BENCH_DIR = pathlib.Path(attn_course.measure.__file__).parent
REPO = BENCH_DIR.parent.parent
CPU_COLUMNS = ["method", "n", "seconds", "peak_mib", "max_difference"]
MACHINE_COLUMNS = ["gpu", "driver", "cuda", "torch_version", "triton_version"]
GPU_COLUMNS = ["method", "dtype", "head_dim", "causal", "batch", "heads", "n", "mode", "status", "milliseconds",
               "tflops", "max_difference", "first_call_s", "reason", *MACHINE_COLUMNS]
DECODE_COLUMNS = ["method", "dtype", "head_dim", "batch", "heads", "kv_heads", "n_q", "n_k", "kv_layout", "status",
                  "milliseconds", "kv_gbps", "max_difference", "first_call_s", "reason", *MACHINE_COLUMNS]
SUMMARY_COLUMNS = ["kind", "dtype", "head_dim", "causal", "n_q", "n_k", "mode", "ours_ms", "best_sdpa",
                   "best_sdpa_ms", "ratio", "target", "meets_target", "note", *MACHINE_COLUMNS]
MACHINE = flash_gpu.MachineInfo(gpu="NVIDIA H200", driver="580.1", cuda="13.0", torch_version="2.11.0",
                                triton_version="3.6.0")
KV_CACHE_COLUMNS = ["new_tokens", "positions_without", "positions_with", "seconds_without", "seconds_with", "speedup"]


def gpu_row(**changes) -> flash_gpu.GpuRow:
    """A made-up GpuRow (these tests run without a GPU), with ``changes`` applied."""
    values = dict(method="ours (Triton)", dtype="float16", head_dim=64, causal=False, batch=32, heads=32, n=512,
                  mode="forward", status="ok", milliseconds=0.5, tflops=123.4, max_difference=1e-3,
                  first_call_s=None, reason="", **dataclasses.asdict(MACHINE))
    return flash_gpu.GpuRow(**{**values, **changes})


def decode_row(**changes) -> flash_gpu.DecodeRow:
    """A made-up DecodeRow, with ``changes`` applied."""
    values = dict(method="ours (decode_attention)", dtype="float16", head_dim=128, batch=4, heads=32, kv_heads=8,
                  n_q=1, n_k=4096, kv_layout="grouped (in place)", status="ok", milliseconds=0.02, kv_gbps=3355.4,
                  max_difference=1e-3, first_call_s=None, reason="", **dataclasses.asdict(MACHINE))
    return flash_gpu.DecodeRow(**{**values, **changes})


@pytest.fixture(scope="module")
def cpu_rows():
    return flash.cpu_rows(lengths=(64, 128), head_dim=16, block=64, repeats=1)


# --- the package and its imports -------------------------------------------------------------

def test_package_reexports_what_chapter_04_imports():
    assert attn_course.measure.kv_cache_speedup is kv_cache.kv_cache_speedup
    assert attn_course.measure.best_time is timing.best_time


@pytest.mark.parametrize("code", ["import attn_course.measure.flash", "import benchmarks.flash_gpu",
                                  "import benchmarks.selfcheck", "import attn_course.measure.variants",
                                  "import attn_course.flash; import attn_course.measure"])
def test_imports_have_no_cycle_in_a_fresh_interpreter(code):
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def imported_modules(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for each import statement of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", [alias.name for alias in node.names]))
    return found


# --- timing: best_time, write_csv, machine_description ---------------------------------------

def test_best_time_calls_fn_repeats_times_and_returns_the_shortest():
    calls = []
    assert 0 <= timing.best_time(lambda: calls.append(1), repeats=4) < 1
    assert len(calls) == 4


def test_best_time_rejects_bad_input():
    with pytest.raises(TypeError, match=r"^best_time: fn must be callable, got int"):
        timing.best_time(3, repeats=1)
    with pytest.raises(ValueError, match=r"^best_time: repeats must be >= 1, got 0"):
        timing.best_time(lambda: None, repeats=0)
    with pytest.raises(TypeError, match=r"^best_time: repeats must be an int, got float"):
        timing.best_time(lambda: None, repeats=2.0)


def test_write_csv_has_one_column_per_field(tmp_path):
    rows = [gpu_row(), gpu_row(causal=True, tflops=99.0)]
    path = timing.write_csv(rows, tmp_path / "deeper" / "rows.csv")
    assert path == tmp_path / "deeper" / "rows.csv"
    with open(path) as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == GPU_COLUMNS
        assert [(row["causal"], row["tflops"], row["first_call_s"]) for row in reader] == [
            ("False", "123.4", ""), ("True", "99.0", "")]


def test_write_csv_rejects_mixed_empty_or_plain_rows(tmp_path):
    cpu = flash.CpuRow(method="naive", n=64, seconds=1.0, peak_mib=1.0, max_difference=0.0)
    with pytest.raises(TypeError, match=r"^write_csv: rows\[1\] must be a GpuRow like rows\[0\], got CpuRow"):
        timing.write_csv([gpu_row(), cpu], tmp_path / "x.csv")
    with pytest.raises(TypeError, match=r"^write_csv: rows\[0\] must be a dataclass instance, got dict"):
        timing.write_csv([{"n": 1}], tmp_path / "x.csv")
    with pytest.raises(ValueError, match=r"^write_csv: rows must not be empty"):
        timing.write_csv([], tmp_path / "x.csv")
    with pytest.raises(TypeError, match=r"^write_csv: path must be a str or path, got int"):
        timing.write_csv([cpu], 3)


def test_machine_description_names_torch_and_triton():
    description = timing.machine_description()
    assert f"torch {torch.__version__}" in description and "Triton" in description


# --- kv-cache ----------------------------------------------------------------------------------

def tiny_kv_cache(**changes):
    options = dict(new_tokens=(2, 4), prompt_length=3, embed_dim=16, num_layers=1)
    return kv_cache.kv_cache_speedup(**{**options, **changes})


def test_kv_cache_speedup_returns_one_row_per_count():
    rows = tiny_kv_cache()
    assert all(isinstance(row, kv_cache.KvCacheRow) for row in rows)
    assert [row.new_tokens for row in rows] == [2, 4]
    assert [(row.positions_without, row.positions_with) for row in rows] == [(3 + 4, 3 + 1), (3 + 4 + 5 + 6, 3 + 3)]
    for row in rows:
        assert row.seconds_without > 0 and row.seconds_with > 0
        assert row.speedup == pytest.approx(row.seconds_without / row.seconds_with)


def test_kv_cache_speedup_refuses_to_time_generation_that_disagrees(monkeypatch):
    generate = TinyLanguageModel.generate

    def cached_goes_wrong(self, prompt, count, *, use_cache=True, **options):
        out = generate(self, prompt, count, use_cache=use_cache, **options)
        return out + 1 if use_cache else out

    monkeypatch.setattr(TinyLanguageModel, "generate", cached_goes_wrong)
    with pytest.raises(RuntimeError, match=r"^kv_cache_speedup: cached and uncached generation disagree at new_tokens"):
        tiny_kv_cache()


@pytest.mark.parametrize("prompt_length, new_tokens", [(1, 1), (3, 4), (5, 11)])
def test_positions_processed_counts_what_generation_feeds_the_model(prompt_length, new_tokens):
    """Counted independently: a hook on the position table sees every position a pass uses."""
    torch.manual_seed(0)
    config = LanguageModelConfig(vocab_size=5, max_length=prompt_length + new_tokens)
    model = TinyLanguageModel(config).eval()
    seen = []
    model.position_embedding.register_forward_hook(lambda module, args, output: seen.append(args[0].numel()))
    counts = []
    for use_cache in (False, True):
        seen.clear()
        model.generate(torch.zeros(prompt_length, dtype=torch.long), new_tokens, use_cache=use_cache)
        counts.append(sum(seen))
    assert kv_cache.positions_processed(prompt_length, new_tokens) == tuple(counts)


@pytest.mark.parametrize("arguments, error, message", [
    ((0, 3), ValueError, r"prompt_length must be >= 1, got 0"),
    ((3, 0), ValueError, r"new_tokens must be >= 1, got 0"),
    ((3, 2.0), TypeError, r"new_tokens must be an int, got float"),
])
def test_positions_processed_rejects_bad_input(arguments, error, message):
    with pytest.raises(error, match=r"^positions_processed: " + message):
        kv_cache.positions_processed(*arguments)


def test_benchmarks_leave_the_global_rng_as_it_was():
    state = torch.random.get_rng_state()
    tiny_kv_cache(new_tokens=(2,), seed=7)
    flash.cpu_rows(lengths=(16,), head_dim=4, block=8, repeats=1)
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("changes, error, message", [
    ({"new_tokens": (4, 0)}, ValueError, r"new_tokens\[1\] must be >= 1, got 0"),
    ({"new_tokens": (4, 2.5)}, TypeError, r"new_tokens\[1\] must be an int, got float"),
    ({"new_tokens": 4}, TypeError, r"new_tokens must be a sequence of ints, got int"),
    ({"new_tokens": ()}, ValueError, r"new_tokens must not be empty"),
    ({"prompt_length": 0}, ValueError, r"prompt_length must be >= 1, got 0"),
    ({"embed_dim": 10}, ValueError, r"embed_dim must be a multiple of 4"),
    ({"num_layers": True}, TypeError, r"num_layers must be an int, got bool"),
    ({"repeats": 0}, ValueError, r"repeats must be >= 1, got 0"),
    ({"seed": -1}, ValueError, r"seed must be >= 0, got -1"),
])
def test_kv_cache_speedup_rejects_bad_input(changes, error, message):
    with pytest.raises(error, match=r"^kv_cache_speedup: " + message):
        tiny_kv_cache(**changes)


def test_print_kv_cache_prints_one_line_per_row(capsys):
    kv_cache.print_kv_cache([kv_cache.KvCacheRow(new_tokens=32, positions_without=1520, positions_with=63,
                                                 seconds_without=0.3, seconds_with=0.1, speedup=3.0)])
    header, line = capsys.readouterr().out.splitlines()
    assert "speed-up" in header and "ratio" in header
    assert line.split() == ["32", "1520", "63", "24x", "0.300", "0.100", "3.0x"]
    with pytest.raises(TypeError, match=r"^print_kv_cache: rows\[0\] must be KvCacheRow, got GpuRow"):
        kv_cache.print_kv_cache([gpu_row()])


def test_decode_step_times_returns_one_row_per_length_with_the_same_calls_at_every_length():
    rows = kv_cache.decode_step_times((2, 5, 9), embed_dim=8, num_layers=2, repeats=2)
    assert all(isinstance(row, kv_cache.DecodeStepRow) for row in rows)
    assert [row.length for row in rows] == [2, 5, 9]
    assert all(row.seconds_cached > 0 and row.seconds_uncached > 0 for row in rows)
    assert len({row.torch_calls for row in rows}) == 1 and rows[0].torch_calls > 0
    more_layers = kv_cache.decode_step_times((2,), embed_dim=8, num_layers=4, repeats=1)
    assert more_layers[0].torch_calls > rows[0].torch_calls           # the calls are per layer


def test_decode_step_times_leaves_the_global_rng_as_it_was():
    state = torch.random.get_rng_state()
    kv_cache.decode_step_times((3,), embed_dim=8, num_layers=1, repeats=1, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("changes, error, message", [
    ({"lengths": (4, 1)}, ValueError, r"lengths\[1\] must be >= 2, got 1"),
    ({"lengths": ()}, ValueError, r"lengths must not be empty"),
    ({"lengths": 4}, TypeError, r"lengths must be a sequence of ints, got int"),
    ({"embed_dim": 10}, ValueError, r"embed_dim must be a multiple of 4"),
    ({"num_layers": 0}, ValueError, r"num_layers must be >= 1, got 0"),
    ({"repeats": 1.0}, TypeError, r"repeats must be an int, got float"),
    ({"seed": -2}, ValueError, r"seed must be >= 0, got -2"),
])
def test_decode_step_times_rejects_bad_input(changes, error, message):
    options = {"lengths": (2,), "embed_dim": 8, "num_layers": 1, "repeats": 1}
    with pytest.raises(error, match=r"^decode_step_times: " + message):
        kv_cache.decode_step_times(**{**options, **changes})


def test_print_decode_steps_prints_milliseconds(capsys):
    kv_cache.print_decode_steps([kv_cache.DecodeStepRow(length=16, seconds_cached=0.0031, seconds_uncached=0.0052,
                                                        torch_calls=698)])
    header, line = capsys.readouterr().out.splitlines()
    assert "(ms)" in header and line.split() == ["16", "3.10", "5.20", "698"]
    with pytest.raises(TypeError, match=r"^print_decode_steps: rows\[0\] must be DecodeStepRow, got KvCacheRow"):
        kv_cache.print_decode_steps(tiny_kv_cache(new_tokens=(2,)))


# --- flash -------------------------------------------------------------------------------------

def test_attention_flops_matches_a_hand_count():
    # B=2, H=3, N=5, d=8: q kᵀ and weights @ v are 5·5·8 = 200 multiply-adds each, 2 FLOPs per
    # multiply-add: 2 · 2 · 200 = 800 per head, 6 heads: 4800.
    assert flash.attention_flops(2, 3, 5, 8, causal=False, mode="forward") == 4800
    assert flash.attention_flops(2, 3, 5, 8, causal=True, mode="forward") == 2400
    assert flash.attention_flops(2, 3, 5, 8, causal=False, mode="backward") == 2.5 * 4800
    assert flash.attention_flops(2, 3, 5, 8, causal=True, mode="forward+backward") == 3.5 * 2400


@pytest.mark.parametrize("arguments, error, message", [
    ((1, 1, 0, 8, False, "forward"), ValueError, r"n must be >= 1, got 0"),
    ((1, 1.0, 4, 8, False, "forward"), TypeError, r"heads must be an int, got float"),
    ((1, 1, 4, 8, 1, "forward"), TypeError, r"causal must be a bool, got int"),
    ((1, 1, 4, 8, False, "sideways"), ValueError, r"mode must be one of \['backward', 'forward'"),
    ((1, 1, 4, 8, False, None), TypeError, r"mode must be a str, got NoneType"),
])
def test_attention_flops_rejects_bad_input(arguments, error, message):
    *sizes, causal, mode = arguments
    with pytest.raises(error, match=r"^attention_flops: " + message):
        flash.attention_flops(*sizes, causal=causal, mode=mode)


def test_cpu_rows_agree_with_sdpa_and_naive_memory_grows_as_n_squared(cpu_rows):
    assert all(isinstance(row, flash.CpuRow) for row in cpu_rows)
    assert [(r.method, r.n) for r in cpu_rows] == [(m, n) for n in (64, 128) for m in ("naive", "tiled", "sdpa")]
    assert all(r.max_difference < 1e-5 and r.seconds > 0 for r in cpu_rows)
    peak = {(r.method, r.n): r.peak_mib for r in cpu_rows}
    # Naive stores the 128 × 128 weights (64 KiB in float32) and the scores: doubling N ×4.
    assert 3.5 < peak["naive", 128] / peak["naive", 64] < 4.5
    assert peak["tiled", 128] < peak["naive", 128] / 2


@pytest.mark.parametrize("changes, error, message", [
    ({"lengths": (64, 0)}, ValueError, r"lengths\[1\] must be >= 1, got 0"),
    ({"lengths": (64, "128")}, TypeError, r"lengths\[1\] must be an int, got str"),
    ({"lengths": 64}, TypeError, r"lengths must be a sequence of ints, got int"),
    ({"lengths": ()}, ValueError, r"lengths must not be empty"),
    ({"block": 0}, ValueError, r"block must be >= 1, got 0"),
    ({"head_dim": None}, TypeError, r"head_dim must be an int, got NoneType"),
])
def test_cpu_rows_rejects_bad_input(changes, error, message):
    with pytest.raises(error, match=r"^cpu_rows: " + message):
        flash.cpu_rows(**{"lengths": (16,), "repeats": 1, **changes})


def test_print_flash_prints_cpu_rows_with_the_memory_ratio(capsys):
    rows = [flash.CpuRow(method="naive", n=128, seconds=0.01, peak_mib=8.0, max_difference=1e-7),
            flash.CpuRow(method="tiled", n=128, seconds=0.02, peak_mib=2.0, max_difference=2e-7)]
    flash.print_flash(rows)
    lines = capsys.readouterr().out.splitlines()
    assert "peak MiB" in lines[0] and lines[1].split() == ["naive", "128", "0.010", "8.0", "1.0e-07"]
    assert lines[-1] == "N=128: tiled peak memory 4.0x below naive"


def test_printers_and_plots_reject_mixed_or_missing_rows(tmp_path):
    cpu = flash.CpuRow(method="naive", n=64, seconds=1.0, peak_mib=1.0, max_difference=0.0)
    with pytest.raises(TypeError, match=r"^print_flash: rows\[1\] must be CpuRow, got GpuRow"):
        flash.print_flash([cpu, gpu_row()])
    with pytest.raises(TypeError, match=r"^print_flash: rows\[0\] must be CpuRow, got dict"):
        flash.print_flash([dataclasses.asdict(cpu)])
    with pytest.raises(ValueError, match=r"^plot_rows: rows must not be empty"):
        flash.plot_rows([], tmp_path / "x.png", title="t")
    with pytest.raises(TypeError, match=r"^plot_rows: title must be a str, got int"):
        flash.plot_rows([cpu], tmp_path / "x.png", title=3)
    with pytest.raises(TypeError, match=r"^plot_gpu_rows: rows\[1\] must be a GpuRow like rows\[0\], got DecodeRow"):
        flash_gpu.plot_gpu_rows([gpu_row(), decode_row()], tmp_path / "x.png", title="t")
    with pytest.raises(TypeError, match=r"^plot_gpu_rows: path must be a str or pathlib.Path, got int"):
        flash_gpu.plot_gpu_rows([gpu_row()], 3, title="t")
    with pytest.raises(TypeError, match=r"^print_summary: rows\[0\] must be SummaryRow, got GpuRow"):
        flash_gpu.print_summary([gpu_row()])


def test_plots_draw_cpu_gpu_and_decode_rows(cpu_rows, tmp_path):
    flash.plot_rows(cpu_rows, tmp_path / "cpu.png", title="CPU")
    gpu = [gpu_row(n=n, causal=causal, tflops=n / 10) for causal in (False, True) for n in (512, 1024)]
    gpu.append(gpu_row(method="sdpa cudnn", status="skipped", milliseconds=None, tflops=None, reason="no"))
    flash_gpu.plot_gpu_rows(gpu, tmp_path / "gpu.png", title=MACHINE.title())
    flash_gpu.plot_gpu_rows([decode_row(n_k=n, kv_gbps=n / 2) for n in (1024, 4096)], tmp_path / "decode.png",
                            title=MACHINE.title())
    assert all((tmp_path / name).stat().st_size > 1000 for name in ("cpu.png", "gpu.png", "decode.png"))


# --- the GPU benchmark's pieces, without a GPU -----------------------------------------------------

@pytest.mark.parametrize("changes, error, message", [
    ({"lengths": (512, -1)}, ValueError, r"lengths\[1\] must be >= 1, got -1"),
    ({"lengths": ()}, ValueError, r"lengths must not be empty"),
    ({"head_dims": (64, 96)}, ValueError, r"head_dims\[1\] must divide model_dim=2048, got 96"),
    ({"dtypes": (torch.float16, torch.int32)}, TypeError, r"dtypes\[1\] must be a floating torch.dtype"),
    ({"dtypes": ()}, ValueError, r"dtypes must not be empty"),
    ({"causal": (False, 1)}, TypeError, r"causal\[1\] must be a bool, got int"),
    ({"modes": ("forward", "sideways")}, ValueError, r"modes\[1\] must be one of \['forward'"),
    ({"tokens": 0}, ValueError, r"tokens must be >= 1, got 0"),
    ({"deadline": "soon"}, TypeError, r"deadline must be a time.monotonic\(\) value or None, got str"),
    ({"on_row": 3}, TypeError, r"on_row must be callable or None, got int"),
    ({"machine": "H200"}, TypeError, r"machine must be a MachineInfo or None, got str"),
    ({"device": "mps"}, ValueError, r"device must be 'cuda' or 'cpu' \(the CPU dry run\), got 'mps'"),
])
def test_gpu_rows_checks_its_input_before_looking_for_a_gpu(changes, error, message):
    with pytest.raises(error, match=r"^gpu_rows: " + message):
        flash_gpu.gpu_rows(**changes)


@pytest.mark.parametrize("changes, error, message", [
    ({"kv_lengths": ()}, ValueError, r"kv_lengths must not be empty"),
    ({"query_lengths": (1, 17)}, ValueError, r"query_lengths\[1\] must be <= 16 \(decoding\), got 17"),
    ({"heads": 32, "kv_heads": 5}, ValueError, r"heads must be a multiple of kv_heads, got heads=32, kv_heads=5"),
    ({"batch": 0}, ValueError, r"batch must be >= 1, got 0"),
    ({"seed": -1}, ValueError, r"seed must be >= 0, got -1"),
    ({"device": 0}, TypeError, r"device must be 'cuda' or 'cpu', got int"),
])
def test_decode_rows_checks_its_input(changes, error, message):
    with pytest.raises(error, match=r"^decode_rows: " + message):
        flash_gpu.decode_rows(**changes)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_gpu_rows_need_a_gpu_unless_told_to_dry_run():
    with pytest.raises(RuntimeError, match=r"^gpu_rows: needs a CUDA GPU; use device='cpu' for the dry run"):
        flash_gpu.gpu_rows()
    with pytest.raises(RuntimeError, match=r"^run_gpu_benchmark: needs a CUDA GPU"):
        flash_gpu.run_gpu_benchmark("unused")
    with pytest.raises(ValueError, match=r"^run_gpu_benchmark: max_minutes must be a positive finite number"):
        flash_gpu.run_gpu_benchmark("unused", dry_run=True, max_minutes=0)


def test_a_spent_budget_records_every_measurement_as_skipped_without_running_it():
    past = time.monotonic() - 1
    rows = flash_gpu.gpu_rows((64, 128), head_dims=(16,), dtypes=(torch.float32,), tokens=128, model_dim=32,
                              device="cpu", deadline=past, machine=MACHINE)
    assert len(rows) == 2 * 2 * 5 * 3      # N, causal, method, mode
    assert {(r.status, r.reason, r.milliseconds) for r in rows} == {("skipped", flash_gpu.TIME_BUDGET_SPENT, None)}
    decode = flash_gpu.decode_rows((256,), query_lengths=(1, 16), dtypes=(torch.float32,), batch=1, heads=2,
                                   kv_heads=1, head_dim=16, device="cpu", deadline=past, machine=MACHINE)
    assert len(decode) == 2 * 5 and {r.status for r in decode} == {"skipped"}
    assert flash_gpu.speedup_summary(rows, decode) == []


def test_speedup_summary_compares_ours_with_the_fastest_sdpa_backend():
    rows = [gpu_row(n=4096, milliseconds=2.0), gpu_row(n=4096, method="sdpa flash", milliseconds=1.0),
            gpu_row(n=4096, method="sdpa cudnn", milliseconds=0.5),
            gpu_row(n=4096, method="sdpa efficient", status="skipped", milliseconds=None, reason="no"),
            gpu_row(n=4096, mode="backward", milliseconds=1.0), gpu_row(n=4096, mode="backward", method="sdpa flash",
                                                                      milliseconds=0.8),
            gpu_row(n=512, milliseconds=0.1), gpu_row(n=512, method="sdpa flash", milliseconds=0.2),
            gpu_row(n=1024, status="skipped", milliseconds=None), gpu_row(n=1024, method="sdpa flash")]
    decode = [decode_row(milliseconds=0.02), decode_row(method="sdpa flash", milliseconds=0.03)]
    summary = {(r.kind, r.n_k, r.mode): r for r in flash_gpu.speedup_summary(rows, decode)}
    long_forward = summary["attention", 4096, "forward"]
    assert (long_forward.best_sdpa, long_forward.ratio, long_forward.target, long_forward.meets_target) == (
        "sdpa cudnn", 0.25, 1.0, False)
    long_backward = summary["attention", 4096, "backward"]
    assert long_backward.ratio == pytest.approx(0.8) and long_backward.meets_target is True
    short = summary["attention", 512, "forward"]
    assert short.ratio == pytest.approx(2.0) and short.target is None and short.meets_target is None
    assert summary["attention", 1024, "forward"].note == "ours did not run"
    assert summary["decode", 4096, "forward"].ratio == pytest.approx(1.5)
    assert summary["decode", 4096, "forward"].gpu == "NVIDIA H200"


def test_speedup_summary_rejects_what_is_not_rows():
    with pytest.raises(TypeError, match=r"^speedup_summary: rows must be a sequence of GpuRow, got int"):
        flash_gpu.speedup_summary(3)
    with pytest.raises(TypeError, match=r"^speedup_summary: rows\[0\] must be DecodeRow, got GpuRow"):
        flash_gpu.speedup_summary([], [gpu_row()])
    with pytest.raises(ValueError, match=r"^speedup_summary: long_from must be >= 1, got 0"):
        flash_gpu.speedup_summary([gpu_row()], long_from=0)


def test_print_summary_says_which_targets_were_met(capsys):
    summary = flash_gpu.speedup_summary([gpu_row(n=4096, milliseconds=2.0),
                                         gpu_row(n=4096, method="sdpa flash", milliseconds=1.0)])
    flash_gpu.print_summary(summary)
    out = capsys.readouterr().out
    assert "0.50x" in out and "MISSED" in out
    assert "forward: ours >= 1.0x SDPA's best in 0 of 1 configurations" in out


def test_do_bench_gets_only_the_arguments_its_triton_version_takes(monkeypatch):
    import triton.testing

    assert set(flash_gpu._DO_BENCH_OPTIONS) <= set(inspect.signature(triton.testing.do_bench).parameters)
    calls = []

    def triton_36_do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):
        calls.append(dict(warmup=warmup, rep=rep, return_mode=return_mode))
        fn()
        return 1.5

    def ancient_do_bench(fn, warmup=25, rep=100, grad_to_none=None, percentiles=(0.2, 0.8)):
        fn()
        return (2.5, 2.0, 3.0)     # the median first, then the percentiles

    monkeypatch.setattr(triton.testing, "do_bench", triton_36_do_bench)
    clock = flash_gpu._Clock(torch.device("cuda"))
    assert clock.milliseconds(lambda: None) == 1.5
    assert calls == [dict(warmup=5, rep=25, return_mode="median")] and "return_mode='median'" in clock.name
    monkeypatch.setattr(triton.testing, "do_bench", ancient_do_bench)
    assert flash_gpu._Clock(torch.device("cuda")).milliseconds(lambda: None) == 2.5


def test_this_torch_has_enable_gqa():
    # torch 2.5 added enable_gqa; the course pins 2.13 and the GPU image has 2.11.
    assert flash_gpu.sdpa_has_enable_gqa() is True


def test_machine_info_on_the_cpu_names_no_gpu_but_the_versions():
    info = flash_gpu.machine_info("cpu")
    assert info.gpu.startswith("none (CPU dry run") and info.torch_version == torch.__version__
    assert f"torch {torch.__version__}" in info.title() and "Triton" in info.title()


def test_cuda_facts_read_the_properties_torch_has(monkeypatch):
    """The CUDA-only lines of machine.json, with torch.cuda's answers made up (no GPU here)."""
    properties = type("Properties", (), {"total_memory": 150_000_000_000, "multi_processor_count": 132})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    facts = flash_gpu._machine_facts(torch.device("cuda"))
    assert (facts["compute_capability"], facts["memory_gib"], facts["multiprocessors"]) == ("9.0", 139.7, 132)


@pytest.mark.parametrize("text, driver", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024", "550.54.15"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build", "580.65.06"),
    ("something else", "unknown"),
])
def test_driver_version_without_nvidia_smi_comes_from_proc(monkeypatch, text, driver):
    def no_nvidia_smi(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(flash_gpu.subprocess, "run", no_nvidia_smi)
    monkeypatch.setattr(flash_gpu.pathlib.Path, "read_text", lambda self: text)
    assert flash_gpu._nvidia_driver() == driver


def test_warm_up_jobs_cover_every_specialization_and_run_in_process():
    jobs = flash_gpu._warm_up_jobs(flash_gpu.GPU_SIZES, dry_run=False)
    attention = {(j["dtype"], j["head_dim"], j["causal"]) for j in jobs if j["kind"] == "attention"}
    assert attention == {(t, d, c) for t in ("float16", "bfloat16") for d in (128, 64) for c in (False, True)}
    assert {j["dtype"] for j in jobs if j["kind"] == "decode"} == {"float16", "bfloat16"}
    assert all(j["n"] % 16 == 0 and j["device"] == "cuda" for j in jobs)   # the measured N's specialization
    sizes = {**flash_gpu.DRY_RUN, "decode": {**flash_gpu.DRY_RUN["decode"], "kv_lengths": (64,)}}
    for job in flash_gpu._warm_up_jobs(sizes, dry_run=True) + [dict(
            kind="decode", dtype="float32", head_dim=16, causal=False, n=64, heads=4, kv_heads=2, batch=1,
            device="cpu")]:
        flash_gpu._warm_up({**job, "head_dim": 16, "heads": 2 if job["kind"] == "attention" else 4})


def test_a_failing_warm_up_is_reported_not_raised():
    job = dict(kind="attention", dtype="no_such_dtype", head_dim=16, causal=False, n=16, heads=1, device="cpu")
    report = flash_gpu._warm_triton_cache([job], timeout_s=120, interpret=True)
    assert report["jobs"] == 1 and len(report["failures"]) == 1 and "exit status 1" in report["failures"][0]
    assert "no_such_dtype" in report["failures"][0]


# --- the dry run: the GPU benchmark's code, end to end on the CPU -------------------------------------

@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """``python -m attn_course.measure flash --dry-run``, once for the tests below (about 25 s)."""
    out = tmp_path_factory.mktemp("dry-run")
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "attn_course.measure", "flash", "--dry-run", "--out", str(out)],
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
        "attention", "decode", "attention", "decode", "decode", "attention"]
    assert "torch " + torch.__version__ in completed.stdout and "ours/SDPA" in completed.stdout


@pytest.mark.slow   # about 25 s: Triton's interpreter
def test_dry_run_measures_ours_naive_and_sdpa_and_skips_the_cuda_backends_with_a_reason(dry_run):
    out = dry_run[0]
    _, rows = read_csv(out / "flash-gpu.csv")
    sizes = flash_gpu.DRY_RUN
    configurations = len(sizes["dtypes"]) * len(sizes["head_dims"]) * 2 * len(sizes["lengths"])
    assert len(rows) == configurations * 5 * 3
    by_method = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row)
    for method in ("ours (Triton)", "sdpa flash", "naive"):     # CPU SDPA has a flash backend
        assert {row["status"] for row in by_method[method]} == {"ok"}, method
        assert all(float(row["tflops"]) > 0 and float(row["max_difference"]) < 2e-2 for row in by_method[method])
    for method in ("sdpa efficient", "sdpa cudnn"):             # CUDA-only: recorded, not raised
        assert {row["status"] for row in by_method[method]} == {"skipped"}
        assert all("No viable backend" in row["reason"] or "RuntimeError" in row["reason"] for row in by_method[method])
    # The most important measurements come first: the longest N in the first dtype.
    assert (rows[0]["dtype"], rows[0]["n"]) == ("float16", str(max(sizes["lengths"])))
    _, decode = read_csv(out / "flash-gpu-decode.csv")
    ours = [row for row in decode if row["method"].startswith("ours")]
    assert ours and {row["status"] for row in ours} == {"ok"} and all(float(r["kv_gbps"]) > 0 for r in ours)
    assert {row["n_q"] for row in decode} == {"1", "16"}
    _, summary = read_csv(out / "flash-gpu-summary.csv")
    judged = [row for row in summary if row["target"]]
    assert judged and all(row["best_sdpa"] == "sdpa flash" and float(row["ratio"]) > 0 for row in judged)


@pytest.mark.slow   # about 25 s: Triton's interpreter
def test_dry_run_stops_on_sigterm_and_still_writes_the_summary(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "attn_course.measure", "flash", "--dry-run", "--out",
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


# --- the self-check without pytest, and the GPU script ------------------------------------------------

def test_selfcheck_passes_a_correct_attention_and_fails_a_wrong_one():
    from attn_course.flash.triton_attention import flash_attention

    def sdpa(q, k, v, *, causal):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    options = dict(batch=1, heads=4, kv_heads=2, n_q=20, n_k=20, head_dim=16, dtype=torch.float32, causal=True,
                   backward=True, device="cpu", name="t")
    good = selfcheck.run_case(sdpa, **options)
    assert good.passed and set(good.errors) == {"output", "dq", "dk", "dv"}
    wrong = selfcheck.run_case(lambda q, k, v, causal: sdpa(q, k, v, causal=causal) * 1.01, **options)
    assert not wrong.passed
    raised = selfcheck.run_case(lambda q, k, v, causal: q[0, 0, 0, 99], **options)
    assert not raised.passed and raised.error.startswith("IndexError")
    ours = selfcheck.run_case(flash_attention, **{**options, "n_q": 5, "n_k": 40})   # bottom-right causal
    assert ours.passed, ours


def test_selfcheck_cases_cover_both_kernels_and_refuse_a_bad_device():
    found = selfcheck.cases("cuda")
    assert {c["kernel"] for c in found} == {"flash", "decode"}
    assert {c["dtype"] for c in found} == {torch.float16, torch.bfloat16}
    assert {c["head_dim"] for c in found} == {64, 128}
    assert any(c["kv_heads"] < c["heads"] and c["n_q"] < c["n_k"] and c["causal"] for c in found)
    with pytest.raises(ValueError, match=r"^cases: device must be 'cuda' or 'cpu', got 'tpu'"):
        selfcheck.cases("tpu")
    with pytest.raises(ValueError, match=r"^run_case: heads must be a multiple of kv_heads"):
        selfcheck.run_case(lambda *a, **k: None, batch=1, heads=3, kv_heads=2, n_q=1, n_k=1, head_dim=8,
                           dtype=torch.float32, causal=False, backward=False, device="cpu", name="x")


def test_gpu_check_script_parses_and_names_files_that_exist():
    script = REPO / "tools" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for test_file in ("tests/flash/test_flash_triton.py", "tests/flash/test_flash_triton_gqa_causal.py"):
        assert test_file in text and (REPO / test_file).exists()
    assert "benchmarks.selfcheck" in text and "--max-minutes" in text and "no GPU: " in text


# --- python -m attn_course.measure ---------------------------------------------------------------

def read_csv(path: pathlib.Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path) as handle:
        reader = csv.DictReader(handle)
        return reader.fieldnames, list(reader)


def test_main_kv_cache_writes_its_csv(tmp_path, capsys):
    assert main(["kv-cache", "--lengths", "2", "3", "--out", str(tmp_path)]) == 0
    columns, rows = read_csv(tmp_path / "kv-cache.csv")
    assert columns == KV_CACHE_COLUMNS and [row["new_tokens"] for row in rows] == ["2", "3"]
    out = capsys.readouterr().out
    assert out.startswith("# ") and "speed-up" in out and f"wrote {tmp_path / 'kv-cache.csv'}" in out


def test_main_flash_writes_csv_and_plot(tmp_path, capsys):
    assert main(["flash", "--lengths", "64", "128", "--out", str(tmp_path)]) == 0
    name, expected = ("flash-gpu", GPU_COLUMNS) if torch.cuda.is_available() else ("flash-cpu", CPU_COLUMNS)
    columns, rows = read_csv(tmp_path / f"{name}.csv")
    assert columns == expected and {row["n"] for row in rows} == {"64", "128"}
    assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert f"torch {torch.__version__}" in capsys.readouterr().out


def test_main_rejects_a_length_below_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["flash", "--lengths", "64", "0"])
    assert exit_info.value.code == 2 and "must be >= 1, got 0" in capsys.readouterr().err


def test_training_rows_measure_forward_and_backward_and_tiled_needs_less_memory():
    rows = flash.training_rows((128, 256), head_dim=16, block=32)
    assert [(r.method, r.n) for r in rows] == [(m, n) for n in (128, 256) for m in ("naive", "tiled")]
    assert all(isinstance(r, flash.TrainingRow) and r.max_grad_difference < 1e-5 and r.seconds > 0 for r in rows)
    peak = {(r.method, r.n): r.peak_mib for r in rows}
    assert peak["naive", 256] > 3 * peak["naive", 128]          # N² weights kept for the backward
    assert peak["tiled", 256] < 2.5 * peak["tiled", 128]        # O and the LSE only
    assert peak["naive", 256] > 2 * peak["tiled", 256]


def test_training_rows_reject_bad_input():
    with pytest.raises(ValueError, match=r"^training_rows: lengths must not be empty"):
        flash.training_rows(())
    with pytest.raises(TypeError, match=r"^print_training: "):
        flash.print_training([flash.CpuRow(method="naive", n=1, seconds=1.0, peak_mib=1.0, max_difference=0.0)])


def test_print_training_prints_the_ratio(capsys):
    flash.print_training([flash.TrainingRow("naive", 64, 0.1, 40.0, 1e-7),
                          flash.TrainingRow("tiled", 64, 0.2, 2.0, 1e-7)])
    assert "N=64: forward+backward peak memory 20.0x below naive (40.0 MiB against 2.0 MiB)" in capsys.readouterr().out


# --- python -m attn_course.measure variants -----------------------------------------------------------

VARIANT_COLUMNS = ["variant", "mode", "n", "seconds", "peak_bytes", "state_bytes", "max_difference"]
CROSSOVER_COLUMNS = ["softmax", "linear", "lengths", "time_n", "time_n_interpolated", "memory_n",
                     "memory_n_interpolated", "seconds_ratio", "memory_ratio"]
CACHE_BYTES_COLUMNS = ["variant", "elements_per_token", "bytes_per_token", "n", "bytes_at_n", "fixed", "formula"]
TINY = dict(heads=2, head_dim=16, window=8, chunk_size=16, repeats=1, budget_s=0)


def test_main_variants_writes_one_row_per_variant_and_n_and_the_crossovers(tmp_path, capsys):
    from attn_course.measure import variants

    assert main(["variants", "--quick", "--lengths", "16", "48", "--out", str(tmp_path)]) == 0
    columns, rows = read_csv(tmp_path / "variants.csv")
    assert columns == VARIANT_COLUMNS
    expected = [(name, n) for n in ("16", "48") for name in variants.PREFILL_VARIANTS + variants.DECODE_VARIANTS]
    assert [(row["variant"], row["n"]) for row in rows] == expected
    assert {row["mode"] for row in rows if row["variant"].startswith("decode")} == {"decode"}
    assert [row["peak_bytes"] for row in rows if row["variant"] == "flex eager"] == ["", ""]   # not measurable
    columns, crossovers = read_csv(tmp_path / "variants-crossover.csv")
    assert columns == CROSSOVER_COLUMNS
    assert [row["softmax"] for row in crossovers] == ["softmax sdpa", "softmax self_attention"]
    columns, cache = read_csv(tmp_path / "variants-cache-bytes.csv")
    assert columns == CACHE_BYTES_COLUMNS and [row["variant"] for row in cache] == [
        "MHA", "GQA", "MQA", "MLA", "sliding window (MHA)", "linear"]
    assert (tmp_path / "variants.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert out.startswith("# ") and "linear chunked" in out and f"wrote {tmp_path / 'variants.csv'}" in out


def test_variants_peak_memory_grows_as_n_squared_for_softmax_and_as_n_for_linear():
    """Exact bytes from peak_memory, independent of timing: N four times longer."""
    from attn_course.measure import variants

    rows = variants.measure_variants((64, 256), **TINY, variants=(
        "softmax self_attention", "sliding window mask", "linear chunked", "linear recurrent", "decode kv-cache",
        "decode rolling-cache", "decode linear state"))
    peak = {(r.variant, r.n): r.peak_bytes for r in rows}
    state = {(r.variant, r.n): r.state_bytes for r in rows}
    for name in ("softmax self_attention", "sliding window mask"):   # a mask saves no memory: still N²
        assert 15.0 < peak[name, 256] / peak[name, 64] <= 16.0, name
    for name in ("linear chunked", "linear recurrent"):
        assert 3.3 < peak[name, 256] / peak[name, 64] <= 4.0, name
    assert peak["linear chunked", 256] * 5 < peak["softmax self_attention", 256]
    # What decoding keeps: the full cache grows with N, the rolling window and the linear state do not.
    batch, heads, d, window = 1, TINY["heads"], TINY["head_dim"], TINY["window"]
    assert state["decode kv-cache", 256] == 2 * batch * heads * 256 * d * 4 == 4 * state["decode kv-cache", 64]
    assert state["decode rolling-cache", 64] == state["decode rolling-cache", 256] == 2 * heads * (window - 1) * d * 4
    assert state["decode linear state", 64] == state["decode linear state", 256] == heads * (d * d + d) * 4


def _float64_reference(q, k, v, window=None):
    """Causal (optionally windowed) softmax attention and causal linear attention, in float64, written out."""
    q, k, v = q.double(), k.double(), v.double()
    n = q.shape[-2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    visible = (j <= i) & ((j > i - window) if window else True)
    scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~visible, float("-inf"))
    softmax = torch.softmax(scores, dim=-1) @ v
    phi_q, phi_k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    weights = (phi_q @ phi_k.transpose(-2, -1)) * (j <= i)
    linear = (weights @ v) / (weights.sum(-1, keepdim=True) + 1e-6)
    return softmax, linear


def test_every_timed_variant_computes_what_its_name_says():
    from attn_course.measure import variants

    n, window = 40, 8
    q, k, v = (torch.randn(2, 3, n, 16, generator=torch.Generator().manual_seed(s)) for s in range(3))
    causal, linear = _float64_reference(q, k, v)
    local, _ = _float64_reference(q, k, v, window=window)
    expected = {"softmax sdpa": causal, "softmax self_attention": causal, "flex eager": causal,
                "sliding window mask": local, "linear chunked": linear, "linear recurrent": linear}
    functions = variants._prefill_functions(n, window, chunk_size=16)
    assert set(functions) == set(variants.PREFILL_VARIANTS)
    for name, fn in functions.items():
        assert (fn(q, k, v).double() - expected[name]).abs().max() < 1e-5, name
    # Decoding the last token: the full cache and the linear state match the last row of the
    # full computation, the rolling cache that of the windowed one.
    rows = variants._decode_rows(list(variants.DECODE_VARIANTS), q, k, v, n, window, repeats=1, budget_s=0)
    assert [r.variant for r in rows] == list(variants.DECODE_VARIANTS)
    assert all(r.max_difference < 1e-5 for r in rows)
    state = torch.zeros(2, 3, 16, 16), torch.zeros(2, 3, 16)
    for t in range(n):
        out = variants._linear_step(*state, q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1])
    assert (out.double() - linear[:, :, -1:]).abs().max() < 1e-5


def test_a_variant_that_computes_the_wrong_thing_is_refused_not_timed(monkeypatch):
    from attn_course.measure import variants

    real = variants._prefill_functions

    def with_a_wrong_window(n, window, chunk_size):
        wrong = real(n, window + 1, chunk_size)["sliding window mask"]
        return {**real(n, window, chunk_size), "sliding window mask": wrong}

    monkeypatch.setattr(variants, "_prefill_functions", with_a_wrong_window)
    monkeypatch.setattr(variants, "_best_time", lambda *args, **kwargs: pytest.fail("a wrong computation was timed"))
    with pytest.raises(RuntimeError, match=r"^measure_variants: sliding window mask differs from its reference"):
        variants.measure_variants((32,), **TINY, variants=("sliding window mask",))


def test_eager_flex_attention_warning_is_silenced_only_in_the_benchmark(monkeypatch):
    import warnings

    from torch.nn.attention import flex_attention as flex_module

    from attn_course.measure import variants

    shown = getattr(flex_module, "_WARNINGS_SHOWN", None)
    if shown is not None:   # the warning is shown once per process: forget that it was
        monkeypatch.setattr(flex_module, "_WARNINGS_SHOWN", set())
    q = torch.randn(1, 1, 16, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        variants._flex_causal(q, q, q)
    assert not [w for w in caught if variants._FLEX_WARNING in str(w.message)]


def test_crossover_is_the_first_n_from_which_linear_stays_faster_interpolated_log_log():
    from attn_course.measure.variants import VariantRow, crossover_from_rows

    def rows(linear_seconds):
        made = []
        for n, seconds in zip((100, 200, 400, 800), linear_seconds):
            made.append(VariantRow("softmax sdpa", "prefill", n, 1.0, 4 * n, 0, 0.0))
            made.append(VariantRow("linear chunked", "prefill", n, seconds, 2 * n + 100, 0, 0.0))
        return made

    # Noise at 200 (faster once, then slower again) does not count: from 400 on it stays faster.
    crossover = crossover_from_rows(rows([2.0, 0.9, 2.0, 0.5]))
    assert crossover.time_n == 800 and crossover.time_n_interpolated == pytest.approx((400 * 800) ** 0.5)
    assert crossover.memory_n == 100 and crossover.memory_n_interpolated is None   # at or below the grid
    assert "from N = 800" in crossover.describe() and "already at the smallest N measured, 100" in crossover.describe()
    never = crossover_from_rows(rows([2.0, 2.0, 2.0, 1.5]))
    assert never.time_n is None and "not faster than softmax sdpa for N <= 800" in never.describe()


def test_cache_bytes_agree_with_kv_cache_size_and_the_real_caches():
    from attn_course.measure.variants import cache_bytes_rows
    from attn_course.variants.kv_cache_size import cache_size_from_config
    from attn_course.variants.sliding_window import RollingKVCache

    n, heads, d, window = 300, 4, 8, 50
    found = {r.variant: r for r in cache_bytes_rows(n, heads=heads, head_dim=d, kv_heads=2, kv_lora_rank=32,
                                                    qk_rope_head_dim=8, window=window, bytes_per_element=2)}
    config = dict(num_hidden_layers=1, num_attention_heads=heads, head_dim=d)
    for kind, kv_heads in (("MHA", heads), ("GQA", 2), ("MQA", 1)):
        assert found[kind].bytes_at_n == cache_size_from_config({**config, "num_key_value_heads": kv_heads}).bytes(n)
    mla = cache_size_from_config({**config, "kv_lora_rank": 32, "qk_rope_head_dim": 8})
    assert found["MLA"].bytes_at_n == mla.bytes(n)
    cache = RollingKVCache(window)
    cache.append(torch.zeros(1, heads, n, d, dtype=torch.float16), torch.zeros(1, heads, n, d, dtype=torch.float16))
    assert found["sliding window (MHA)"].bytes_at_n == cache.memory_bytes and found["sliding window (MHA)"].fixed
    assert found["linear"].bytes_at_n == heads * (d * d + d) * 2 and found["linear"].fixed


def test_variants_functions_and_command_reject_bad_arguments(capsys):
    from attn_course.measure import variants

    with pytest.raises(ValueError, match=r"^measure_variants: lengths must not be empty"):
        variants.measure_variants(())
    with pytest.raises(TypeError, match=r"^measure_variants: lengths must be a sequence of ints, got str"):
        variants.measure_variants("64")
    with pytest.raises(ValueError, match=r"^measure_variants: variants\[0\] must be one of .*, got 'softmax'"):
        variants.measure_variants((16,), variants=("softmax",))
    with pytest.raises(ValueError, match=r"^measure_variants: window must be >= 1, got 0"):
        variants.measure_variants((16,), window=0)
    with pytest.raises(ValueError, match=r"^measure_variants: budget_s must be >= 0 and finite, got -1"):
        variants.measure_variants((16,), budget_s=-1)
    with pytest.raises(ValueError, match=r"^linear_crossover: lengths must hold at least two distinct N"):
        variants.linear_crossover((64, 64))
    with pytest.raises(ValueError, match=r"^linear_crossover: softmax must be one of"):
        variants.linear_crossover((16, 32), softmax="flex eager")
    with pytest.raises(TypeError, match=r"^crossover_from_rows: rows\[0\] must be VariantRow"):
        variants.crossover_from_rows([object()])
    with pytest.raises(ValueError, match=r"^cache_bytes_rows: kv_heads must be at most heads"):
        variants.cache_bytes_rows(heads=2, kv_heads=4)
    for argv, message in ((["variants", "--lengths", "0"], "must be >= 1, got 0"),
                          (["kv-cache", "--quick"], "--quick and --threads are options of variants"),
                          (["variants", "--threads", "0"], "must be >= 1, got 0"),
                          (["variants", "--dry-run"], "--dry-run and --max-minutes are options of flash")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err, argv


# --- distributed: ring attention vs Ulysses on P processes ------------------------------------------

TRAFFIC_COLUMNS = ["method", "scaling", "world_size", "n", "n_local", "batch", "heads", "head_dim", "forward_bytes",
                   "forward_formula", "total_bytes", "total_formula", "matches"]
MEMORY_COLUMNS = ["method", "world_size", "n", "n_local", "peak_bytes", "shard_bytes", "scores_bytes"]
TIME_COLUMNS = ["method", "world_size", "n", "seconds", "ratio_to_one_rank", "oversubscribed", "max_difference"]


def test_distributed_imports_without_a_cycle_and_no_underscore_names():
    subprocess.run([sys.executable, "-c", "import attn_course.measure.distributed"], check=True, capture_output=True)
    for module, names in imported_modules(BENCH_DIR / "distributed.py"):
        if module.startswith("attn_course"):
            assert not any(part.startswith("_") for part in module.split(".")), module
            assert all(not imported.startswith("_") or imported == "_validate" for imported in names), names


def test_distributed_formulas_by_hand():
    from attn_course.measure import distributed

    b, h, n, d = 2, 8, 64, 16
    for p in (2, 4, 8):
        shard = b * h * (n // p) * d * 4                                  # one float32 [B, H, N/P, d] shard
        assert distributed.formula_bytes("ring", b, h, n, d, p) == 2 * (p - 1) * shard
        assert distributed.formula_bytes("ring zigzag", b, h, n, d, p, backward=True) == (
            2 * (p - 1) + 2 * (p - 1) + 2 * p) * shard                     # K, V forward; K, V and dK, dV backward
        assert distributed.formula_bytes("ulysses", b, h, n, d, p) * p == 4 * (p - 1) * shard
        assert distributed.formula_bytes("ulysses", b, h, n, d, p, backward=True) * p == 8 * (p - 1) * shard
        ratio = distributed.formula_bytes("ring", b, h, n, d, p) / distributed.formula_bytes("ulysses", b, h, n, d, p)
        assert ratio == p / 2
    assert [distributed.formula_bytes(m, b, h, n, d, 1, backward=True) for m in distributed.METHODS] == [0, 0, 0]
    # N and P grown together: Ulysses' bytes per rank approach a constant, ring's grow with P.
    ulysses = [distributed.formula_bytes("ulysses", 1, 8, 16 * p, 16, p) for p in (2, 4, 8)]
    ring = [distributed.formula_bytes("ring", 1, 8, 16 * p, 16, p) for p in (2, 4, 8)]
    assert ulysses == [16384, 24576, 28672] and ring == [16384, 49152, 114688]   # shard: 8192 B


def test_distributed_measured_bytes_equal_the_formulas_exactly():
    from attn_course.measure import distributed

    rows = distributed.measure_traffic((1, 2), n=8, n_per_rank=4, heads=2, head_dim=4)
    assert [(r.scaling, r.world_size, r.method) for r in rows] == [
        (scaling, p, m) for scaling in ("N fixed", "N ∝ P") for p in (1, 2) for m in distributed.METHODS]
    assert all(r.matches for r in rows)
    for r in rows:
        sizes = (r.batch, r.heads, r.n, r.head_dim, r.world_size)
        assert (r.forward_bytes, r.total_bytes) == (distributed.formula_bytes(r.method, *sizes),
                                                    distributed.formula_bytes(r.method, *sizes, backward=True))
    shard = 1 * 2 * 4 * 4 * 4                                                # B·H·(N/P)·d·4 at N=8, P=2
    two = {r.method: (r.forward_bytes, r.total_bytes) for r in rows if r.world_size == 2 and r.scaling == "N fixed"}
    assert two == {"ulysses": (2 * shard, 4 * shard), "ring": (2 * shard, 8 * shard),
                   "ring zigzag": (2 * shard, 8 * shard)}


def test_distributed_functions_and_command_reject_bad_arguments(capsys):
    from attn_course.measure import distributed

    with pytest.raises(ValueError, match=r"^measure_traffic: H=3 must be divisible by P=2 for ulysses"):
        distributed.measure_traffic((2,), n=8, n_per_rank=4, heads=3)
    with pytest.raises(ValueError, match=r"^measure_rank_memory: N=6 must be divisible by 4 for ring zigzag over P=2"):
        distributed.measure_rank_memory((2,), (6,), heads=2)
    with pytest.raises(ValueError, match=r"^measure_time: methods\[0\] must be one of .*, got 'megatron'"):
        distributed.measure_time((1,), methods=("megatron",))
    with pytest.raises(ValueError, match=r"^measure_distributed: world_sizes must not be empty"):
        distributed.measure_distributed(())
    with pytest.raises(ValueError, match=r"^measure_time: repeats must be >= 1, got 0"):
        distributed.measure_time((1,), repeats=0)
    with pytest.raises(TypeError, match=r"^measure_traffic: causal must be a bool, got int"):
        distributed.measure_traffic((1,), causal=1)
    with pytest.raises(ValueError, match=r"^formula_bytes: n=6 must be divisible by 4 for ring zigzag over 2 ranks"):
        distributed.formula_bytes("ring zigzag", 1, 2, 6, 4, 2)
    with pytest.raises(TypeError, match=r"^print_traffic: rows\[0\] must be TrafficRow"):
        distributed.print_traffic([object()])
    for argv, message in ((["distributed", "--threads", "2"], "--threads is an option of variants"),
                          (["kv-cache", "--quick"], "--quick also of distributed")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err, argv


@pytest.mark.slow
def test_main_distributed_quick_writes_the_csvs_and_ring_memory_follows_n_over_p(tmp_path, capsys):
    """Seven processes in three launches; every rank's first peak_memory call imports torch._dynamo (seconds)."""
    assert main(["distributed", "--quick", "--out", str(tmp_path)]) == 0
    columns, traffic = read_csv(tmp_path / "distributed-traffic.csv")
    assert columns == TRAFFIC_COLUMNS and {row["matches"] for row in traffic} == {"True"}
    assert [int(row["world_size"]) for row in traffic] == [p for _ in range(2) for p in (1, 2, 4) for _ in range(3)]
    columns, memory = read_csv(tmp_path / "distributed-memory.csv")
    assert columns == MEMORY_COLUMNS
    peak = {(row["method"], int(row["world_size"]), int(row["n"])): int(row["peak_bytes"]) for row in memory}
    # N/P fixed at 32 (N=32 on one rank, N=64 on two): ring's per-rank memory stays about the same,
    # Ulysses' grows with N (its ordinary attention holds [B, H/P, N, N] scores).
    assert peak["ring", 2, 64] / peak["ring", 1, 32] < 1.5 < peak["ulysses", 2, 64] / peak["ulysses", 1, 32]
    for method in ("ring", "ring zigzag", "ulysses"):                      # N fixed: more ranks, less each
        assert peak[method, 4, 64] < peak[method, 2, 64] < peak[method, 1, 64], method
    columns, timing = read_csv(tmp_path / "distributed-time.csv")
    assert columns == TIME_COLUMNS and all(float(row["max_difference"]) < 1e-5 for row in timing)
    assert [row["ratio_to_one_rank"] for row in timing if row["world_size"] == "1"] == ["1.0"] * 3
    assert (tmp_path / "distributed.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "oversubscribed" in out or (os.cpu_count() or 1) >= 4
    assert f"wrote {tmp_path / 'distributed-traffic.csv'}" in out
