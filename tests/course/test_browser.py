"""The chapters in a real browser: JupyterLab from this environment, driven by Playwright.

Chromium is Debian's (``/usr/bin/chromium``, installed by ``.ci/run``; ``ATTN_COURSE_CHROMIUM``
points at another); Playwright never downloads a browser. Without Chromium or Playwright the
browser tests skip with one line that says how to enable them, except in CI (``CI`` set to
true, 1 or yes), where they fail. The tests of that decision run everywhere; the browser
tests are marked slow (``make unit`` leaves them out). The notebooks are copied to a
temporary folder first, so JupyterLab's autosave can never touch the committed ones.
Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from typing import NamedTuple

import nbformat
import pytest
import torch

from attn_course.data.toy_sentence import bank_sentence

from support.browser import (
    ARTIFACTS,
    CHROMIUM_VARIABLE,
    TIMEOUT_MS,
    missing_browser,
    require_browser,
    stop_server,
    wait_for_kernel_idle,
    wait_until_serving,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# --- JupyterLab and Chromium ---------------------------------------------------------------


class Lab(NamedTuple):
    base: str                   # http://127.0.0.1:PORT
    token: str
    root: pathlib.Path          # the folder it serves: copies of the chapters


@pytest.fixture(scope="module")
def lab(chromium, tmp_path_factory):
    """A JupyterLab server, started as `make lab` starts it (tools/lab.py), on a free loopback
    port with a random token, serving copies of the chapters."""
    root = tmp_path_factory.mktemp("lab")
    for notebook in CHAPTERS:
        shutil.copy(notebook, root)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = secrets.token_hex(16)
    command = [sys.executable, str(ROOT / "tools" / "lab.py"), "--root", str(root),
               "--no-browser", "--ip=127.0.0.1", f"--port={port}", f"--ServerApp.token={token}"]
    log = open(tmp_path_factory.mktemp("lab-log") / "jupyterlab.log", "w")
    server = subprocess.Popen(command, cwd=root, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{base}/api/status?token={token}", server, seconds=120, poll=0.5,
                           problem=lambda: f"JupyterLab did not start; see {log.name}")
        yield Lab(base, token, root)
    finally:
        stop_server(server)
        log.close()


def open_notebook(browser, lab: Lab, notebook: str, requests: list[str] | None = None):
    """Open ``notebook`` (a path under the lab's root) in a workspace of its own and wait until
    its kernel has started and is idle; return the page. ``requests``, if given, collects the URL
    of every request the page makes, web sockets included, from the first one on."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    if requests is not None:
        page.on("request", lambda request: requests.append(request.url))
        page.on("websocket", lambda socket: requests.append(socket.url))
    # A workspace of its own, reset: no tab left open by another test.
    workspace = re.sub(r"[^A-Za-z0-9]+", "-", notebook.removesuffix(".ipynb"))
    try:
        page.goto(f"{lab.base}/lab/workspaces/{workspace}/tree/{notebook}?reset&token={lab.token}")
        wait_for_kernel_idle(page)
    except Exception:
        screenshot_on_failure(page, workspace)
        raise
    return page


def screenshot_on_failure(page, name: str):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}-failure.png"))


def open_and_run_all(browser, lab: Lab, notebook: str, widget_selector: str, requests: list[str] | None = None):
    """Open ``notebook`` in JupyterLab, run every cell, wait for the widget; return the page."""
    page = open_notebook(browser, lab, notebook, requests)
    try:
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
        screenshot_on_failure(page, pathlib.Path(notebook).stem)
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


