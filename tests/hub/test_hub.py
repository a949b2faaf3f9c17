"""A class on a real JupyterHub, end to end: hand out, answer in JupyterLab, collect, grade.

Everything an instructor does is the course's own command (INSTRUCTORS.md section 6), and every
student step is Chromium's: the hub starts on loopback from deploy/jupyterhub/jupyterhub_config.py
(tests/hub/jupyterhub_test_config.py swaps PAM and system users for a shared password and
SimpleLocalProcessSpawner's homes); chapter 02's student version is committed into a hand-out
repository (tools/handout.py publish) and its nbgitpuller link (tools/handout.py link) is what
both students open. Each logs in, gets the notebooks pulled into their home, and in chapter 02
writes an answer to exercise 1 (ada's right, grace's a plain exp, which overflows), runs the
check cell and reads the course's feedback. Neither student's browser can read the other's
files. The idle culler runs beside the hub. The instructor fixes a typo and publishes again; ada
clicks the link again and keeps her answer, with the fix. tools/collect_submissions.py gathers
both notebooks from the homes and tools/grade.py (what `make grade` runs) scores each as its
answer deserves: the points that chapter 02's master notebook gives exercise 1 to ada, 0 to grace.

What SimpleLocalProcessSpawner does not isolate: every server runs as this test's Unix user, so a
student's kernel could open another home's files by path; the hub and the proxy keep each
student's browser (and API calls) to their own server, which is what this test shows. Real
isolation on one machine takes system users (the deployed configuration's LocalProcessSpawner),
on Kubernetes a pod and a volume per user.

Without Chromium or configurable-http-proxy (npm) the test skips with one line; with CI set, it
fails instead. Times go to test-artifacts/hub_timings.json.
"""

from __future__ import annotations

import csv
import json
import pathlib
import re
import time

import nbformat
import pytest

