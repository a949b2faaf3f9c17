"""tools/gpu_check.sh, the prepared run for a lent GPU machine: it parses and names files and modules that exist."""

from __future__ import annotations

import pathlib
import subprocess

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
