"""One chapter's autograder, and what its tests need besides the submission's answers.

An :class:`Assignment` is what ``make assignments`` built for a chapter: the otter test files of its
questions and the solution notebook, from which it learns the **answers** (the names the exercise
cells define, which the tests find as proxies of the submission's own), the chapter's **imports**
(run by the grader, so that ``torch`` and the checks are the grader's own) and the **context**: the
teaching cells that build what the tests read besides (chapter 08's BERT ``model``), found by
following names back through the cells and built once per chapter.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import importlib
import io
import pathlib
import pickle
import re
import threading
import types
import zipfile

import nbformat
import torch
from IPython.core.inputtransformer2 import TransformerManager

from attn_course_grading import forkserver


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


def import_statements(tree: ast.Module) -> list[ast.stmt]:
    """A cell's top-level imports: ``import`` and ``from ... import`` statements, and a ``try`` of
    imports whose handlers catch ``ImportError`` (a module that may be missing, and what stands in
    for it: chapter 07's Triton, which ships for Linux only)."""
    def is_import(node: ast.stmt) -> bool:
        return isinstance(node, (ast.Import, ast.ImportFrom))

    def catches_import_error(handler: ast.ExceptHandler) -> bool:
        return isinstance(handler.type, ast.Name) and handler.type.id in ("ImportError", "ModuleNotFoundError")

    return [node for node in tree.body if is_import(node) or (
        isinstance(node, ast.Try) and node.body and all(map(is_import, node.body)) and node.handlers
        and all(map(catches_import_error, node.handlers)) and not node.orelse and not node.finalbody)]


def top_level_bound(tree: ast.Module) -> set[str]:
    """Names a cell leaves defined in the notebook: what its top-level statements bind."""
    return set().union(*({node.name} if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                         else bound_names(node) for node in tree.body))


def read_names(tree: ast.AST) -> set[str]:
    """Names a piece of code reads."""
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


class Assignment:
    """One chapter's autograder: its tests, answers, imports and context.

    Args:
        autograder: ``dist/autograder/NN_name.zip``, with the solution ``NN_name.ipynb`` beside it.

    Raises:
        FileNotFoundError: either file is missing.
        ValueError: the solution notebook has no exercise cells.
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
        trees = [ast.parse(TransformerManager().transform_cell(source)) for source in cells]
        answer_cells = [i for i, source in enumerate(cells) if "# BEGIN SOLUTION" in source]
        if not answer_cells:
            raise ValueError(f"Assignment: {solution} has no exercise cells (# BEGIN SOLUTION)")
        self.answers = sorted(set().union(*(top_level_bound(trees[i]) for i in answer_cells)))
        #: Whether the chapter's cells define Triton kernels (``triton.jit``): grading it needs Triton.
        self.needs_triton = any(isinstance(node, ast.Attribute) and node.attr == "jit"
                                and isinstance(node.value, ast.Name) and node.value.id == "triton"
                                for tree in trees for node in ast.walk(tree))
        imports = [node for tree in trees for node in import_statements(tree)
                   if not any(alias.name == "otter" for alias in getattr(node, "names", ()))]
        self.imports = ast.unparse(ast.Module(body=imports, type_ignores=[]))
        imported = bound_names(ast.Module(body=imports, type_ignores=[]))
        self.context = self._context_cells(cells[:answer_cells[0]], trees[:answer_cells[0]],
                                           self.test_parameters() - set(self.answers) - imported)
        #: ``{question: its points}``, read by otter from the test files, in the tests' order.
        self.points = {test_file.name: round(test_file.possible, 5) for test_file in self.test_files()}
        self._environment: dict | None = None
        self._shipped: bytes | None = None
        self._lock = threading.Lock()
        # The grading processes start with the chapter's modules imported.
        # (forkserver skips a module that fails to import: Triton where it is missing)
        forkserver.PRELOAD.update(node.module if isinstance(node, ast.ImportFrom) else alias.name
                                  for statement in imports for node in ast.walk(statement)
                                  if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "level", 0) == 0
                                  for alias in node.names)

    def __getstate__(self) -> dict:
        # A grading process receives the tests, answers and cells; the context comes as shipped_context().
        state = dict(self.__dict__, _environment=None, _shipped=None)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def test_files(self):
        """Each question's otter ``ExceptionTestFile``, in the tests' order (made anew at each call)."""
        from otter.test_files.exception_test import ExceptionTestFile

        for name, source in self.tests.items():
            yield ExceptionTestFile.from_string(source, path=f"tests/{name}.py")

    def test_parameters(self) -> set[str]:
        """Every name a test reads: otter passes each test function's parameters by name."""
        return {arg.arg for source in self.tests.values() for node in ast.parse(source).body
                if isinstance(node, ast.FunctionDef) and node.decorator_list for arg in node.args.args}

    @staticmethod
    def _context_cells(cells: list[str], trees: list[ast.Module], needed: set[str]) -> list[str]:
        """The teaching cells that build ``needed``, found backwards from the last one."""
        chosen = []
        for source, tree in reversed(list(zip(cells, trees))):
            bound = top_level_bound(tree)
            if bound & needed and not re.search(r"^import otter$", source, re.MULTILINE):
                chosen.append(source)
                # What the cell reads must exist before it (a little too much, for ``x = f(x)``).
                needed = (needed - bound) | {name for name in read_names(tree) if not hasattr(builtins, name)}
        return chosen[::-1]

    def environment(self) -> dict:
        """A fresh namespace of the chapter's imports and context, built once: each call gets its
        own deep copy of the values (a model, a batch), sharing only modules, functions and classes."""
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
                    # A context cell may set torch's global state (chapter 01's print options): every
                    # chapter's tests run with torch's defaults.
                    torch.set_printoptions(profile="default")
                    torch.set_default_dtype(dtype)
                    torch.set_grad_enabled(grad)
                self._environment = namespace
            return {name: _own_copy(value) for name, value in self._environment.items()}

    def shipped_context(self) -> bytes:
        """The context pickled, built once in a process of its own (chapter 08's trains a model for
        30 s); empty when a value cannot be pickled (each grading process then builds it).

        Raises:
            RuntimeError: the process building it ended without sending it.
        """
        with self._lock:
            if self._shipped is None:
                server = forkserver.context()
                receiving, sending = server.Pipe(duplex=False)
                child = server.Process(target=_ship_context, args=(self, sending), daemon=True,
                                       name=f"context of {self.name}")
                child.start()
                sending.close()
                try:
                    self._shipped = receiving.recv_bytes()
                except EOFError:
                    child.join()        # its exit code is known only once it has been joined
                    raise RuntimeError(f"Assignment: building {self.name}'s context failed "
                                       f"(its process ended with code {child.exitcode})") from None
                finally:
                    receiving.close()
                    child.join()
                    child.close()
            return self._shipped

    def environment_from(self, shipped: bytes) -> dict:
        """The namespace the tests run in, from :meth:`shipped_context` (modules imported by name,
        the rest unpickled), or :meth:`environment` when ``shipped`` is empty.

        Raises:
            TypeError: ``shipped`` is not bytes.
        """
        if not isinstance(shipped, bytes):
            raise TypeError(f"Assignment.environment_from: shipped must be bytes, got {type(shipped).__name__}")
        if not shipped:
            return self.environment()
        modules, values = pickle.loads(shipped)
        return {"__name__": f"__{self.name}_grader__", **{name: importlib.import_module(module)
                                                          for name, module in modules.items()}, **values}


def _ship_context(assignment: Assignment, sending) -> None:
    """Build ``assignment``'s context and send it pickled (b"" when a value cannot be pickled)."""
    try:
        environment = assignment.environment()
        modules = {name: value.__name__ for name, value in environment.items()
                   if isinstance(value, types.ModuleType)}
        values = {name: value for name, value in environment.items()
                  if name not in modules and not name.startswith("__")}
        try:
            blob = pickle.dumps((modules, values), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - a value defined by a teaching cell itself: built per submission
            blob = b""
        sending.send_bytes(blob)
    finally:
        sending.close()


def _own_copy(value: object) -> object:
    if isinstance(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - what cannot be copied (a C extension's object) is shared
        return value