def cells_of(lab: Lab, chapter: str, keep: str) -> str:
    """A copy of ``chapter`` holding its set-up (the first two code cells: Colab's install, the
    imports) and the code cells that mention ``keep``; return its path in the lab. The widget is
    what a browser test checks; the chapter's other cells are nbval's, and running them all in
    JupyterLab (chapter 02: 23 s of training and timing) would test nothing more here."""
    notebook = nbformat.read(lab.root / chapter, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    notebook.cells = code[:2] + [cell for cell in code[2:] if keep in cell.source]
    path = f"{pathlib.Path(chapter).stem}-{keep}.ipynb"
    nbformat.write(notebook, lab.root / path)
    return path


@pytest.mark.slow
def test_scaling_walkthrough_in_jupyterlab(browser, lab):
    notebook = cells_of(lab, "02_formula.ipynb", "scaling_walkthrough(")
    page, widget = open_and_run_all(browser, lab, notebook, ".scaling-walkthrough")
    sentence = bank_sentence()
    raw_scores = sentence.queries.double() @ sentence.keys.double().T          # [N, N], computed here

    def expected(query: str, sqrt_d_k: float) -> torch.Tensor:
        return torch.softmax(raw_scores[sentence.index(query)] / sqrt_d_k, dim=-1)

    # The walkthrough starts with the slider at √d_k = 8 = √64 and the query on "bank".
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


# An output that a widget drew (JupyterLab gives the outputs it renders from a MIME type a
# data-mime-type attribute, and a widget's panel none).
WIDGET_OUTPUT = ".jp-OutputArea-output:not([data-mime-type])"


def screenshot_pinned(page, view, query, name: str) -> None:
    """A screenshot of a head ``view`` with ``query``'s row pinned by a click and the pointer moved
    away: scrolling for the screenshot would otherwise put another token under the pointer."""
    query.click()
    page.mouse.move(0, 0)
    ARTIFACTS.mkdir(exist_ok=True)
    view.screenshot(path=str(ARTIFACTS / f"{name}.png"))


class RanChapter(NamedTuple):
    page: object                # Playwright's Page, every cell run
    requests: list[str]         # every URL the page asked for, from the start


@pytest.fixture(scope="module")
def chapter_01(browser, lab):
    """Chapter 01 opened in JupyterLab and run from top to bottom, once for the tests of both of
    its widgets (a run takes about 20 s)."""
    requests: list[str] = []
    page, _ = open_and_run_all(browser, lab, "01_intuition.ipynb", ".query-explorer", requests)
    yield RanChapter(page, requests)
    page.close()


@pytest.mark.slow
def test_query_explorer_in_jupyterlab(chapter_01):
    widget = chapter_01.page.locator(".query-explorer").first
    widget.scroll_into_view_if_needed()
    sentence = bank_sentence(6)
    scores = sentence.queries.double() @ sentence.keys.double().T / 8            # chapter 01's temperature
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


@pytest.mark.slow
def test_head_view_in_jupyterlab(chapter_01, lab):
    """Chapter 01's head view of MiniLM on the bank sentence, drawn by anywidget from the kernel:
    select layer 0, head 4, point at "bank", read the weight written next to "river", and compare
    it with the model's own weight, computed here. Nothing but the local server is asked for."""
    from attn_course.models.bert import load_pretrained

    model, tokenizer = load_pretrained()
    batch = tokenizer("The bank of the river was muddy.")
    tokens = batch.tokens[0]
    bank, river = tokens.index("bank"), tokens.index("river")
    with torch.no_grad():
        attentions = model(batch.input_ids).attentions                       # [L] of [1, H, N, N]

    page = chapter_01.page
    # Drawn by anywidget, not by the text/html fallback next to it: JupyterLab marks an output it
    # renders from a MIME type with data-mime-type, and a widget's output (a panel) without it.
    view = page.locator(f"{WIDGET_OUTPUT} .attn-head-view").first
    view.scroll_into_view_if_needed()
    layer, head = view.locator("select[data-control=layer]"), view.locator("select[data-control=head]")
    key_weight = view.locator(f'.hv-keys .hv-token[data-index="{river}"] .hv-weight')
    query = view.locator(f'.hv-queries .hv-token[data-index="{bank}"]')
    try:
        assert view.locator("canvas.hv-thumb").count() == 72
        # Somewhere else first, so that selecting layer 0, head 4 is a change the page must draw.
        for selected_layer, selected_head in [(3, 7), (0, 4)]:
            layer.select_option(str(selected_layer))
            head.select_option(str(selected_head))
            query.hover()
            expected = float(attentions[selected_layer][0, selected_head, bank, river])
            page.wait_for_function("([node, text]) => node.textContent === text",
                                   arg=[key_weight.element_handle(), f"{expected:.3f}"], timeout=10_000)
            assert float(key_weight.text_content()) == pytest.approx(expected, abs=6e-4)
        screenshot_pinned(page, view, query, "01_head_view")
    except Exception:
        screenshot_on_failure(page, "01_head_view")
        raise
    assert float(attentions[0][0, 4, bank, river]) == pytest.approx(0.5232, abs=1e-4)   # the chapter's 0.52
    # Every request went to this JupyterLab (http and its web sockets), or stayed in the page.
    local = (lab.base, lab.base.replace("http://", "ws://"), "blob:", "data:")
    assert chapter_01.requests and [url for url in chapter_01.requests if not url.startswith(local)] == []


@pytest.mark.slow
def test_head_view_renders_from_the_saved_widget_state(browser, lab):
    """Chapter 08 opened, nothing run. Not yet trusted, JupyterLab shows each head view's text/html
    with its script removed: a sentence that says so, not a blank. Trusted, it draws both views
    with anywidget from the widget state saved in the notebook (the script travels inside it),
    with no kernel call, and they respond to the pointer."""
    notebook = fresh_copy(lab, ROOT / "notebooks" / "08_transformer_bert.ipynb")
    page = open_notebook(browser, lab, notebook)
    try:
        untrusted = ".jp-OutputArea-output[data-mime-type='text/html'] .attn-head-view-placeholder"
        page.wait_for_function(f'document.querySelectorAll("{untrusted}").length === 2')
        placeholders = page.locator(untrusted)
        assert placeholders.first.text_content().startswith("Head view: 6 layers x 12 heads over 10 tokens.")

        page.keyboard.press("Control+Shift+C")                  # the command palette
        page.keyboard.type("Trust Notebook")
        page.keyboard.press("Enter")
        page.locator(".jp-Dialog .jp-Dialog-button", has_text=re.compile(r"^Trust$")).click()
        page.wait_for_function(f"document.querySelectorAll('{WIDGET_OUTPUT} .attn-head-view').length === 2")
        control = page.locator(f"{WIDGET_OUTPUT} .attn-head-view").nth(1)     # "The bank approved the loan."
        control.scroll_into_view_if_needed()
        bank = control.locator('.hv-queries .hv-token[data-index="2"]')
        bank.hover()
        loan = control.locator('.hv-keys .hv-token[data-index="5"]')
        assert loan.locator(".hv-label").text_content() == "loan"
        assert float(loan.locator(".hv-weight").text_content()) == pytest.approx(0.294, abs=6e-4)   # the chapter's 0.29
        screenshot_pinned(page, control, bank, "07_head_view_saved_state")
    except Exception:
        screenshot_on_failure(page, "07_head_view_saved_state")
        raise
    finally:
        page.close()
    shut_down_kernel(lab, notebook)


# --- opening a chapter changes nothing -----------------------------------------------------


def api(lab: Lab, path: str, method: str = "GET"):
    request = urllib.request.Request(f"{lab.base}/api/{path}", method=method,
                                     headers={"Authorization": f"token {lab.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    return json.loads(body) if body else None


def fresh_copy(lab: Lab, chapter: pathlib.Path) -> str:
    """Copy ``chapter`` into a folder that no other test opens; return its path in the lab.

    One thing is adjusted, and only where it differs: the Python version in
    ``language_info``. JupyterLab records the running kernel's version there, so a chapter
    executed under another Python (3.11.7 against 3.11.8 is enough) is marked modified on
    opening. That is the machine that last ran `make execute`, not this course's doing.
    """
    folder = lab.root / "fresh"
    folder.mkdir(exist_ok=True)
    target = folder / chapter.name
    notebook = json.loads(chapter.read_text(encoding="utf-8"))
    language = notebook["metadata"].get("language_info", {})
    if language.get("version", platform.python_version()) != platform.python_version():
        language["version"] = platform.python_version()
        target.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    else:
        shutil.copyfile(chapter, target)
    return f"fresh/{chapter.name}"


def shut_down_kernel(lab: Lab, notebook: str) -> None:
    for session in api(lab, "sessions"):
        if session["path"] == notebook:
            api(lab, f"sessions/{session['id']}", method="DELETE")


# Opening a chapter takes about 13 s (a kernel starts, and the tab is watched for 5 s). Every
# chapter carries the same kernelspec and language_info (tests/course/test_course.py checks that), and
# what else JupyterLab might rewrite is a chapter's saved widget state: so one chapter with widget
# state and one without stand for all of them.
OPENED = [chapter for chapter in CHAPTERS if chapter.stem in ("01_intuition", CHAPTERS[-1].stem)]


@pytest.mark.slow
@pytest.mark.parametrize("chapter", OPENED, ids=lambda p: p.stem)
def test_opening_a_chapter_leaves_it_unmodified(browser, lab, chapter):
    # JupyterLab rewrites the kernelspec metadata (and so marks the notebook modified) unless
    # the kernel it starts has the display name the chapter carries.
    carried = nbformat.read(chapter, as_version=4).metadata.kernelspec
    registered = api(lab, "kernelspecs")["kernelspecs"][carried.name]["spec"]["display_name"]
    assert registered == carried.display_name, (
        f"the {carried.name!r} kernel is registered as {registered!r}, the chapters say {carried.display_name!r}: "
        "re-register it with `make venv`, or keep the Makefile's KERNEL_DISPLAY_NAME and the chapters in step")

    notebook = fresh_copy(lab, chapter)
    on_disk = (lab.root / notebook).read_bytes()
    page = open_notebook(browser, lab, notebook)
    try:
        tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=chapter.name)
        assert tab.count() == 1
        assert page.locator(".jp-Toolbar-kernelName").first.text_content().strip() == carried.display_name
        # JupyterLab writes the kernel's metadata into the model once the kernel connects;
        # watch for a while, not once.
        for _ in range(20):
            assert "jp-mod-dirty" not in (tab.get_attribute("class") or ""), (
                f"JupyterLab marked {chapter.name} modified as it opened: its metadata differs from "
                "what JupyterLab records for this kernel (kernelspec, language_info)")
            time.sleep(0.25)
        assert page.locator(".jp-mod-dirty").count() == 0, "a document title is marked modified"
    except Exception:
        screenshot_on_failure(page, f"unmodified-{chapter.stem}")
        raise
    finally:
        page.close()
    shut_down_kernel(lab, notebook)
    assert (lab.root / notebook).read_bytes() == on_disk, "the notebook file changed"


# --- what a student sees first: make lab's copies, exercises blank ---------------------------


@pytest.mark.slow
def test_a_student_sees_the_chapter_with_blank_exercises(browser, lab):
    from tools import student_copies

    folder = lab.root / "my-notebooks"
    student_copies.refresh([ROOT / "notebooks" / "01_intuition.ipynb"], folder)
    page = open_notebook(browser, lab, "my-notebooks/01_intuition.ipynb")
    try:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "student_first_view.png"))
        cells = page.locator(".jp-Cell")
        text = "\n".join(cells.all_inner_texts())
        for marker in ("BEGIN SOLUTION", "# HIDDEN", "BEGIN QUESTION", "ASSIGNMENT CONFIG"):
            assert marker not in text, marker
        check = page.locator(".jp-CodeCell", has_text='grader.check("q1_').first
        check.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "student_first_exercise.png"))
        # Nothing is marked modified as it opens: the copy carries the kernel's display name.
        assert page.locator(".jp-mod-dirty").count() == 0
    except Exception:
        screenshot_on_failure(page, "student_first_view")
        raise
    finally:
        page.close()
    shut_down_kernel(lab, "my-notebooks/01_intuition.ipynb")


