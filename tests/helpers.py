"""Small test helpers shared by several test files (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch
from hypothesis import settings

# The property tests' budget: enough examples to find a broken case, few enough for `make unit`.
# No deadline: the first example pays for imports and lazy initialisation.
FAST = settings(max_examples=25, deadline=None)


def close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-5) -> None:
    """Assert ``actual`` equals ``expected`` to ``tol``, absolute and relative, with the same
    shape, dtype and device (``torch.testing.assert_close``: its message names the worst entry)."""
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal values drawn in float64 from a fixed seed, then cast to ``dtype``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


def random_mask(*shape: int, p: float = 0.6, seed: int = 0) -> torch.Tensor:
    """Boolean mask, True (may attend) with probability ``p``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=generator) < p


ROOT = pathlib.Path(__file__).resolve().parents[1]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def run_tool(*args: str) -> str:
    """Run ``python ARGS`` (a tool of tools/) from the checkout; return its output, or fail with it."""
    completed = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout


SANDBOX_SKIP = "sandbox tests skipped: "   # conftest.py folds these skips into one summary line


def sandbox_installed() -> bool:
    """Whether bubblewrap is installed: then the sandbox must work, and a test that finds it
    broken fails rather than skips (or falls back to grading without it)."""
    from attn_course_grading.sandbox import bubblewrap

    return bubblewrap() is not None or in_ci()


def require_sandbox() -> None:
    """Skip a test that needs bubblewrap where it is not installed (fail in CI, which installs it,
    and wherever it is installed but cannot start a sandbox)."""
    from attn_course_grading.sandbox import INSTALL_HINT, sandbox_problem

    if not sandbox_installed():
        pytest.skip(SANDBOX_SKIP + "bubblewrap (bwrap) is not installed. " + INSTALL_HINT)
    problem = sandbox_problem()
    if problem is not None:
        where = "in CI (.ci/run installs bubblewrap)" if in_ci() else "although bubblewrap is installed"
        pytest.fail(f"sandbox tests cannot run {where}: {problem}", pytrace=False)


def run_aot_shards(*arguments: str, shards: int) -> list[str]:
    """``python -m gpu_tools.aot ARGUMENTS SHARD/SHARDS`` for every shard at once, in processes
    of their own (a process has one Triton mode: these compile for real GPUs, ``TRITON_INTERPRET=0``);
    their output lines, in shard order. Fails with their errors when one did not finish: exit 1 means
    "compiled, but a case is too big or spills", which the caller's assertions report."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1", "OMP_NUM_THREADS": "1"}
    processes = [subprocess.Popen([sys.executable, "-m", "gpu_tools.aot", *arguments, f"{shard}/{shards}"],
                                  env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for shard in range(shards)]
    lines, errors = [], []
    for process in processes:
        stdout, stderr = process.communicate(timeout=900)
        lines += stdout.splitlines()
        if process.returncode not in (0, 1):
            errors.append(stderr[-3000:])
    assert not errors, "\n".join(errors)
    return lines


#: A made-up one-question chapter for grading a class quickly: ``double(x)``, 2 points.
TINY_CHAPTER_TEST = '''from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = 2

@test_case(points=None, hidden=False)
def test_double(double):
    assert double(2) == 4
'''
TINY_ANSWER = "def double(x):\n    return 2 * x"


def notebook_json(*sources: str, cell_type: str = "code", version: int = 4) -> str:
    """A notebook's JSON with one cell per source (``version``: the nbformat it claims)."""
    import json

    cells = [{"cell_type": cell_type, "id": f"c{number}", "source": source, "metadata": {}, "outputs": [],
              "execution_count": None} for number, source in enumerate(sources)]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": version, "nbformat_minor": 5})


def tiny_chapter(autograders: pathlib.Path, chapter: str = "00_tiny") -> pathlib.Path:
    """Write the tiny chapter's autograder zip and solution notebook into ``autograders``; return the solution."""
    import zipfile

    autograders.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(autograders / f"{chapter}.zip", "w") as archive:
        archive.writestr("tests/q1.py", TINY_CHAPTER_TEST)
    solution = autograders / f"{chapter}.ipynb"
    solution.write_text(notebook_json("def double(x):\n    # BEGIN SOLUTION\n    return 2 * x\n    # END SOLUTION"))
    return solution
