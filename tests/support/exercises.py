"""A chapter's exercises read from its master notebook, and run as otter runs them, without otter.

Shared by the grading tests (planted mistakes, untouched answers) and the checks' tests (no
docstring example answers an exercise).
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import subprocess

import nbformat
from IPython.core.inputtransformer2 import TransformerManager

from attn_course_grading.assignment import import_statements
from tools import assign, lab

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def chapter_imports(master: pathlib.Path) -> list[ast.stmt]:
    """The chapter's code cells' top-level imports, as the grader finds them."""
    imports = []
    for cell in nbformat.read(master, as_version=4).cells:
        if cell.cell_type == "code" and cell.source.strip():
            imports += import_statements(ast.parse(TransformerManager().transform_cell(cell.source)))
    return imports


def chapter_namespace(master: pathlib.Path) -> dict:
    """A namespace holding what the chapter imports (:func:`chapter_imports`)."""
    namespace: dict = {"__name__": "__chapter__"}
    module = ast.Module(body=chapter_imports(master), type_ignores=[])
    exec(compile(module, f"<{master.stem} imports>", "exec"), namespace)
    return namespace


def code_cells_by_question(master: pathlib.Path):
    """Each code cell of a master notebook with its first line, its question (None before the
    first) and whether it sits between ``# BEGIN TESTS`` and ``# END TESTS``."""
    question, in_tests = None, False
    for cell in nbformat.read(master, as_version=4).cells:
        first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
        if cell.cell_type == "raw":
            if first == "# BEGIN QUESTION":
                question = re.search(r"name:\s*(\S+)", cell.source).group(1)
            in_tests = {"# BEGIN TESTS": True, "# END TESTS": False}.get(first, in_tests)
        elif cell.cell_type == "code":
            yield cell, first, question, in_tests


def question_tests(master: pathlib.Path, *, hidden: bool = False) -> dict[str, list[str]]:
    """{question: the sources of its test cells}, from a master notebook: the public ones, and
    with ``hidden`` the ``# HIDDEN`` ones too (without that line)."""
    found: dict[str, list[str]] = {}
    for cell, first, question, in_tests in code_cells_by_question(master):
        if in_tests and first and not first.startswith("# HIDDEN"):
            found.setdefault(question, []).append(cell.source)
        elif in_tests and first and hidden:
            found.setdefault(question, []).append(cell.source.split("\n", 1)[1])
    return found


def public_tests(master: pathlib.Path) -> dict[str, list[str]]:
    """{question: the sources of its public (not ``# HIDDEN``) test cells}, from a master notebook."""
    return question_tests(master)


def answer_names(master: pathlib.Path) -> dict[str, list[str]]:
    """{question: the names its solution cells define (functions and values)}."""
    found: dict[str, list[str]] = {}
    for cell, _, question, _ in code_cells_by_question(master):
        if question and "# BEGIN SOLUTION" in cell.source:
            for node in ast.parse(TransformerManager().transform_cell(cell.source)).body:
                if isinstance(node, ast.FunctionDef):
                    found.setdefault(question, []).append(node.name)
                elif isinstance(node, ast.Assign):
                    found.setdefault(question, []).extend(t.id for t in node.targets if isinstance(t, ast.Name))
    return found


def exception_test_source(source: str) -> str:
    """One test cell as otter runs it (tools/assign.py's exception-based test and its call)."""
    return assign.exception_test(source, "public_test")


def otter_run(autograder: pathlib.Path, notebook: pathlib.Path, out: pathlib.Path) -> dict[str, dict]:
    """``otter run``'s own grading of ``notebook`` (the notebook and the tests in one kernel,
    unsandboxed): ``{question: its result}``, each with ``score``, ``max_score`` and ``output``."""
    completed = subprocess.run(assign.otter_command() + ["run", "-a", str(autograder), "-o", str(out), str(notebook)],
                               env=lab.lab_environment(), capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return {t["name"]: t for t in json.loads((out / "results.json").read_text())["tests"] if "max_score" in t}


def failures(tests: list[str], namespace: dict, question: str) -> list[str]:
    """Run ``tests`` in ``namespace`` as otter would; the message of each that fails."""
    messages = []
    for source in tests:
        try:
            exec(compile(exception_test_source(source), f"<{question} test>", "exec"), namespace)
        except Exception as error:   # noqa: BLE001 - otter counts any exception as a failed test
            messages.append(f"{type(error).__name__}: {error}")
    return messages
