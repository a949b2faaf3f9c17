"""Shared test setup: Triton's interpreter without a GPU, a headless matplotlib, repeatable hypothesis runs, one
summary line for the browser and sandbox tests when they skip, and the assignments built once."""

import fcntl
import os
import pathlib
import shutil
import sys

import matplotlib
import pytest
import torch

# Without a CUDA GPU the Triton kernels' tests run on Triton's interpreter (CPU tensors). Triton
# reads TRITON_INTERPRET only when it is first imported (transformers and the flash modules
# import it), so it is set here, before any test module is collected. Importing attn_course sets
# nothing. setdefault: a run that chose a mode itself keeps it. Chapters run by nbval from this
# process inherit it too.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Before anything imports pyplot: tests draw figures without a display.
matplotlib.use("Agg")

from hypothesis import settings  # noqa: E402

# No example database: hypothesis would otherwise write .hypothesis/ into the checkout.
# The property tests' budget is helpers.FAST.
settings.register_profile("attn_course", database=None)
settings.load_profile("attn_course")


BROWSER_SKIP = "browser tests skipped: "   # the reason tests/support/browser.py's require_browser() gives
FOLDED_SKIPS = (BROWSER_SKIP, "sandbox tests skipped: ")   # and helpers.require_sandbox()'s
HAS_OTTER = (pathlib.Path(sys.executable).parent / "otter").exists()


@pytest.fixture(scope="session")
def dist(tmp_path_factory, request) -> pathlib.Path:
    """Every chapter's student notebook and autograder (tools/assign.py), built once per run.

    Under pytest-xdist a session fixture runs once per worker: so the first worker that needs it
    builds it in the run's shared temporary folder, under a lock, and the others wait and reuse it
    (the tests only read it)."""
    from helpers import run_tool

    if not HAS_OTTER:
        pytest.skip("otter-grader is not installed")
    if not hasattr(request.config, "workerinput"):                  # one process: its own folder
        out = tmp_path_factory.mktemp("dist")
        run_tool("tools/assign.py", "--no-run-tests", "--out", str(out))
        return out
    shared = tmp_path_factory.getbasetemp().parent                   # the same for every worker of this run
    out, built = shared / "dist", shared / "dist.built"
    with open(shared / "dist.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)                             # released when the file closes
        if not built.exists():
            shutil.rmtree(out, ignore_errors=True)                   # a worker that failed half-way
            run_tool("tools/assign.py", "--no-run-tests", "--out", str(out))
            built.touch()
    return out


@pytest.fixture(scope="module")
def chromium() -> str:
    """Chromium's path (tests/support/browser.py's require_browser: skip without it, fail in CI)."""
    from support.browser import require_browser

    return require_browser()


@pytest.fixture(scope="module")
def browser(chromium):
    """Chromium driven by Playwright, launched once per test file that asks for it."""
    from playwright.sync_api import sync_playwright

    from support.browser import CHROMIUM_FLAGS

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Report the browser tests' skip at their file rather than at each test's line, so that
    ``-ra`` folds them into one line ("SKIPPED [9] tests/course/test_browser.py: browser tests
    skipped: no Chromium at ...; enable them with ...") instead of one per test function."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        path, _, reason = report.longrepr
        if reason.removeprefix("Skipped: ").startswith(FOLDED_SKIPS):
            report.longrepr = (path, None, reason)
    return report


#: The test files that take longest, longest first (a full run's --durations, summed per file). Under pytest-xdist's
#: --dist loadfile each file is one piece of work, and the Makefile's --no-loadscope-reorder keeps this order
#: (xdist's default hands out the files with the most tests first, which left the hub test, one test of over a
#: minute, to end the run alone on one core while the other waited): the longest start first and the many short
#: files fill in around them. Everything else keeps its collection order.
LONG_FILES_FIRST = (
    # The two classes graded in sandboxes do not start together: a run that began with both had chapter 10's
    # solutions stopped as idle (its processes got next to no CPU for 60 s).
    "tests/grading/test_assignments.py", "tests/checks/test_nothing_answers_an_exercise.py",
    "tests/grading/test_sandbox_grading.py", "tests/course/test_browser.py", "tests/hub/test_hub.py",
    "tests/grading/test_grader_resources.py", "tests/grading/test_grading_across_machines.py",
    "tests/course/test_site.py", "tests/measure/test_measure_timing.py", "notebooks/08_transformer_bert.ipynb",
    "notebooks/03_multi_head.ipynb", "notebooks/10_distributed.ipynb", "notebooks/04_causal.ipynb",
    "notebooks/09_modern_variants.ipynb",
)


def pytest_collection_modifyitems(config, items):
    root = pathlib.Path(config.rootpath)
    rank = {root / name: place for place, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path, len(LONG_FILES_FIRST)))
