"""Nothing a student can read before an exercise, or call from the package, answers it.

A student who types ``help(check_query_gradient)`` reads the check's docstring, a chapter's
``show_source(...)`` cells print library code, and every function of ``attn_course`` can be imported.
Each of these tests runs what a student could copy or call from there, as it stands, in place of an
exercise's answer, under the exercise's public tests as otter runs them (the hidden ones may read the
chapter's own variables; the public ones call the checks, which hold the rules): at least one must
fail, where the solution passes the same tests in the same namespace.

* every Example of every function and class in ``attn_course.checks`` (the checks show wrong answers
  and the message they get, never a working one), for each exercise whose tests call its module;
* every function that a ``show_source`` cell prints, for each exercise after that cell;
* every function, class and Triton kernel of the package, public or private, that can be called with
  the answer's arguments: the package answers an exercise only with what the exercise forbids by
  name, and the checks' own references refuse to be an answer (``CHECKS_RULE``).

Each function an example or a listing defines is tried under each name the exercise's solution
defines, so an answer copied under another name is caught too.
"""

from __future__ import annotations

import ast
import doctest
import functools
import importlib
import inspect
import pkgutil
import re
import signal
import textwrap

import nbformat
import pytest
import torch

import attn_course
import attn_course.checks
from tools import assign

from support.exercises import (
    CHAPTERS,
    answer_names,
    chapter_namespace,
    code_cells_by_question,
    failures,
    question_tests,
)

PARSER = doctest.DocTestParser()


def check_modules() -> dict[str, object]:
    """{module name: module} of attn_course.checks."""
    return {info.name: importlib.import_module(f"attn_course.checks.{info.name}")
            for info in pkgutil.iter_modules(attn_course.checks.__path__)}


def documented(module) -> list[tuple[str, str]]:
    """(qualified name, docstring) of every function, class and method of ``module`` with an Example."""
    found = []
    for name, value in vars(module).items():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        members = [(name, value)]
        if inspect.isclass(value):
            members += [(f"{name}.{n}", m) for n, m in vars(value).items() if inspect.isfunction(m)]
        found += [(n, m.__doc__) for n, m in members if m.__doc__ and ">>>" in m.__doc__]
    return found


def example_namespace(docstring: str, namespace: dict, where: str) -> dict:
    """``namespace`` after running every Example line of ``docstring`` in it (a failing line, such
    as a check shown failing, is passed over, as a student copying the example would)."""
    for example in PARSER.get_examples(docstring):
        try:
            exec(compile(example.source, where, "single"), namespace)
        except BaseException:  # noqa: BLE001 - the examples show failures on purpose
            pass
    return namespace


def candidates(before: dict, after: dict) -> list[object]:
    """What running a piece of code added to a namespace: the functions it defined, then its values."""
    added = [after[name] for name in after if name not in before or after[name] is not before[name]]
    return [value for value in added if inspect.isfunction(value)] + \
           [value for value in added if not callable(value) and not inspect.ismodule(value)]


@functools.cache
def example_candidates(master, module_name: str, where: str, docstring: str) -> tuple:
    """What one docstring's Example defines when run in a chapter's namespace (run once per
    chapter: the exercises of a chapter share their check modules)."""
    namespace = chapter_namespace(master)
    before = dict(namespace)
    example_namespace(docstring, namespace, f"<{module_name}.{where} Example>")
    return tuple(candidates(before, namespace))


def answers_pass(namespace: dict, names: list[str], tests: list[str], question: str, value: object) -> str | None:
    """The name under which ``value`` passes every test of ``question``, or None."""
    for name in names:
        trial = dict(namespace, **{name: value})
        if callable(value) != callable(namespace.get(name, value)):
            continue
        if not failures(tests, trial, question):
            return name
    return None


def exercises():
    """Each question with its public tests that need nothing but the chapter's imports and the answers (the
    others read the chapter's variables, such as its model), and its answer names."""
    for master in CHAPTERS:
        tests, names, imported = question_tests(master), answer_names(master), set(chapter_namespace(master))
        for question in tests:
            known = imported | set(names.get(question, []))
            runnable = [test for test in tests[question] if set(assign.free_names(ast.parse(test))) <= known]
            yield pytest.param(master, question, runnable, names.get(question, []), id=f"{master.stem[:2]}-{question}")


