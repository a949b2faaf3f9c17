"""Grade one submission of one chapter: its notebook in a sandbox, the tests in this process.

An :class:`Assignment` is what ``make assignments`` built for a chapter (``dist/autograder/``):
the otter test files of its questions (public and hidden) and the solution notebook. From the
solution notebook it learns, once, three things:

- the **answers**: the names the exercise cells define (``def stable_softmax``...), which the
  tests will find as proxies of the submission's own (:mod:`attn_course_grading.remote`);
- the chapter's **imports**, run here, so that ``torch``, the checks and the course's functions
  the tests use are this process's own, never the submission's;
- the **context**: the few teaching cells that build what the tests read besides those (chapter
  08's tests read the BERT ``model`` and ``tokenizer``), found by following the names back
  through the cells, and run here once per chapter.

:func:`grade` then runs the submission (:class:`~attn_course_grading.remote.Submission`) and
otter's own test-file runner on an environment of the imports, the context and the proxies, so
scores and feedback read exactly as ``otter run`` gives them, but no test runs in the student's
process and nothing but data comes out of it.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import io
import pathlib
import re
import threading
import time
import types
import zipfile

import nbformat
import torch
from IPython.core.inputtransformer2 import TransformerManager

from attn_course_grading import sandbox
from attn_course_grading.remote import Submission

# Tests of different submissions never run at once: the checks share this process's random
# generator and its thread setting, and each question's tests start from the same seed.
_TESTS_ONE_AT_A_TIME = threading.Lock()
TEST_SEED = 0
#: A larger notebook is not read (the chapters' executed notebooks are under 2 MB).
MAX_NOTEBOOK_BYTES = 64 * 2**20


def _tree(source: str) -> ast.Module:
    return ast.parse(TransformerManager().transform_cell(source))


def bound_names(tree: ast.AST) -> set[str]:
    """Names a piece of code binds at any level (assignments, defs, imports, loop targets)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def top_level_bound(tree: ast.Module) -> set[str]:
    """Names a cell leaves defined in the notebook: what its top-level statements bind."""
    names = set()
    for node in tree.body:
        names |= bound_names(ast.Module(body=[node], type_ignores=[])) if not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else {node.name}
    return names