# --- the skip, and the failure in CI, without a browser (these run everywhere) -------------


@pytest.mark.parametrize("ci", [None, "", "0", "false", "no"])
def test_a_missing_chromium_skips_with_how_to_enable_it(monkeypatch, tmp_path, ci):
    missing = tmp_path / "no-chromium"
    monkeypatch.setenv(CHROMIUM_VARIABLE, str(missing))
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception) as skipped:
        require_browser()
    assert str(skipped.value) == (f"browser tests skipped: no Chromium at {missing}; enable them with "
                                  f"`apt-get install chromium` (or set {CHROMIUM_VARIABLE} to a Chromium executable)")


@pytest.mark.parametrize("ci", ["true", "1", "yes", "TRUE", "True"])
def test_a_missing_chromium_fails_in_ci(monkeypatch, tmp_path, ci):
    monkeypatch.setenv(CHROMIUM_VARIABLE, str(tmp_path / "no-chromium"))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=r"browser tests cannot run in CI: no Chromium at .*no-chromium"):
        require_browser()


def test_a_file_that_is_not_executable_is_no_chromium(monkeypatch, tmp_path):
    not_a_program = tmp_path / "chromium"
    not_a_program.write_text("")
    monkeypatch.setenv(CHROMIUM_VARIABLE, str(not_a_program))
    assert missing_browser().startswith(f"no Chromium at {not_a_program};")


