"""`make lab` serves the student's own copies of the chapters (tools/student_copies.py, tools/lab.py):
blank exercises with no otter markup, built from the masters, and never overwritten once edited."""

from __future__ import annotations

import json
import pathlib
import shutil

import nbformat
import pytest

from tools import lab, student_copies

ROOT = pathlib.Path(__file__).resolve().parents[2]
MASTER = ROOT / "notebooks" / "01_intuition.ipynb"


def solution_lines(master: pathlib.Path) -> list[str]:
    """The lines between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` in a master's code cells."""
    lines, inside = [], False
    for cell in nbformat.read(master, as_version=4).cells:
        for line in cell.source.splitlines() if cell.cell_type == "code" else []:
            if line.strip() == "# BEGIN SOLUTION":
                inside = True
            elif line.strip() == "# END SOLUTION":
                inside = False
            elif inside and line.strip():
                lines.append(line.strip())
    return lines


def change_text(master: pathlib.Path) -> None:
    """The instructor fixes a typo: the master's first markdown cell changes."""
    notebook = nbformat.read(master, as_version=4)
    cell = next(cell for cell in notebook.cells if cell.cell_type == "markdown")
    cell.source += "\n\n(A typo fixed.)"
    nbformat.write(notebook, master)


@pytest.mark.slow
def test_copies_have_blank_exercises_and_edits_survive_a_rebuild(tmp_path):
    masters, folder = tmp_path / "masters", tmp_path / "my-notebooks"
    masters.mkdir()
    edited, untouched = masters / MASTER.name, masters / "01_untouched.ipynb"
    shutil.copy(MASTER, edited)
    shutil.copy(MASTER, untouched)
    assert student_copies.refresh([edited, untouched], folder) == [f"{MASTER.name}: ready",
                                                                   "01_untouched.ipynb: ready"]
    copy = nbformat.read(folder / MASTER.name, as_version=4)
    text = json.dumps(copy.cells)
    # No solution, no otter markup, no hidden test: what the student reads is the lesson and blank answers.
    assert solution_lines(MASTER), "the master has solutions to look for"
    assert not [line for line in solution_lines(MASTER) if len(line) > 12 and line in text]
    assert not [cell for cell in copy.cells if cell.cell_type == "raw"]
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN QUESTION", "BEGIN TESTS", "# HIDDEN", "ASSIGNMENT CONFIG"):
        assert marker not in text, marker
    # A check cell under each exercise.
    questions = [cell for cell in nbformat.read(MASTER, as_version=4).cells
                 if cell.cell_type == "raw" and cell.source.startswith("# BEGIN QUESTION")]
    assert len([cell for cell in copy.cells if cell.source.startswith("grader.check(")]) == len(questions) > 0

    # Up to date: nothing is built again.
    assert student_copies.refresh([edited, untouched], folder) == []
    # The student answers in one copy; the instructor then changes both masters.
    answered = nbformat.read(folder / MASTER.name, as_version=4)
    answered.cells[-1].source += "\n# my answer"
    nbformat.write(answered, folder / MASTER.name)
    mine = (folder / MASTER.name).read_bytes()
    change_text(edited)
    change_text(untouched)
    lines = student_copies.refresh([edited, untouched], folder)
    assert lines[0].startswith(f"{MASTER.name}: kept as you edited it; the course has a newer version")
    assert lines[1] == "01_untouched.ipynb: updated from the course's newer version"
    assert (folder / MASTER.name).read_bytes() == mine
    assert "(A typo fixed.)" in (folder / "01_untouched.ipynb").read_text()
    # A copy the student deleted comes back.
    (folder / "01_untouched.ipynb").unlink()
    assert student_copies.refresh([untouched], folder) == ["01_untouched.ipynb: ready"]


def test_make_lab_serves_the_student_copies_and_the_masters_only_when_asked(tmp_path, monkeypatch):
    served = []
    monkeypatch.setattr(student_copies, "FOLDER", tmp_path / "my-notebooks")
    monkeypatch.setattr(student_copies, "refresh", lambda masters, folder, announce: served.append(folder) or [])
    monkeypatch.setattr(lab.os, "execve", lambda program, command, environment: served.append(command))
    lab.main(["--no-browser"])
    assert served[0] == tmp_path / "my-notebooks"
    assert f"--ServerApp.root_dir={(tmp_path / 'my-notebooks').resolve()}" in served[1]
    served.clear()
    lab.main(["--root", str(ROOT / "notebooks")])
    assert len(served) == 1 and f"--ServerApp.root_dir={ROOT / 'notebooks'}" in served[0]


@pytest.mark.parametrize("name", ["01", "1", "01_intuition", "01_intuition.ipynb", "notebooks/01_intuition.ipynb"])
def test_a_chapter_is_named_by_number_or_name(name):
    assert student_copies.find_chapters([name]) == [MASTER]


def test_an_unknown_chapter_names_the_chapters_there_are():
    with pytest.raises(SystemExit, match=r"no chapter '99'; the chapters are 01_intuition, 02_formula"):
        student_copies.find_chapters(["99"])