def read_names(tree: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


class Assignment:
    """One chapter's autograder: its tests, answers, imports and context.

    Args:
        autograder: ``dist/autograder/NN_name.zip``; the solution notebook ``NN_name.ipynb``
            must lie next to it (``make assignments`` writes both).

    Raises:
        FileNotFoundError: either file is missing.
    """

    def __init__(self, autograder: pathlib.Path):
        autograder = pathlib.Path(autograder)
        solution = autograder.with_suffix(".ipynb")
        for path in (autograder, solution):
            if not path.is_file():
                raise FileNotFoundError(f"Assignment: {path} does not exist; run `make assignments`")
        self.name = autograder.stem
        with zipfile.ZipFile(autograder) as archive:
            self.tests = {pathlib.PurePath(name).stem: archive.read(name).decode()
                          for name in sorted(archive.namelist()) if re.fullmatch(r"tests/[^/]+\.py", name)}
        cells = [cell.source for cell in nbformat.read(solution, as_version=4).cells
                 if cell.cell_type == "code" and cell.source.strip()]
        trees = [_tree(source) for source in cells]
        answer_cells = [i for i, source in enumerate(cells) if "# BEGIN SOLUTION" in source]
        if not answer_cells:
            raise ValueError(f"Assignment: {solution} has no exercise cells (# BEGIN SOLUTION)")
        self.answers = sorted(set().union(*(top_level_bound(trees[i]) for i in answer_cells)))
        imports = [node for tree in trees for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                   and not any(alias.name == "otter" for alias in node.names)]
        self.imports = ast.unparse(ast.Module(body=imports, type_ignores=[]))
        imported = bound_names(ast.Module(body=imports, type_ignores=[]))
        self.context = self._context_cells(cells[:answer_cells[0]], trees[:answer_cells[0]],
                                           self.test_parameters() - set(self.answers) - imported)
        self._environment: dict | None = None
        self._lock = threading.Lock()

    def test_parameters(self) -> set[str]:
        """Every name a test reads: otter passes each test function's parameters by name."""
        names = set()
        for source in self.tests.values():
            for node in ast.parse(source).body:
                if isinstance(node, ast.FunctionDef) and node.decorator_list:
                    names |= {arg.arg for arg in node.args.args}
        return names

    @staticmethod
    def _context_cells(cells: list[str], trees: list[ast.Module], needed: set[str]) -> list[str]:
        """The teaching cells that build ``needed``, found backwards from the last one."""
        chosen = []
        for source, tree in reversed(list(zip(cells, trees))):
            bound = top_level_bound(tree)
            if bound & needed and not source.lstrip().startswith(("import otter", "# Initialize Otter")):
                chosen.append(source)
                # What the cell reads must exist before it (a little too much, for ``x = f(x)``).
                needed = (needed - bound) | {name for name in read_names(tree) if not hasattr(builtins, name)}
        return chosen[::-1]

    def environment(self) -> dict:
        """A fresh namespace of the chapter's imports and context (built once, then copied).

        Each submission gets its own deep copy of the context's values (a model, a batch), so
        that nothing a test or a submission's call changes in them reaches the next submission;
        modules, functions and classes are shared.
        """
        with self._lock:
            if self._environment is None:
                namespace: dict = {"__name__": f"__{self.name}_grader__"}
                dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        exec(compile(self.imports, f"<{self.name} imports>", "exec"), namespace)
                        for index, source in enumerate(self.context):
                            code = TransformerManager().transform_cell(source)
                            exec(compile(code, f"<{self.name} context cell {index}>", "exec"), namespace)
                finally:
                    # A context cell may set what is global to this process (chapter 01's first cell
                    # sets torch's print options): every chapter's tests run with torch's defaults,
                    # so that one chapter's settings never reach another's tests or diagnoses.
                    torch.set_printoptions(profile="default")
                    torch.set_default_dtype(dtype)
                    torch.set_grad_enabled(grad)
                self._environment = namespace
            return {name: _own_copy(value) for name, value in self._environment.items()}


def _own_copy(value: object) -> object:
    if isinstance(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - what cannot be copied (a C extension's object) is shared
        return value


def grade(assignment: Assignment, notebook: pathlib.Path, limits: sandbox.Limits | None = None, *,
          sandboxed: bool = True) -> dict:
    """Grade one notebook: run it (sandboxed unless ``sandboxed=False``), then every test here.

    Args:
        assignment: the chapter's :class:`Assignment`.
        notebook: the student's ``.ipynb``.
        limits: :class:`~attn_course_grading.sandbox.Limits` (the defaults when None).
        sandboxed: False for trusted submissions only (``make grade TRUSTED=1``).

    Returns:
        ``{"questions": [{"name", "score", "max_score", "output"}...], "run": {...}}``: per
        question what ``otter run`` reports, and how the run went (seconds, the cells that
        failed, why the process stopped if it did, how much it printed and the start of it).
    """
    limits = limits or sandbox.Limits()
    started = time.monotonic()
    try:
        size = pathlib.Path(notebook).stat().st_size
        if size > MAX_NOTEBOOK_BYTES:
            raise ValueError(f"{size} bytes, more than {MAX_NOTEBOOK_BYTES}")
        cells = [cell.source for cell in nbformat.read(notebook, as_version=4).cells if cell.cell_type == "code"]
        problem = None
    except Exception as error:  # noqa: BLE001 - an unreadable notebook scores 0, with the reason
        cells, problem = [], f"the notebook could not be read ({type(error).__name__}: {str(error)[:200]})"
    submission = Submission(cells, assignment.answers, limits, sandboxed=sandboxed)
    try:
        environment = assignment.environment()
        environment.update(submission.answer_values())
        questions = _run_tests(assignment, environment)
    finally:
        submission.close()
    return {
        "questions": questions,
        "run": {
            "seconds": round(time.monotonic() - started, 2), "sandboxed": sandboxed,
            "stopped": problem or submission.stopped, "cell_errors": submission.events,
            "peak_memory_bytes": submission.peak_memory_bytes, "peak_processes": submission.peak_tasks,
            "output_bytes": submission.output_size, "output_start": submission.output[:2000],
        },
    }


def _run_tests(assignment: Assignment, environment: dict) -> list[dict]:
    from otter.test_files.exception_test import ExceptionTestFile

    questions = []
    with _TESTS_ONE_AT_A_TIME, contextlib.redirect_stdout(io.StringIO()):
        for name, source in assignment.tests.items():
            test_file = ExceptionTestFile.from_string(source, path=f"tests/{name}.py")
            torch.manual_seed(TEST_SEED)
            test_file.run(environment)
            questions.append({"name": test_file.name, "score": round(test_file.score, 5),
                              "max_score": round(test_file.possible, 5), "output": test_file.summary()})
    return questions