def solution_namespace(master, question: str) -> dict:
    """The chapter's imports and the solution cells of ``question``, run."""
    namespace = chapter_namespace(master)
    for cell, _, cell_question, in_tests in code_cells_by_question(master):
        if cell_question == question and not in_tests and "# BEGIN SOLUTION" in cell.source:
            exec(compile(cell.source, f"<{master.stem} {question} solution>", "exec"), namespace)
    return namespace


def solution_passes(master, question: str, tests: list[str]) -> bool:
    """Whether the solution passes ``tests`` in the chapter's namespace: without that, a candidate failing
    them would prove nothing."""
    return bool(tests) and not failures(tests, solution_namespace(master, question), question)


@pytest.mark.slow
@pytest.mark.parametrize("master, question, tests, names", list(exercises()))
def test_no_check_docstring_example_answers_the_exercise(master, question, tests, names):
    assert names, f"{master.stem}: found no answer name in the solution of {question}"
    assert solution_passes(master, question, tests)
    modules = check_modules()
    called = set(re.findall(r"\b(check_\w+)", "\n".join(tests)))
    used = [module for module in modules.values() if called & set(vars(module))]
    assert used, f"{master.stem} {question}: its tests call no check of attn_course.checks"
    passing = []
    for module in used:
        for where, docstring in documented(module):
            for value in example_candidates(master, module.__name__, where, docstring):
                name = answers_pass(chapter_namespace(master), names, tests, question, value)
                if name:
                    passing.append(f"{module.__name__}.{where}: {getattr(value, '__name__', value)!r} as {name}")
    assert not passing, f"{master.stem} {question} is answered by a docstring Example: {passing}"


def shown_sources(master) -> list[tuple[int, str, dict]]:
    """(cell index, source, its module's globals) of each object a ``show_source(...)`` cell shows."""
    shown = []
    namespace = chapter_namespace(master)
    for index, cell in enumerate(nbformat.read(master, as_version=4).cells):
        if cell.cell_type != "code":
            continue
        for expression in re.findall(r"show_source\(([^()]+)\)", cell.source):
            # the object shown, whatever keywords (docstring=, start=, stop=) trim its listing: the
            # whole of its source is tried, which is stricter than the excerpt shown
            obj = eval(f"(lambda obj, **keywords: obj)({expression})", namespace)
            if isinstance(obj, str):               # shown by its dotted name: import it here
                module, _, name = obj.rpartition(".")
                obj = getattr(importlib.import_module(module), name)
            obj = getattr(obj, "fn", obj)          # a Triton kernel: the function it was made from
            shown.append((index, textwrap.dedent(inspect.getsource(obj)), vars(inspect.getmodule(obj))))
    return shown


def question_cells(master) -> dict[str, int]:
    """{question: the index of its BEGIN QUESTION cell}."""
    found = {}
    for index, cell in enumerate(nbformat.read(master, as_version=4).cells):
        if cell.cell_type == "raw" and cell.source.startswith("# BEGIN QUESTION"):
            found[re.search(r"name:\s*(\S+)", cell.source).group(1)] = index
    return found


@pytest.mark.slow
@pytest.mark.parametrize("master, question, tests, names", list(exercises()))
def test_no_listing_shown_before_the_exercise_answers_it(master, question, tests, names):
    assert solution_passes(master, question, tests)
    start = question_cells(master)[question]
    passing = []
    for index, code, module_globals in shown_sources(master):
        if index > start:
            continue
        namespace = dict(module_globals, **chapter_namespace(master))
        before = dict(namespace)
        try:
            exec(compile(code, f"<{master.stem} cell {index} listing>", "exec"), namespace)
        except Exception:  # noqa: BLE001 - a method's listing, or one that needs its module's names
            continue
        for value in candidates(before, namespace):
            name = answers_pass(chapter_namespace(master), names, tests, question, value)
            if name:
                passing.append(f"cell {index}: {getattr(value, '__name__', value)!r} as {name}")
    assert not passing, f"{master.stem} {question} is answered by a listing shown before it: {passing}"


def passing_examples() -> list[str]:
    """Every Example line of attn_course.checks that calls a check and shows it passing (``True``)."""
    found = []
    for module in check_modules().values():
        for where, docstring in documented(module):
            for example in PARSER.get_examples(docstring):
                if re.search(r"\bcheck_\w+\(", example.source) and example.want.strip() == "True":
                    found.append(f"{module.__name__}.{where}: {example.source.strip()}")
    return found


