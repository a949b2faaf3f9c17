"""Grade one submission of one chapter: its notebook in a sandbox, the tests in a grading process.

An :class:`Assignment` is what ``make assignments`` built for a chapter (``dist/autograder/``):
the otter test files of its questions (public and hidden) and the solution notebook. From the
solution notebook it learns, once, three things:

- the **answers**: the names the exercise cells define (``def stable_softmax``...), which the
  tests will find as proxies of the submission's own (:mod:`attn_course_grading.remote`);
- the chapter's **imports**, run by the grader, so that ``torch``, the checks and the course's
  functions the tests use are the grader's own, never the submission's;
- the **context**: the few teaching cells that build what the tests read besides those (chapter
  08's tests read the BERT ``model`` and ``tokenizer``), found by following the names back
  through the cells, built once per chapter (:meth:`Assignment.shipped_context`).

:func:`grade` then starts a grading process for the submission alone, which runs the
submission (:class:`~attn_course_grading.remote.Submission`) and otter's own test-file runner
on an environment of the imports, the context and the proxies, so scores and feedback read
exactly as ``otter run`` gives them, but no test runs in the student's process and nothing but
data comes out of it. What an answer returns, and what the checks make of it, stays in that
grading process, under its own memory limit and time: a class graded at once (``make grade
--jobs N``) shares nothing but the machine. A program that calls :func:`grade` starts those
processes with multiprocessing's fork server, so its main code must sit under
``if __name__ == "__main__":`` (``tools/grade.py``'s does).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import ctypes
import importlib
import io
import json
import multiprocessing
import multiprocessing.connection
import os
import pathlib
import pickle
import re
import resource
import select
import signal
import sys
import threading
import time
import traceback
import types
import zipfile

import nbformat
import torch
from IPython.core.inputtransformer2 import TransformerManager

from attn_course_grading import collect, sandbox
from attn_course_grading.remote import Submission

#: Each question's tests start from this seed (in the grading process of each submission).
TEST_SEED = 0


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
        self.points = self._points()
        self._environment: dict | None = None
        self._shipped: bytes | None = None
        self._lock = threading.Lock()
        # The grading processes start with the chapter's modules imported (see _process_context).
        _PRELOAD.update(node.module if isinstance(node, ast.ImportFrom) else alias.name
                        for node in imports for alias in node.names if getattr(node, "level", 0) == 0)

    def __getstate__(self) -> dict:
        # What a grading process receives: the tests, answers and cells; never the built context
        # (it comes as shipped_context()) nor the lock.
        state = dict(self.__dict__, _environment=None, _shipped=None)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _points(self) -> dict[str, float]:
        """``{question: its points}``, read by otter from the test files, in the tests' order."""
        from otter.test_files.exception_test import ExceptionTestFile

        points = {}
        for name, source in self.tests.items():
            test_file = ExceptionTestFile.from_string(source, path=f"tests/{name}.py")
            points[test_file.name] = round(test_file.possible, 5)
        return points

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


    def shipped_context(self) -> bytes:
        """The chapter's context as the grading processes receive it: built once, in a process
        of its own (the teaching cells' prints and settings stay there), and pickled; empty when
        some value cannot be pickled (each grading process then builds the context itself).

        Chapter 08's context trains a small model (about 30 s): built once per chapter, it costs
        each submission only its unpickling.
        """
        with self._lock:
            if self._shipped is None:
                process_context = _process_context()
                receiving, sending = process_context.Pipe(duplex=False)
                child = process_context.Process(target=_ship_context, args=(self, sending), daemon=True,
                                                name=f"context of {self.name}")
                child.start()
                sending.close()
                try:
                    self._shipped = receiving.recv_bytes()
                except EOFError:
                    raise RuntimeError(f"Assignment: building {self.name}'s context failed "
                                       f"(its process ended with code {child.exitcode})") from None
                finally:
                    receiving.close()
                    child.join()
                    child.close()
            return self._shipped

    def environment_from(self, shipped: bytes) -> dict:
        """The namespace the tests run in, from :meth:`shipped_context` (modules imported again
        by name, every other value unpickled: this process's own copy); or, when ``shipped`` is
        empty, :meth:`environment`."""
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


