"""Shared test setup: Triton's mode, a headless matplotlib, repeatable hypothesis runs, and
one summary line for the browser tests when they skip."""

import matplotlib
import pytest

# Before anything imports Triton (transformers does): without a GPU, attn_course selects
# Triton's interpreter, which Triton only honours at its own import.
import attn_course  # noqa: F401, I001

# Before anything imports pyplot: tests draw figures without a display.
matplotlib.use("Agg")

from hypothesis import settings  # noqa: E402

# No example database: hypothesis would otherwise write .hypothesis/ into the checkout.
# The property tests' budget is helpers.FAST.
settings.register_profile("attn_course", database=None)
settings.load_profile("attn_course")


BROWSER_SKIP = "browser tests skipped: "   # the reason tests/test_browser.py's require_browser() gives


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Report the browser tests' skip at their file rather than at each test's line, so that
    ``-ra`` folds them into one line ("SKIPPED [9] tests/test_browser.py: browser tests
    skipped: no Chromium at ...; enable them with ...") instead of one per test function."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        path, _, reason = report.longrepr
        if reason.removeprefix("Skipped: ").startswith(BROWSER_SKIP):
            report.longrepr = (path, None, reason)
    return report
