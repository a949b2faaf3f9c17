"""attn_course.bench: the benchmarks run, report typed rows and write their CSVs (no timing assertions)."""

from __future__ import annotations

import ast
import csv
import dataclasses
import pathlib
import subprocess
import sys

import pytest
import torch

import attn_course.bench
from attn_course.bench import flash, kv_cache, timing
from attn_course.bench.__main__ import main
from attn_course.language_model import LanguageModelConfig, TinyLanguageModel

BENCH_DIR = pathlib.Path(attn_course.bench.__file__).parent
CPU_COLUMNS = ["method", "n", "seconds", "peak_mib", "max_difference"]
GPU_COLUMNS = ["method", "dtype", "head_dim", "causal", "n", "mode", "milliseconds", "tflops"]
KV_CACHE_COLUMNS = ["new_tokens", "positions_without", "positions_with", "seconds_without", "seconds_with", "speedup"]


def gpu_row(**changes) -> flash.GpuRow:
    """A made-up GpuRow (these tests run without a GPU), with ``changes`` applied."""
    values = dict(method="ours (Triton)", dtype="float16", head_dim=64, causal=False, n=512,
                  mode="forward", milliseconds=0.5, tflops=123.4)
    return flash.GpuRow(**{**values, **changes})


@pytest.fixture(scope="module")
def cpu_rows():
    return flash.cpu_rows(lengths=(64, 128), head_dim=16, block=64, repeats=1)


# --- the package and its imports -------------------------------------------------------------

def test_package_reexports_what_chapter_04_imports():
    assert attn_course.bench.kv_cache_speedup is kv_cache.kv_cache_speedup
    assert attn_course.bench.best_time is timing.best_time


@pytest.mark.parametrize("code", ["import attn_course.bench.flash",
                                  "import attn_course.flash; import attn_course.bench"])
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


def test_timing_is_a_leaf_module():
    course = {module for module, _ in imported_modules(BENCH_DIR / "timing.py") if module.startswith("attn_course")}
    assert course == {"attn_course"}   # only `from attn_course import _validate`
    assert ("attn_course", ["_validate"]) in imported_modules(BENCH_DIR / "timing.py")


@pytest.mark.parametrize("name", ["__init__.py", "__main__.py", "timing.py", "kv_cache.py", "flash.py"])
def test_no_underscore_names_imported_from_other_modules(name):
    for module, names in imported_modules(BENCH_DIR / name):
        if module.startswith("attn_course"):
            assert not any(part.startswith("_") for part in module.split(".")), module
            assert all(not imported.startswith("_") or imported == "_validate" for imported in names), names


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
        assert [(row["causal"], row["tflops"]) for row in reader] == [("False", "123.4"), ("True", "99.0")]


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


@pytest.mark.parametrize("changes, error, message", [
    ({"lengths": (512, -1)}, ValueError, r"lengths\[1\] must be >= 1, got -1"),
    ({"head_dims": (64, 96)}, ValueError, r"head_dims\[1\] must divide model_dim=2048, got 96"),
    ({"dtypes": (torch.float16, torch.int32)}, TypeError, r"dtypes\[1\] must be a floating torch.dtype"),
    ({"tokens": 0}, ValueError, r"tokens must be >= 1, got 0"),
])
def test_gpu_rows_checks_its_input_before_looking_for_a_gpu(changes, error, message):
    with pytest.raises(error, match=r"^gpu_rows: " + message):
        flash.gpu_rows(**changes)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_gpu_rows_need_a_gpu():
    with pytest.raises(RuntimeError, match=r"^gpu_rows: needs a CUDA GPU"):
        flash.gpu_rows()


def test_print_flash_prints_cpu_rows_with_the_memory_ratio(capsys):
    rows = [flash.CpuRow(method="naive", n=128, seconds=0.01, peak_mib=8.0, max_difference=1e-7),
            flash.CpuRow(method="tiled", n=128, seconds=0.02, peak_mib=2.0, max_difference=2e-7)]
    flash.print_flash(rows)
    lines = capsys.readouterr().out.splitlines()
    assert "peak MiB" in lines[0] and lines[1].split() == ["naive", "128", "0.010", "8.0", "1.0e-07"]
    assert lines[-1] == "N=128: tiled peak memory 4.0x below naive"


def test_print_flash_prints_gpu_rows(capsys):
    flash.print_flash([gpu_row(), gpu_row(causal=True, mode="forward+backward", tflops=45.6)])
    lines = capsys.readouterr().out.splitlines()
    assert "TFLOP/s" in lines[0] and len(lines) == 3
    assert lines[2].split() == ["ours", "(Triton)", "float16", "64", "True", "512", "forward+backward", "45.6"]


def test_printers_and_plot_reject_mixed_or_missing_rows(tmp_path):
    cpu = flash.CpuRow(method="naive", n=64, seconds=1.0, peak_mib=1.0, max_difference=0.0)
    with pytest.raises(TypeError, match=r"^print_flash: rows\[1\] must be a CpuRow like rows\[0\], got GpuRow"):
        flash.print_flash([cpu, gpu_row()])
    with pytest.raises(TypeError, match=r"^print_flash: rows\[0\] must be CpuRow or GpuRow, got dict"):
        flash.print_flash([dataclasses.asdict(cpu)])
    with pytest.raises(ValueError, match=r"^plot_rows: rows must not be empty"):
        flash.plot_rows([], tmp_path / "x.png", title="t")
    with pytest.raises(TypeError, match=r"^plot_rows: title must be a str, got int"):
        flash.plot_rows([cpu], tmp_path / "x.png", title=3)


def test_plot_rows_draws_both_row_types(cpu_rows, tmp_path):
    flash.plot_rows(cpu_rows, tmp_path / "cpu.png", title="CPU")
    gpu = [gpu_row(n=n, causal=causal, tflops=n / 10) for causal in (False, True) for n in (512, 1024)]
    flash.plot_rows(gpu, tmp_path / "gpu.png", title="GPU")
    assert (tmp_path / "cpu.png").stat().st_size > 1000 and (tmp_path / "gpu.png").stat().st_size > 1000


# --- python -m attn_course.bench ---------------------------------------------------------------

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
