"""The docstrings' Examples themselves run as doctests through pytest's ``--doctest-modules``
(pyproject.toml's addopts and testpaths). What pytest does not check is that an Example it would
run is really there: a module that shows ``>>> `` where doctest cannot find it (a comment, a
string that is not a docstring, a function doctest does not see) would pass without running."""

from __future__ import annotations

import doctest
import importlib
import pathlib

try:
    import tomllib
except ImportError:   # Python 3.10: tomli, from the test extra
    import tomli as tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTEST_OPTIONS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
PACKAGES = ("attn_course", "attn_course_grading")
MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for package in PACKAGES
    for path in (ROOT / package).rglob("*.py")
    if path.name != "__main__.py" and ">>> " in path.read_text(encoding="utf-8")
)


def test_pytest_runs_the_packages_doctests():
    assert "--doctest-modules" in PYTEST_OPTIONS["addopts"].split()
    assert set(PACKAGES) <= set(PYTEST_OPTIONS["testpaths"])


@pytest.mark.parametrize("name", MODULES)
def test_every_example_shown_is_one_doctest_runs(name):
    module = importlib.import_module(name)
    found = sum(len(test.examples) for test in doctest.DocTestFinder().find(module, name))
    shown = sum(line.lstrip().startswith(">>> ") for line in pathlib.Path(module.__file__).read_text().splitlines())
    assert found == shown, f"{name} shows {shown} '>>> ' lines but doctest finds {found} examples"


@pytest.mark.parametrize("name", MODULES)
def test_no_example_is_skipped_whole(name):
    """pytest reports a docstring whose every example is ``+SKIP`` as a skipped test, and in CI
    nothing may skip: an example that cannot run here is shown as a literal block instead."""
    module = importlib.import_module(name)
    skipped = [test.name for test in doctest.DocTestFinder().find(module, name)
               if test.examples and all(example.options.get(doctest.SKIP) for example in test.examples)]
    assert not skipped, f"every example of {skipped} is +SKIP: show it as a literal block (Example::)"