def start_browser_tests(**environment) -> subprocess.Popen:
    """This file's browser tests (the slow ones) in a pytest of their own: all but the test that
    calls this, which would otherwise start itself again, two at a time, without end."""
    env = {key: value for key, value in os.environ.items() if key not in ("CI", "PYTEST_ADDOPTS")}
    env.update(environment)
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", __file__, "-m", "slow", "-k", f"not {SPAWNING_TEST}", "-q", "-rsE",
         "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def outcome_counts(completed: subprocess.CompletedProcess) -> dict[str, int]:
    """pytest's last line, "9 skipped, 12 deselected in 0.23s", as {"skipped": 9, "deselected": 12}."""
    summary = completed.stdout.strip().splitlines()[-1]
    return {word: int(number) for number, word in re.findall(r"(\d+) (\w+)", summary.split(" in ")[0])}


@pytest.mark.slow   # two pytest runs of their own, each importing torch
def test_without_chromium_the_browser_tests_skip_and_in_ci_they_fail(tmp_path):
    """End to end, fixtures included: nothing may try to launch a browser that is not there."""
    missing = str(tmp_path / "no-chromium")
    browser_tests = 5 + len(OPENED)    # the widgets, the head views, a student's first view; each chapter opened

    # Both runs at once: each spends its few seconds importing torch.
    running = [start_browser_tests(ATTN_COURSE_CHROMIUM=missing),
               start_browser_tests(ATTN_COURSE_CHROMIUM=missing, CI="true")]
    skipped, failed = (finish(process) for process in running)

    report = skipped.stdout + skipped.stderr
    assert skipped.returncode == 0, report
    counts = outcome_counts(skipped)
    assert counts.pop("skipped") == browser_tests and set(counts) <= {"deselected"}, report
    reasons = [line for line in report.splitlines() if line.startswith("SKIPPED")]
    assert reasons == [f"SKIPPED [{browser_tests}] tests/course/test_browser.py: browser tests skipped: no Chromium at "
                       f"{missing}; enable them with `apt-get install chromium` (or set {CHROMIUM_VARIABLE} "
                       "to a Chromium executable)"], report
    assert "executable doesn't exist" not in report

    report = failed.stdout + failed.stderr
    assert failed.returncode == 1, report
    counts = outcome_counts(failed)
    assert counts.pop("errors") == browser_tests and set(counts) <= {"deselected"}, report
    assert f"browser tests cannot run in CI: no Chromium at {missing}" in report
    assert "executable doesn't exist" not in report


#: The test that starts the browser tests in pytests of their own, left out of those runs.
SPAWNING_TEST = test_without_chromium_the_browser_tests_skip_and_in_ci_they_fail.__name__
