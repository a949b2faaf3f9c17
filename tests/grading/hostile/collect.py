"""Student folders that attack how submissions are found and read (issue 31), for a hostile class.

:func:`prepare` makes them under a submissions folder; each should be refused (or score 0), and
the rest of the class graded as if it were not there. tests/grading/test_collect.py grades them
with tools/grade.py; an end-to-end hostile class may add them to its own.
"""

from __future__ import annotations

import json
import os
import pathlib

from attn_course_grading.display import display
from attn_course_grading.reading import MAX_CELLS, MAX_NOTEBOOK_BYTES

#: A name that a spreadsheet runs as a formula (OWASP's example): accepted, and neutralised in grades.csv.
FORMULA_NAME = "@SUM(1+1)*cmd|' -C calc'!A0"


def _empty_notebook(cells: list[dict] | None = None) -> str:
    return json.dumps({"cells": cells or [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def prepare(submissions: pathlib.Path, paths: dict) -> dict[str, dict]:
    """Make the hostile student folders under ``submissions``; say what grading each must give.

    Args:
        submissions: the class's submissions folder (the honest students' folders already in it).
        paths: ``"solution"``: the solution notebook of the chapter (``dist/autograder/NN_name.ipynb``;
            its file name names the chapter the attacks hand in); ``"other"``: an honest
            classmate's notebook of that chapter, in its folder under ``submissions``;
            ``"secret"``: a file no student may read.

    Returns:
        ``{student: {"expect": expectation}}``, the student as grades.csv and the console show
        the name (escaped when it is not printable). ``expectation`` is ``{"score": 0.0,
        "refused": text}`` for a notebook refused (its row's total is 0, and ``text`` is in its
        ``notes`` and on the console), ``{"refused": text}`` for a whole folder refused (its row
        has no scores), ``{"score": 0.0, "student_cell": text}`` for a name that must be written
        as ``text`` in the CSV (a neutralised formula).
    """
    submissions = pathlib.Path(submissions)
    solution, other, secret = (pathlib.Path(paths[key]) for key in ("solution", "other", "secret"))
    notebook = solution.name
    expected: dict[str, dict] = {}

    def folder(name: str | bytes) -> pathlib.Path:
        path = pathlib.Path(os.fsdecode(os.path.join(os.fsencode(submissions), os.fsencode(name))))
        path.mkdir()
        return path

    # Links to what a student must not hand in as their own: scored 0, never read.
    for name, target in (("links_to_solution", solution), ("links_to_classmate", other),
                         ("links_to_secret", secret), ("links_to_dev_zero", pathlib.Path("/dev/zero"))):
        (folder(name) / notebook).symlink_to(target)
        expected[name] = {"expect": {"score": 0.0, "refused": "it is a symbolic link"}}
    os.mkfifo(folder("fifo") / notebook)                 # would block a reader forever
    expected["fifo"] = {"expect": {"score": 0.0, "refused": "it is a FIFO"}}
    with open(folder("too_big") / notebook, "wb") as handle:   # sparse: no disk used
        handle.truncate(MAX_NOTEBOOK_BYTES + 1)
    expected["too_big"] = {"expect": {"score": 0.0, "refused": f"{MAX_NOTEBOOK_BYTES + 1:,} bytes"}}
    cell = {"cell_type": "code", "source": "", "metadata": {}, "outputs": [], "execution_count": None}
    (folder("many_cells") / notebook).write_text(_empty_notebook([cell] * (MAX_CELLS + 1)))
    expected["many_cells"] = {"expect": {"score": 0.0, "refused": f"{MAX_CELLS + 1:,} cells"}}
    # A classmate's whole folder, linked: would grade their work twice.
    (submissions / "links_to_classmates_folder").symlink_to(other.parent, target_is_directory=True)
    expected["links_to_classmates_folder"] = {"expect": {"refused": "the folder is a symbolic link"}}
    # Names: bytes that are not UTF-8, a newline forging a row, terminal escapes, the grades file.
    for name, reason in ((b"caf\xe9", "not UTF-8"), ("forged\n0,11,11", "not printable"),
                         ("\x1b]0;pwned\x07\x1b[2K", "not printable"), ("evil\u202etxt.exe", "not printable"),
                         ("grades.csv", "the grades file")):
        (folder(name) / notebook).write_text(_empty_notebook())
        expected[display(os.fsdecode(name))] = {"expect": {"refused": reason}}
    (folder(FORMULA_NAME) / notebook).write_text(_empty_notebook())
    expected[FORMULA_NAME] = {"expect": {"score": 0.0, "student_cell": "'" + FORMULA_NAME}}
    return expected