def test_no_check_docstring_shows_a_check_passing():
    # A passing call shows an answer: a working function, or a library function that the exercise
    # forbids calling. The Examples show wrong answers and the message each gets.
    assert not passing_examples(), "\n".join(passing_examples())


# --- every callable of the package -------------------------------------------------------------------------------

#: Modules whose functions are not tried, and why: called with an exercise's arguments they would wait on
#: other processes, not fail.
NOT_TRIED = {"attn_course.distributed.launch": "starts worker processes and waits on their rendezvous",
             "attn_course.distributed.torchrun_demo": "a torchrun entry point: joins a process group"}
#: Seconds one callable gets on one exercise's tests: a callable still running then fails the test, since
#: whether it answers is unknown. Training runs (they read any first argument as a configuration and train
#: for minutes) get one second and are let go: what they return is a model and its history, not an answer.
SECONDS = 6
TRAINING_RUNS = {"attn_course.circuits.rhymes.train_rhymes_model",
                 "attn_course.circuits.training.train_induction_model",
                 "attn_course.models.two_relations.train_two_relation_model",
                 "attn_course.open_models.training.train_small_decoder",
                 "attn_course.recall.training.train_recall_model"}


class OutOfTime(BaseException):
    """Raised in the callable tried when its time is up (not an Exception: no check may catch it)."""


@functools.cache
def package_callables() -> dict[str, object]:
    """{dotted name: object} of every function, class and Triton kernel ``attn_course`` defines."""
    found = {}
    for info in pkgutil.walk_packages(attn_course.__path__, "attn_course."):
        if info.name in NOT_TRIED:
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            kernel = getattr(value, "fn", None) if type(value).__name__ == "JITFunction" else None
            if (inspect.isfunction(value) or inspect.isclass(value) or kernel) and \
                    getattr(kernel or value, "__module__", None) == info.name:
                found[f"{info.name}.{name}"] = value
    return found


def positional_count(master, name: str) -> int | None:
    """How many arguments the solution's ``def name`` requires (None: the answer is not a function)."""
    for cell, _, _, _ in code_cells_by_question(master):
        for node in ast.parse(cell.source).body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return len(node.args.posonlyargs) + len(node.args.args) - len(node.args.defaults)
    return None


def callable_with(value: object, count: int) -> bool:
    try:
        inspect.signature(getattr(value, "fn", value)).bind(*[None] * count)
    except (TypeError, ValueError):
        return False
    return True


def tried(namespace: dict, name: str, tests: list[str], question: str, value: object, seconds: float) -> str:
    """``"passed"``, ``"failed"`` or ``"out of time"``: ``value`` under ``name``, against every test."""
    state = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads())

    def out_of_time(signum, frame):
        raise OutOfTime

    previous = signal.signal(signal.SIGALRM, out_of_time)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return "failed" if failures(tests, dict(namespace, **{name: value}), question) else "passed"
    except OutOfTime:
        return "out of time"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        torch.set_default_dtype(state[0])           # what a callable may have changed, put back for the next
        torch.set_grad_enabled(state[1])
        torch.set_num_threads(state[2])


@pytest.mark.slow
@pytest.mark.parametrize("master, question, tests, names", list(exercises()))
def test_no_function_of_the_package_answers_the_exercise(master, question, tests, names):
    answers = {name: positional_count(master, name) for name in names}
    answers = {name: count for name, count in answers.items() if count is not None}
    if not answers:
        pytest.skip(f"{master.stem} {question} asks for values, not a function")
    assert solution_passes(master, question, tests)
    namespace = chapter_namespace(master)
    passing, slow = [], []
    for name, count in answers.items():
        for dotted, value in package_callables().items():
            if callable_with(value, count):
                training = dotted in TRAINING_RUNS
                verdict = tried(namespace, name, tests, question, value, 1 if training else SECONDS)
                if verdict == "passed":
                    passing.append(f"{dotted} as {name}")
                elif verdict == "out of time" and not training:
                    slow.append(dotted)
    assert not passing, f"{master.stem} {question} is answered by the package: {passing}"
    assert not slow, f"{master.stem} {question}: these ran past {SECONDS} s, so whether they answer is unknown: {slow}"
