"""The widgets in a real browser: JupyterLab from this environment, driven by Playwright.

Chromium is Debian's (``/usr/bin/chromium``, installed by ``.ci/run``); Playwright never
downloads a browser. Without Chromium or Playwright the tests skip, except in CI
(``CI=true``), where they fail. The notebooks are copied to a temporary folder first, so
JupyterLab's autosave can never touch the committed ones. Screenshots go to
``test-artifacts/``.
"""

from __future__ import annotations

import math
import os
import pathlib
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from attn_course.toy_sentence import bank_sentence

ROOT = pathlib.Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing(reason: str):
    if IN_CI:
        pytest.fail(f"{reason}: in CI the browser tests must run (.ci/run installs chromium)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a free loopback port with a random token: yields its base URL."""
    if not pathlib.Path(CHROMIUM).exists():
        _missing(f"no Chromium at {CHROMIUM}")
    root = tmp_path_factory.mktemp("lab")
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        shutil.copy(notebook, root)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_PATH": str(pathlib.Path(sys.prefix) / "share" / "jupyter"),
           "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"}
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url=None",
               "--LabApp.extension_manager=readonly"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        command.append("--allow-root")
    log = open(tmp_path_factory.mktemp("lab-log") / "jupyterlab.log", "w")
    server = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start; see {log.name}") from None
                time.sleep(0.5)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


def open_and_run_all(browser, lab, notebook: str, widget_selector: str):
    """Open ``notebook`` in JupyterLab, run every cell, wait for the widget; return the page."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(int(os.environ.get("BROWSER_TIMEOUT_MS", "180000")))
    try:
        # A workspace of its own, reset: no tab left open by another test.
        workspace = pathlib.Path(notebook).stem.replace("_", "-")
        page.goto(f"{base}/lab/workspaces/{workspace}/tree/{notebook}?reset&token={token}")
        page.wait_for_selector(".jp-Notebook .jp-Cell")
        # JupyterLab may ask which kernel to start (the notebook names python3; this
        # environment's python3 is the one offered): accept it.
        select = page.locator(".jp-Dialog .jp-Dialog-button", has_text=re.compile(r"^Select$"))
        try:
            select.wait_for(timeout=15_000)
            select.click()
        except PlaywrightTimeout:
            pass
        # The kernel must be up before "Run All Cells"; the toolbar's indicator says so.
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        page.wait_for_selector(f"{widget_selector} .widget-html-content", state="attached")
        # Every cell has run when no prompt shows [*] and the kernel is idle again.
        page.wait_for_function(
            """() => {
                const prompts = [...document.querySelectorAll('.jp-InputArea-prompt')];
                const busy = document.querySelector(".jp-Notebook-ExecutionIndicator[data-status='busy']");
                return !busy && prompts.length > 0 && prompts.every(p => !p.textContent.includes('*'));
            }"""
        )
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{pathlib.Path(notebook).stem}-failure.png"))
        raise
    assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                        has_text="Traceback").count() == 0
    widget = page.locator(widget_selector).first
    widget.scroll_into_view_if_needed()
    return page, widget


def displayed_weights(widget) -> list[float]:
    """The weights in the widget's table (retried while the browser is re-rendering it)."""
    for _ in range(50):
        texts = widget.locator(".attention-weights .weight").all_text_contents()
        if texts and all(text.strip() for text in texts):
            return [float(text) for text in texts]
        time.sleep(0.2)
    raise AssertionError(f"the weights table never filled in: {texts}")


def readout_number(widget, css_class: str) -> float:
    return float(widget.locator(f".{css_class}").first.text_content())


def entropy(weights: torch.Tensor) -> float:
    return float(-(weights * weights.log()).sum())


def wait_for_change(widget, before: list[float]) -> list[float]:
    deadline = time.monotonic() + 30
    while displayed_weights(widget) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    return displayed_weights(widget)


