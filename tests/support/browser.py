"""Whether the browser tests can run here: Chromium's path and flags, and the skip (or, in CI, the failure)
when it is missing. Used by conftest.py's ``chromium`` and ``browser`` fixtures and by the browser tests."""

from __future__ import annotations

import os
import pathlib
import shutil

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
        return "Playwright is not installed; enable them with `pip install -e '.[test]'` (or `make venv`)"
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