from helpers import run_tool, sandbox_installed
from support.browser import ARTIFACTS, TIMEOUT_MS, wait_for_kernel_idle
from support.hub import (
    code_cell,
    log_in,
    notebook_opened,
    output_text,
    replace_source,
    require_hub,
    running_hub,
    save,
    start_cell,
    wait_until_ran,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTER = "02_formula"
QUESTION = "q1_stable_softmax"
# Exercise 1: a softmax that stays right for large scores (ada), and a plain exp that overflows (grace).
ANSWERS = {
    "ada": "def stable_softmax(scores):\n"
           "    shifted = scores - scores.amax(dim=-1, keepdim=True)\n"
           "    return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)\n",
    "grace": "def stable_softmax(scores):\n"
             "    return scores.exp() / scores.exp().sum(dim=-1, keepdim=True)\n",
}
TYPO, FIXED = "Write `stable_softmax(scores)`", "Write `stable_softmax(scores)` (corrected)"


def question_points(master: pathlib.Path, question: str) -> float:
    """The points the master notebook's ``# BEGIN QUESTION`` cell gives ``question``."""
    for cell in nbformat.read(master, as_version=4).cells:
        if cell.cell_type == "raw" and cell.source.startswith("# BEGIN QUESTION") \
                and re.search(rf"^name:\s*{question}\s*$", cell.source, re.MULTILINE):
            return float(re.search(r"^points:\s*([\d.]+)", cell.source, re.MULTILINE).group(1))
    raise AssertionError(f"{master.name} has no question {question}")


@pytest.fixture(scope="module")
def hub_tools():
    require_hub()


def open_handout(context, hub, student: str, link: str):
    """A student clicks the hand-out link: logs in; the hub starts their server, nbgitpuller clones
    the hand-out into their home and JupyterLab opens the chapter. Return the page (not yet waited on)."""
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(link)
    log_in(page, hub, student)
    return page


def answer(page, source: str):
    """Run otter's set-up cell (at the start of the exercises) and the exercises' imports, write ``source`` into
    exercise 1 and run it and its check cell, each queued behind the one before; return the check cell."""
    start_cell(page, code_cell(page, "otter.Notebook("))
    start_cell(page, code_cell(page, "show_diagnosis_only()"))
    exercise = code_cell(page, "def stable_softmax(scores):")
    replace_source(page, exercise, source)
    start_cell(page, exercise)
    check = code_cell(page, f'grader.check("{QUESTION}")')
    start_cell(page, check)
    return check


def feedback_in(page, check) -> str:
    """The check cell's output, once it has run and shows it."""
    wait_until_ran(page, check)
    check.locator(".jp-OutputArea-output").first.wait_for()
    return output_text(check)


def assert_course_environment(page, context, hub, student: str) -> None:
    """The student's server is the one deploy/jupyterhub/jupyterhub_config.py describes: the
    course's kernel, tools/lab.py's offline flags, the course's JupyterLab settings."""
    kernel = page.locator(".jp-Toolbar-kernelName").first.text_content().strip()
    carried = nbformat.read(ROOT / "notebooks" / f"{CHAPTER}.ipynb", as_version=4).metadata.kernelspec.display_name
    assert kernel == carried
    config = page.evaluate("() => JSON.parse(document.getElementById('jupyter-config-data').textContent)")
    assert config["news"] == {"disabled": True}                     # --LabApp.news_url=None
    assert config["extensionManager"]["name"] == "read-only"         # --LabApp.extension_manager=readonly
    settings = context.request.get(
        f"{hub.url}/user/{student}/lab/api/settings/@jupyterlab/apputils-extension:notification").json()
    expected = json.loads((ROOT / "tools" / "jupyterlab-overrides.json").read_text())
    for name, value in expected["@jupyterlab/apputils-extension:notification"].items():
        assert settings["schema"]["properties"][name]["default"] == value, name


@pytest.mark.slow
def test_two_students_on_a_hub_hand_out_answer_collect_grade(hub_tools, browser, tmp_path):
    began = time.monotonic()
    # The instructor: chapter 02's student notebook and autograder (make assignments, one chapter),
    # committed into the hand-out repository; its link for this hub.
    dist = tmp_path / "dist"
    run_tool("tools/assign.py", "--no-run-tests", "--out", str(dist), f"notebooks/{CHAPTER}.ipynb")
    handout = tmp_path / "handout"
    run_tool("tools/handout.py", "publish", "--student", str(dist / "student"), "--repo", str(handout))
    timings = {"build and publish chapter 02 (s)": round(time.monotonic() - began, 1)}

    with running_hub(tmp_path, list(ANSWERS)) as hub:
        link = run_tool("tools/handout.py", "link", "--hub", hub.url, "--repo", str(handout),
                        "--open", f"{CHAPTER}.ipynb").strip()
        contexts = {student: browser.new_context(viewport={"width": 1400, "height": 1000}) for student in ANSWERS}
        pages = {}
        try:
            # Both students click the link at once; then each waits for the chapter's kernel.
            pages = {student: open_handout(contexts[student], hub, student, link) for student in ANSWERS}
            for page in pages.values():
                notebook_opened(page, f"{CHAPTER}.ipynb")
                wait_for_kernel_idle(page)
            # Both answer at once; the kernels run while the other student types.
            checks = {student: answer(page, ANSWERS[student]) for student, page in pages.items()}
            feedback = {student: feedback_in(pages[student], check) for student, check in checks.items()}
            timings["jupyterhub start to both students seeing feedback (s)"] = round(
                time.monotonic() - hub.started, 1)
            assert_course_environment(pages["ada"], contexts["ada"], hub, "ada")
            # The course's feedback, in the page: ada's passes, grace's names the overflow.
            assert f"{QUESTION} passed" in feedback["ada"], feedback["ada"]
            assert "overflow" in feedback["grace"].lower() and "passed" not in feedback["grace"], feedback["grace"]
            for page in pages.values():
                save(page)

            # Each home holds that student's answer only.
            mine = {student: hub.homes / student / "attn-course" / f"{CHAPTER}.ipynb" for student in ANSWERS}
            for student, path in mine.items():
                sources = [cell.source.strip() for cell in nbformat.read(path, as_version=4).cells]
                assert ANSWERS[student].strip() in sources
                assert not any(ANSWERS[other].strip() in sources for other in ANSWERS if other != student)

            # Neither browser reaches the other's files: the same contents request that reads your
            # own notebook is refused for a classmate's.
            for student, other in (("ada", "grace"), ("grace", "ada")):
                request = contexts[student].request
                own = request.get(f"{hub.url}/user/{student}/api/contents/attn-course/{CHAPTER}.ipynb")
                assert own.status == 200
                assert ANSWERS[student].strip() in [cell["source"].strip() for cell in own.json()["content"]["cells"]]
                theirs = request.get(f"{hub.url}/user/{other}/api/contents/attn-course/{CHAPTER}.ipynb")
                assert theirs.status == 403, (theirs.status, theirs.url)
                assert "stable_softmax" not in theirs.text()

            # A typo fixed and handed out again; ada clicks the same link: her answer stays, the fix arrives.
            student_notebook = dist / "student" / f"{CHAPTER}.ipynb"
            text = student_notebook.read_text(encoding="utf-8")
            assert text.count(TYPO) == 1
            student_notebook.write_text(text.replace(TYPO, FIXED), encoding="utf-8")
            run_tool("tools/handout.py", "publish", "--student", str(dist / "student"), "--repo", str(handout),
                     "--message", "Exercise 1: typo")
            pages["ada"].goto(link)
            notebook_opened(pages["ada"], f"{CHAPTER}.ipynb")
            pages["ada"].locator(".jp-MarkdownCell", has_text="(corrected)").first.wait_for()
            sources = [cell.source.strip() for cell in nbformat.read(mine["ada"], as_version=4).cells]
            assert ANSWERS["ada"].strip() in sources
            assert any(FIXED in source for source in sources)
        except Exception:
            ARTIFACTS.mkdir(exist_ok=True)
            for student, page in pages.items():
                page.screenshot(path=str(ARTIFACTS / f"hub-{student}-failure.png"))
            raise
        finally:
            for context in contexts.values():
                context.close()

        # The idle culler started with the hub and read the users' activity with the scopes it was given.
        log = hub.log.read_text()
        assert re.search(r"200 GET /hub/api/users\S* \(idle-culler@127\.0\.0\.1\)", log), log[-2000:]
        assert "Service idle-culler exited" not in log

        # The instructor collects both notebooks from the homes, then grades them as `make grade` does.
        submissions = tmp_path / "submissions"
        collected = run_tool("tools/collect_submissions.py", str(hub.homes), "--out", str(submissions),
                             "--chapters", CHAPTER)
    assert sorted(path.parent.name for path in submissions.glob(f"*/{CHAPTER}.ipynb")) == sorted(ANSWERS), collected
    graded = time.monotonic()
    grades = tmp_path / "grades"
    run_tool("tools/grade.py", str(submissions), "--autograders", str(dist / "autograder"), "--out", str(grades),
             "--jobs", "2", *([] if sandbox_installed() else ["--trusted"]))
    timings["grading both (s)"] = round(time.monotonic() - graded, 1)
    with open(grades / "grades.csv", newline="", encoding="utf-8") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    points = question_points(ROOT / "notebooks" / f"{CHAPTER}.ipynb", QUESTION)
    column = f"{CHAPTER}:{QUESTION}"
    assert float(rows["ada"][column]) == points and float(rows["ada"]["total"]) == points, rows["ada"]
    assert float(rows["grace"][column]) == 0 and float(rows["grace"]["total"]) == 0, rows["grace"]

    timings["whole test (s)"] = round(time.monotonic() - began, 1)
    ARTIFACTS.mkdir(exist_ok=True)
    scores = {student: rows[student][column] for student in ANSWERS}
    report = {"timings": timings, "feedback": feedback, "scores": scores}
    (ARTIFACTS / "hub_timings.json").write_text(json.dumps(report, indent=1) + "\n")
    print(timings)