def test_scaling_walkthrough_in_jupyterlab(browser, lab):
    page, widget = open_and_run_all(browser, lab, "02_formula.ipynb", ".scaling-walkthrough")
    sentence = bank_sentence()
    raw_scores = sentence.queries.double() @ sentence.keys.double().T          # [N, N], computed here

    def expected(query: str, sqrt_d_k: float) -> torch.Tensor:
        return torch.softmax(raw_scores[sentence.index(query)] / sqrt_d_k, dim=-1)

    # The chapter leaves the slider at √d_k = 8 = √64 and the query on "bank".
    at_8 = expected("bank", 8.0)
    assert displayed_weights(widget) == pytest.approx(at_8.tolist(), abs=6e-4)
    assert readout_number(widget, "largest-weight") == pytest.approx(float(at_8.max()), abs=6e-4)
    assert readout_number(widget, "entropy") == pytest.approx(entropy(at_8), abs=6e-4)

    # Type √d_k = 2 into the slider's readout: scores are divided by less, the softmax sharpens.
    before = displayed_weights(widget)
    slider_readout = widget.locator(".widget-readout").first
    slider_readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("2")
    page.keyboard.press("Enter")
    at_2 = expected("bank", 2.0)
    assert wait_for_change(widget, before) == pytest.approx(at_2.tolist(), abs=6e-4)
    assert readout_number(widget, "largest-weight") > float(at_8.max())
    assert readout_number(widget, "entropy") == pytest.approx(entropy(at_2), abs=6e-4)

    # One step right on the slider's handle (a quarter octave): flatter again, entropy up.
    before = displayed_weights(widget)
    widget.locator(".noUi-handle").first.focus()
    page.keyboard.press("ArrowRight")
    at_step = expected("bank", 2.0 * 2**0.25)
    assert wait_for_change(widget, before) == pytest.approx(at_step.tolist(), abs=6e-4)
    assert readout_number(widget, "entropy") > entropy(at_2)

    # Another query token: the weights become that token's row.
    before = displayed_weights(widget)
    widget.locator("button", has_text=re.compile(r"^river$")).click()
    assert wait_for_change(widget, before) == pytest.approx(expected("river", 2.0 * 2**0.25).tolist(), abs=6e-4)
    assert '"river" attends most to' in widget.text_content()

    ARTIFACTS.mkdir(exist_ok=True)
    widget.screenshot(path=str(ARTIFACTS / "02_scaling_walkthrough.png"))
    page.close()


def test_query_explorer_in_jupyterlab(browser, lab):
    page, widget = open_and_run_all(browser, lab, "01_intuition.ipynb", ".query-explorer")
    sentence = bank_sentence()
    scores = sentence.queries.double() @ sentence.keys.double().T / math.sqrt(sentence.d_k)
    weights = torch.softmax(scores, dim=-1)                                      # [N, N], computed here

    bank = weights[sentence.index("bank")]
    assert displayed_weights(widget) == pytest.approx(bank.tolist(), abs=6e-4)
    assert readout_number(widget, "largest-weight") == pytest.approx(float(bank.max()), abs=6e-4)
    assert f'attends most to "{sentence.tokens[int(bank.argmax())]}"' in widget.text_content()

    for query in ("muddy", "The"):
        before = displayed_weights(widget)
        widget.locator("button", has_text=re.compile(f"^{re.escape(query)}$")).click()
        row = weights[sentence.index(query)]
        assert wait_for_change(widget, before) == pytest.approx(row.tolist(), abs=6e-4)
        assert readout_number(widget, "largest-weight") == pytest.approx(float(row.max()), abs=6e-4)
        # The token named is one that holds the largest weight (ties are possible).
        named = re.search(f'"{re.escape(query)}" attends most to "([^"]+)"', widget.text_content()).group(1)
        assert float(row[sentence.index(named)]) == pytest.approx(float(row.max()), abs=6e-4)

    ARTIFACTS.mkdir(exist_ok=True)
    widget.screenshot(path=str(ARTIFACTS / "01_query_explorer.png"))
    page.close()