def grade(assignment: Assignment, notebook: pathlib.Path, limits: sandbox.Limits | None = None, *,
          sandboxed: bool = True) -> dict:
    """Grade one notebook: run it (sandboxed unless ``sandboxed=False``) and every test, in a
    process of its own.

    The notebook is read here (:func:`~attn_course_grading.collect.read_code_cells`); the rest
    happens in a grading process started for this submission alone (:func:`_grade_in_child`):
    the :class:`~attn_course_grading.remote.Submission`, and otter's tests calling its answers.
    That process holds whatever the answers return and whatever the checks make of it, under a
    memory limit of its own (its address space when it starts, plus ``limits.memory_bytes``),
    with its own random generator, thread setting and standard output, so a submission can
    neither exhaust this process's memory nor delay or silence the submissions graded beside it.
    Its phases are timed from here: the notebook gets ``limits.seconds``; the tests, once it has
    run, ``limits.seconds + limits.call_seconds`` in all (every call of the answers together gets
    ``limits.seconds``, the checks' own work one call's time more). A grading process past its
    time is killed with its sandbox; the questions it had not graded score 0, and ``run["stopped"]``
    says why.

    Args:
        assignment: the chapter's :class:`Assignment`.
        notebook: the student's ``.ipynb``.
        limits: :class:`~attn_course_grading.sandbox.Limits` (the defaults when None).
        sandboxed: False for trusted submissions only (``make grade TRUSTED=1``).

    Returns:
        ``{"questions": [{"name", "score", "max_score", "output"}...], "run": {...}}``: per
        question what ``otter run`` reports, and how the run went (seconds, the cells that
        failed, why it stopped if it did, the notebook's peak memory and processes, the grading
        process's peak memory, how much the notebook printed and the start of it). Plain data
        (JSON-safe).

    Raises:
        TypeError: ``assignment`` is not an :class:`Assignment`, or ``limits`` not a ``Limits``.
        RuntimeError: the grader itself failed (not the submission): the grading process's
            traceback.
    """
    if not isinstance(assignment, Assignment):
        raise TypeError(f"grade: assignment must be an Assignment, got {type(assignment).__name__}")
    limits = sandbox.Limits() if limits is None else limits
    if not isinstance(limits, sandbox.Limits):
        raise TypeError(f"grade: limits must be a sandbox.Limits, got {type(limits).__name__}")
    started = time.monotonic()
    try:
        cells, problem = collect.read_code_cells(notebook), None
    except (ValueError, OSError) as error:   # an unreadable notebook runs empty and scores 0, with the reason
        cells, problem = [], f"the notebook could not be read: {str(error)[:300]}"
    shipped = assignment.shipped_context()
    process_context = _process_context()
    receiving, sending = process_context.Pipe(duplex=False)
    child = process_context.Process(target=_grade_in_child, name=f"grade {assignment.name}", daemon=True,
                                    args=(assignment, shipped, cells, limits, sandboxed, sending))
    child.start()
    sending.close()                # the child holds the only writing end: its end of the pipe is an EOF here
    try:
        questions, run, stopped, failure = _collect(receiving, child, limits)
    finally:
        receiving.close()
        if child.is_alive():
            child.kill()
        child.join()
        child.close()
    if failure is not None:
        raise RuntimeError(f"grade: the grader failed on {pathlib.Path(notebook).name}:\n{failure}")
    graded = {question["name"]: question for question in questions}
    return {
        "questions": [graded.get(name) or {"name": name, "score": 0, "max_score": points,
                                           "output": f"{name}: not graded: {stopped or 'the grading process ended'}"}
                      for name, points in assignment.points.items()],
        "run": {
            "seconds": round(time.monotonic() - started, 2), "sandboxed": sandboxed,
            "stopped": problem or stopped, "cell_errors": run.get("cell_errors", []),
            "peak_memory_bytes": run.get("peak_memory_bytes", 0), "peak_processes": run.get("peak_processes", 0),
            "grader_peak_memory_bytes": run.get("grader_peak_memory_bytes", 0),
            "output_bytes": run.get("output_bytes", 0), "output_start": run.get("output_start", ""),
        },
    }


