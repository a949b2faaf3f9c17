"""Nothing a student can read before an exercise answers it.

A student who types ``help(check_query_gradient)`` reads the check's docstring, and a chapter's
``show_source(...)`` cells print library code. Each of these tests runs what a student could copy
from there, as it stands, in place of an exercise's answer, under all the exercise's tests (the
public and the hidden ones, as otter runs them): at least one must fail.

* every Example of every function and class in ``attn_course.checks`` (the checks show wrong answers
  and the message they get, never a working one), for each exercise whose tests call its module;
* every function that a ``show_source`` cell prints, for each exercise after that cell.

Each function an example or a listing defines is tried under each name the exercise's solution
defines, so an answer copied under another name is caught too.
"""

from __future__ import annotations

import doctest
import functools
import importlib
import inspect
import pkgutil
import re
import textwrap

import nbformat
import pytest

import attn_course.checks

from support.exercises import CHAPTERS, answer_names, chapter_namespace, failures, question_tests

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
    for master in CHAPTERS:
        tests, names = question_tests(master, hidden=True), answer_names(master)
        for question in tests:
            yield pytest.param(master, question, tests[question], names.get(question, []),
                               id=f"{master.stem[:2]}-{question}")


@pytest.mark.slow
@pytest.mark.parametrize("master, question, tests, names", list(exercises()))
def test_no_check_docstring_example_answers_the_exercise(master, question, tests, names):
    assert names, f"{master.stem}: found no answer name in the solution of {question}"
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
