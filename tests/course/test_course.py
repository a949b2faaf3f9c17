"""The course as a whole: the README's chapter map, chapter headers, the Colab cell, the
kernel the chapters name, Binder."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import textwrap

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
REPOSITORY = re.search(r'^Repository = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def first_code_cell(path: pathlib.Path) -> str:
    notebook = nbformat.read(path, as_version=4)
    return next(cell.source for cell in notebook.cells if cell.cell_type == "code")


def header(path: pathlib.Path) -> str:
    notebook = nbformat.read(path, as_version=4)
    return next(cell.source for cell in notebook.cells if cell.cell_type == "markdown")


def test_there_are_fourteen_chapters():
    assert [path.name[:2] for path in CHAPTERS] == ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11",
                                                    "12", "13", "14"]


def test_readme_chapter_map_links_every_chapter_with_its_run_time():
    readme = (ROOT / "README.md").read_text()
    for path in CHAPTERS:
        (row,) = [line for line in readme.splitlines() if f"](notebooks/{path.name})" in line]
        assert row.startswith("| [") and re.search(r"\| ~\d+ (s|min)( \d+ s)? \|$", row), row
    assert "RUNTIME_" not in readme
    linked = set(re.findall(r"\(notebooks/(\d\d_[a-z_]+\.ipynb)\)", readme))
    assert linked == {path.name for path in CHAPTERS}, "the README links a notebook that does not exist"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_each_chapter_states_prerequisites_run_time_and_next(path):
    text = header(path)
    assert "**Prerequisites**" in text and "**Run time**" in text, text
    index = CHAPTERS.index(path)
    if index + 1 < len(CHAPTERS):
        assert f"]({CHAPTERS[index + 1].name})" in text, f"{path.name} must link to the next chapter"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_code_cell_does_one_step_in_at_most_15_lines(path):
    """A reader follows a chapter cell by cell: a longer cell is split, or its code moves into the package and is
    shown with show_source. Worked solutions (# BEGIN SOLUTION) are the exception: an answer is one function."""
    cells = nbformat.read(path, as_version=4).cells
    long = {index: len(cell.source.splitlines()) for index, cell in enumerate(cells) if cell.cell_type == "code"
            and "# BEGIN SOLUTION" not in cell.source and len(cell.source.splitlines()) > 15}
    assert not long, f"{path.name}: code cells longer than 15 lines, {{cell index: lines}} {long}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_opens_with_its_title_and_goals_then_the_colab_cell(path):
    """What a student sees first: the lesson, not otter's configuration or set-up code."""
    cells = nbformat.read(path, as_version=4).cells
    title, setup = cells[0], cells[1]
    assert title.cell_type == "markdown" and title.source.startswith("# Chapter "), title.source[:80]
    assert "**What you will learn**" in title.source
    assert setup.cell_type == "code" and setup.source == first_code_cell(path)
    assert "google.colab" in setup.source and len(setup.source.splitlines()) <= 12
    # otter's raw cells (configuration, questions, solutions, tests) belong to the exercises.
    exercises = next(i for i, cell in enumerate(cells) if cell.cell_type == "markdown"
                     and cell.source.startswith("## Exercises"))
    assert [cell.source.splitlines()[0] for cell in cells[:exercises] if cell.cell_type == "raw"] == []


def test_every_chapter_carries_the_same_kernel_and_language_metadata():
    """What JupyterLab compares with the running kernel as a chapter opens: the same in every chapter,
    so the browser test that opens two of them (tests/course/test_browser.py) speaks for all."""
    seen = {(json.dumps(nb.metadata.kernelspec, sort_keys=True), json.dumps(nb.metadata.language_info, sort_keys=True))
            for nb in (nbformat.read(path, as_version=4) for path in CHAPTERS)}
    assert len(seen) == 1, seen


def test_chapters_name_the_kernel_that_make_registers():
    """JupyterLab rewrites a notebook's kernelspec to the running kernel's, marking it modified,
    unless the two agree; so the chapters, `make execute` and `make venv` use one display name."""
    makefile = (ROOT / "Makefile").read_text()
    display_name = re.search(r"^KERNEL_DISPLAY_NAME := (.+)$", makefile, re.M).group(1).strip()
    assert re.search(r'--name python3 \\\n\s+--display-name "\$\(KERNEL_DISPLAY_NAME\)"', makefile)
    spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "tools" / "run_notebooks.py")
    run_notebooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_notebooks)
    expected = {"name": "python3", "display_name": display_name, "language": "python"}
    assert run_notebooks.KERNELSPEC == expected
    for path in CHAPTERS:
        assert nbformat.read(path, as_version=4).metadata.kernelspec == expected, path.name


def test_chapter_01_has_the_notation_table():
    notebook = nbformat.read(ROOT / "notebooks" / "01_intuition.ipynb", as_version=4)
    (table,) = [cell.source for cell in notebook.cells if cell.cell_type == "markdown" and "Notation" in cell.source]
    for symbol in ("N", "N_q", "B", "H", "E", "d_k", "d_v", "W_Q, W_K, W_V"):
        assert f"| ${symbol}$" in table, symbol


COLAB_PROBE = textwrap.dedent('''
    import socket, subprocess, sys

    calls = []

    def refuse(*args, **kwargs):
        raise AssertionError(f"the first cell touched the network or ran a command: {args}")

    def record(command, *args, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0)

    socket.socket.connect = refuse
    socket.create_connection = refuse
    subprocess.run = record if ON_COLAB else refuse
    if ON_COLAB:
        import types
        colab = types.ModuleType("google.colab")
        colab.output = types.SimpleNamespace(enable_custom_widget_manager=lambda: calls.append("widgets"))
        sys.modules["google"] = types.ModuleType("google")
        sys.modules["google.colab"] = colab
    exec(compile(CELL, "first cell", "exec"), {})
    print(repr(calls))
''')


def run_first_cell(path: pathlib.Path, on_colab: bool) -> str:
    probe = f"ON_COLAB = {on_colab}\nCELL = {first_code_cell(path)!r}\n" + COLAB_PROBE
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            cwd=path.parent)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_first_cell_does_nothing_outside_colab(path):
    assert "google.colab" in first_code_cell(path)
    assert run_first_cell(path, on_colab=False) == "[]"


def test_first_cell_installs_the_package_on_colab():
    calls = run_first_cell(CHAPTERS[0], on_colab=True)
    assert "pip" in calls and "install" in calls and f"git+{REPOSITORY}" in calls
    assert "widgets" in calls, "ipywidgets need Colab's custom widget manager"
    # Every chapter carries the same cell.
    assert len({first_code_cell(path) for path in CHAPTERS}) == 1


def test_binder_installs_the_package_with_cpu_torch_and_offline_lab_settings():
    binder = ROOT / "binder"
    requirements = (binder / "requirements.txt").read_text()
    assert "download.pytorch.org/whl/cpu" in requirements and "torch" in requirements
    post_build = binder / "postBuild"
    assert post_build.stat().st_mode & 0o111, "postBuild must be executable"
    script = post_build.read_text()
    assert 'pip install --no-cache-dir -e ".[notebooks]"' in script
    assert "tools/jupyterlab-overrides.json" in script and (ROOT / "tools" / "jupyterlab-overrides.json").exists()
    assert re.fullmatch(r"python-3\.1\d\n", (binder / "runtime.txt").read_text())