#: The most a grading process's message may hold (its questions' feedback is far smaller).
MAX_RESULT_BYTES = 16 * 2**20
#: How long past its phase's time a grading process is given to stop by itself (it kills its own
#: sandbox and says why) before this process kills it.
KILL_GRACE_SECONDS = 10.0


def _collect(receiving, child, limits: sandbox.Limits) -> tuple[list[dict], dict, str | None, str | None]:
    """Read a grading process's messages until it ends or runs past its phase's time.

    Returns:
        ``(questions graded, run, why it stopped or None, the grader's own traceback or None)``.
    """
    questions: list[dict] = []
    run: dict = {}
    stopped = failure = None
    done = False
    # Setting up (the chapter's context) may take as long as the notebook; then each phase its own time.
    deadline = time.monotonic() + limits.seconds + KILL_GRACE_SECONDS
    late = f"the grader's set-up of its tests ran past {limits.seconds:g} s"
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not multiprocessing.connection.wait([receiving], timeout=left):
            child.kill()                  # its sandbox dies with it (bubblewrap --die-with-parent)
            return questions, run, stopped or late, failure
        try:
            kind, value = json.loads(receiving.recv_bytes(MAX_RESULT_BYTES))
        except EOFError:                  # it ended: said why, or was killed
            break
        except (OSError, ValueError) as error:
            child.kill()
            return questions, run, stopped or f"the grader's process sent a bad message ({error})", failure
        if kind == "started":
            deadline = time.monotonic() + limits.seconds + KILL_GRACE_SECONDS
            late = f"stopped after {limits.seconds:g} s, the time limit of the whole notebook"
        elif kind == "ran":
            run = value
            seconds = limits.seconds + limits.call_seconds
            deadline = time.monotonic() + seconds + KILL_GRACE_SECONDS
            late = f"the grader's tests of it ran past {seconds:g} s in all"
        elif kind == "question":
            questions.append(value)
        elif kind == "done":
            run, done = value, True
        elif kind == "stopped":
            stopped = value
        elif kind == "failed":
            failure = value
    child.join(timeout=KILL_GRACE_SECONDS)
    if done:
        stopped = run.get("stopped")
    elif stopped is None and failure is None:      # it died without a word: killed, or crashed
        code = child.exitcode
        stopped = (f"the grader's process for its tests was killed by signal {-code}" if code is not None and code < 0
                   else f"the grader's process for its tests ended with code {code}")
    return questions, run, stopped, failure


# --- the grading process ------------------------------------------------------------------------

#: Modules the grading processes' fork server imports once, so that each grading process starts
#: with them loaded (every :class:`Assignment` adds the modules its chapter imports).
_PRELOAD = {"torch", "nbformat", "IPython.core.inputtransformer2", "otter.test_files.exception_test",
            "attn_course_grading.collect", "attn_course_grading.remote", "attn_course_grading.grader"}
_PROCESS_CONTEXT: list = []
_PROCESS_CONTEXT_LOCK = threading.Lock()


def _process_context():
    """multiprocessing's fork server, set up once: a process started before any thread of the
    grader's, from which each grading process is forked with the course already imported (a
    fresh Python would import torch, otter and the course for each submission: seconds; a fork
    from this process's own threads could copy a lock another thread holds)."""
    with _PROCESS_CONTEXT_LOCK:
        if not _PROCESS_CONTEXT:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(sorted(_PRELOAD))
            _PROCESS_CONTEXT.append(context)
        return _PROCESS_CONTEXT[0]


def _die_with_parent() -> None:
    """Be killed when the fork server ends (it ends with the grader): no grading process, and so
    no sandbox, outlives the grader (the sandbox is killed when its grading process dies)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def address_space_bytes() -> int:
    """This process's address space (``VmSize`` of ``/proc/self/status``), what RLIMIT_AS counts."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("address_space_bytes: /proc/self/status has no VmSize")


