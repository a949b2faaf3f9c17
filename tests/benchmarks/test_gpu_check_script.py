"""tools/gpu_check.sh, the prepared run for a lent GPU machine: it parses and names files and modules that exist;
step 1 says whether Triton can build its kernel launchers (a C compiler, Python.h) and which is missing
(issue 42); a benchmark step that wrote every row is no failure when ``timeout`` ends it."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

import benchmarks

REPO = pathlib.Path(benchmarks.__file__).parent.parent


def test_gpu_check_script_parses_and_names_files_that_exist():
    script = REPO / "tools" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for test_file in ("tests/flash/test_flash_triton.py", "tests/flash/test_flash_triton_gqa_causal.py"):
        assert test_file in text and (REPO / test_file).exists()
    assert "benchmarks.selfcheck" in text and "--max-minutes" in text and "no GPU: " in text
    for module in ("benchmarks flash", "benchmarks.selfcheck"):      # python -m MODULE, as the script runs them
        assert f"-m {module}" in text
    assert (REPO / "benchmarks" / "__main__.py").exists() and (REPO / "benchmarks" / "selfcheck.py").exists()


def run_facts(tmp_path, **environ):
    """``PROFILE=facts bash tools/gpu_check.sh`` (step 1 only, a second or two) with this Python."""
    env = {**os.environ, "PROFILE": "facts", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), **environ}
    if "CC" not in environ:
        env.pop("CC", None)
    return subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=120)


def path_without_a_compiler(folder: pathlib.Path) -> str:
    """A PATH of one folder that links every command of this PATH but the C compilers Triton looks for."""
    folder.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            if re.fullmatch(r"(.*-)?(gcc|clang|cc|c89|c99)(-[0-9.]+)?", name) or (folder / name).exists():
                continue
            (folder / name).symlink_to(os.path.join(directory, name))
    return str(folder)


@pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("clang"))
                    or not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")),
                    reason="no C compiler or no Python headers on this machine")
def test_step_one_checks_for_a_c_compiler_and_the_python_headers(tmp_path):
    done = run_facts(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(line for line in done.stdout.splitlines() if "C compiler and Python headers" in line)
    assert os.path.realpath(shutil.which("gcc") or shutil.which("clang")) == os.path.realpath(
        line.split("C compiler ")[2].split(" (")[0])
    include = line.split("Python.h in ")[1].split(", a test compile")[0]
    assert os.path.isfile(os.path.join(include, "Python.h")) and line.endswith("a test compile: ok")
    assert "gpu_tools.launcher_check" in (REPO / "tools" / "gpu_check.sh").read_text()


def test_without_a_compiler_on_path_step_one_says_which_is_missing(tmp_path):
    path = path_without_a_compiler(tmp_path / "bin")
    assert shutil.which("gcc", path=path) is None and shutil.which("clang", path=path) is None
    assert shutil.which("bash", path=path) and shutil.which("tee", path=path)
    done = run_facts(tmp_path, PATH=path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "launcher toolchain MISSING" in done.stdout
    assert "C compiler: no $CC, and neither gcc nor clang on PATH" in done.stdout
    assert "Python headers: no Python.h" not in done.stdout      # they are there: only the compiler is named


def test_a_cc_that_is_not_a_program_is_named(tmp_path):
    from gpu_tools import launcher_check

    found = launcher_check.launcher_toolchain({"PATH": os.environ["PATH"], "CC": str(tmp_path / "no-such-cc")})
    assert found["compiler"] is None
    assert found["missing"][0] == f"C compiler: $CC={tmp_path / 'no-such-cc'} is not an executable"


def test_missing_python_headers_are_named(tmp_path, monkeypatch):
    from gpu_tools import launcher_check

    monkeypatch.setattr(launcher_check.sysconfig, "get_paths", lambda scheme=None: {"include": str(tmp_path)})
    found = launcher_check.launcher_toolchain({"PATH": os.environ["PATH"]})
    assert found["python_h"] is False and found["test_compile"] == "not tried"
    assert [line for line in found["missing"] if line.startswith("Python headers")] == [
        f"Python headers: no Python.h in {tmp_path} (install python{sys.version_info.major}."
        f"{sys.version_info.minor}-dev)"]
    with pytest.raises(TypeError, match=r"^launcher_toolchain: environ must be a dict or None, got list"):
        launcher_check.launcher_toolchain([])


@pytest.mark.parametrize(("stopped", "returncode", "failed"), [
    ("complete", 0, False), ("complete", 124, False), ("max_minutes", 124, False), ("max_minutes", 137, False),
    ("running", 124, True), ("SIGTERM", 124, True), ("complete", 1, True), (None, 124, True)])
def test_a_benchmark_step_that_wrote_every_row_is_not_failed_by_the_timeout(tmp_path, stopped, returncode, failed):
    from gpu_tools.bench_verdict import bench_verdict

    if stopped is not None:                               # as the benchmark writes it (json.dumps, indent=2)
        (tmp_path / "machine.json").write_text(json.dumps({"dry_run": False, "stopped": stopped}, indent=2))
    found, line = bench_verdict(returncode, tmp_path)
    assert found is failed, line
    assert line.startswith("benchmark: ") and (returncode == 0 or f"exit status {returncode}" in line)
    assert ("not a failure" in line) is (not failed and returncode != 0)


def test_the_script_asks_for_the_benchmark_verdict_and_greps_the_rows_verdicts():
    text = (REPO / "tools" / "gpu_check.sh").read_text()
    assert '-m gpu_tools.bench_verdict "$rc" "$out"' in text and "MISSES [A-Za-z0-9+]+ *$" in text
