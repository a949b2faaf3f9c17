"""Whether the browser tests can run here: Chromium's path and flags, and the skip (or, in CI, the failure)
when it is missing; and waiting for a notebook's kernel in JupyterLab. Used by conftest.py's ``chromium`` and
``browser`` fixtures and by the browser tests (tests/course/test_browser.py, tests/hub/test_hub.py)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable

import pytest

from helpers import in_ci

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_VARIABLE = "ATTN_COURSE_CHROMIUM"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = int(os.environ.get("BROWSER_TIMEOUT_MS", "180000"))


def chromium_executable() -> str:
    """``$ATTN_COURSE_CHROMIUM`` if set, else ``chromium`` on PATH, else Debian's path."""
    return os.environ.get(CHROMIUM_VARIABLE) or shutil.which("chromium") or "/usr/bin/chromium"


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, with how to fix it; ``None`` when they can."""
    chromium = chromium_executable()
    if not (os.path.isfile(chromium) and os.access(chromium, os.X_OK)):
        return (f"no Chromium at {chromium}; enable them with `apt-get install chromium` "
                f"(or set {CHROMIUM_VARIABLE} to a Chromium executable)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed; enable them with `make test` (it installs the test extra)"
    return None


def require_browser() -> str:
    """Chromium's path when the browser tests can run; otherwise skip them, or fail in CI."""
    reason = missing_browser()
    if reason is None:
        return chromium_executable()
    if in_ci():
        pytest.fail(f"browser tests cannot run in CI: {reason} (.ci/run installs it)", pytrace=False)
    # conftest.py reports every skip that starts this way on one summary line.
    pytest.skip(f"browser tests skipped: {reason}")


# JupyterLab's execution indicator says "idle" before any kernel exists, too: a kernel is ready when the
# toolbar names one and the indicator says idle.
_KERNEL_IDLE = """() => {
    const name = document.querySelector('.jp-Toolbar-kernelName')?.textContent.trim();
    const status = document.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status;
    return name && name !== 'No Kernel' && status === 'idle';
}"""


def wait_for_kernel_idle(page) -> None:
    """Wait until the notebook open in ``page`` (Playwright's Page, in JupyterLab) has a kernel that is
    idle, or for JupyterLab to ask which kernel to start (a notebook without kernelspec): then accept
    its offer, this environment's python3, and wait again."""
    page.wait_for_selector(".jp-Notebook .jp-Cell")
    page.wait_for_function(f"() => ({_KERNEL_IDLE})() || document.querySelector('.jp-Dialog') !== null")
    select = page.locator(".jp-Dialog .jp-Dialog-button", has_text=re.compile(r"^Select$"))
    if select.count():
        select.click()
    page.wait_for_function(_KERNEL_IDLE)


def wait_until_serving(url: str, server: subprocess.Popen, *, seconds: float, poll: float,
                       problem: Callable[[], str]) -> None:
    """Return once ``url`` answers; raise RuntimeError(``problem()``) if ``server`` exits first or
    ``seconds`` pass (JupyterLab's and JupyterHub's start, for the browser tests)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(problem()) from None
            time.sleep(poll)


def stop_server(server: subprocess.Popen, seconds: float = 20) -> None:
    """Terminate ``server`` (JupyterLab, JupyterHub) and wait for it; kill it if it is still running
    after ``seconds``."""
    server.terminate()
    try:
        server.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