def _grade_in_child(assignment: Assignment, shipped: bytes, cells: list[str], limits: sandbox.Limits,
                    sandboxed: bool, sending) -> None:
    """One submission's grading, in a process of its own (started by :func:`grade`).

    Each message to :func:`grade` is ``[kind, value]`` as JSON: ``started`` (the tests' context
    is ready), ``ran`` (the notebook has run; how it went), ``question`` (one question's result,
    as soon as it is known), ``stopped`` (why this process stops early), ``done`` (how it all
    went), ``failed`` (the grader's own traceback).
    """
    _die_with_parent()
    sending_lock = threading.Lock()

    def send(kind: str, value: object) -> None:
        with sending_lock:
            sending.send_bytes(json.dumps([kind, value]).encode())

    # Whatever the tests print is dropped here (kept, a check printing a huge answer would fill
    # this process's memory); nothing reaches the class's terminal, at Python's level or C's.
    sys.stdout = open(os.devnull, "w")   # this process's standard output until it ends
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    submission = None
    running: list[Submission] = []

    def end_with_the_grader() -> None:
        # The grader's end of the pipe closes when the grader ends, however it ends (killed too):
        # this process's end then reports an error. The fork server it was started from does not
        # end before it does, so this is what ends it, and its sandbox, at once.
        watch = select.poll()
        watch.register(sending.fileno(), select.POLLERR | select.POLLHUP)
        while not watch.poll():
            pass
        for started in running:
            started.close()
        os._exit(4)

    threading.Thread(target=end_with_the_grader, daemon=True).start()
    try:
        environment = assignment.environment_from(shipped)
        # The checks may use as much memory as one process of the notebook, on top of the grader's
        # own code and the chapter's context (soft limit only: the sandbox, started from here, sets
        # its own). Over it, an allocation fails in this process: its test fails, nothing else.
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes() + limits.memory_bytes, hard))
        send("started", None)
        submission = Submission(cells, assignment.answers, limits, sandboxed=sandboxed)
        running.append(submission)
        send("ran", _run_of(submission))
        seconds = limits.seconds + limits.call_seconds

        def stop_late() -> None:
            # The tests' time is up, wherever they are (a check working on a huge answer, a call):
            # this thread runs while the main one is busy in torch, which releases the GIL.
            send("stopped", f"the grader's tests of it ran past {seconds:g} s in all")
            submission.close()
            os._exit(3)

        timer = threading.Timer(seconds, stop_late)
        timer.daemon = True
        timer.start()
        environment.update(submission.answer_values())
        for question in _run_tests(assignment, environment):
            send("question", question)
        timer.cancel()
        submission.close()
        send("done", dict(_run_of(submission), done=True))
    except MemoryError:
        # Past this process's memory limit outside any one test (a reply decoded, otter's own
        # bookkeeping): the submission's doing, so it is stopped, not the grader failed.
        send("stopped", f"the grader's checks of it used more than their {limits.memory_bytes / 2**30:g} GiB "
                        "of memory")
    except BaseException:  # noqa: BLE001 - the grader's own fault, reported with its traceback
        send("failed", traceback.format_exc())
    finally:
        if submission is not None:
            submission.close()
        sending.close()


def _run_of(submission: Submission) -> dict:
    return {"stopped": submission.stopped, "cell_errors": submission.events,
            "peak_memory_bytes": submission.peak_memory_bytes, "peak_processes": submission.peak_tasks,
            "output_bytes": submission.output_size, "output_start": submission.output[:2000],
            "grader_peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _run_tests(assignment: Assignment, environment: dict):
    """Each question's result, as otter gives it, one by one (a generator: sent as each is known)."""
    from otter.test_files.exception_test import ExceptionTestFile

    for name, source in assignment.tests.items():
        test_file = ExceptionTestFile.from_string(source, path=f"tests/{name}.py")
        torch.manual_seed(TEST_SEED)
        test_file.run(environment)
        yield {"name": test_file.name, "score": round(test_file.score, 5),
               "max_score": round(test_file.possible, 5), "output": test_file.summary()}
