"""The package's seams: the layers hold (import-linter's contracts in pyproject.toml), and no module
reaches into another's private names (which import-linter does not look at).

Both read the source, importing nothing, so a lazy import inside a function counts as much as one at
the top of a file. The contracts also forbid import cycles (``acyclic_siblings``).
"""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "attn_course"
# import-linter's root packages (pyproject.toml's [tool.importlinter]), copied for the planted violation
ROOT_PACKAGES = ("attn_course", "attn_course_grading", "benchmarks", "gpu_tools")
LINT_IMPORTS = pathlib.Path(sys.executable).parent / "lint-imports"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def is_module(name: str) -> bool:
    return name in MODULES


def imports(path: pathlib.Path) -> list[tuple[str, str | None, int]]:
    """``(module, imported name or None, line)`` for every import of an ``attn_course`` module in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names if alias.name.startswith("attn_course")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("attn_course"):
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
    return found


def private_imports() -> list[str]:
    problems = []
    for name, path in MODULES.items():
        for module, imported, line in imports(path):
            private = imported is not None and imported.startswith("_") and not imported.startswith("__")
            if private and not is_module(f"{module}.{imported}") and module != name:
                problems.append(f"{path.relative_to(PACKAGE.parent)}:{line}: from {module} import {imported}")
    return problems


def lint_imports(root: pathlib.Path) -> subprocess.CompletedProcess:
    """``lint-imports`` as `make lint` runs it, on the checkout (or a copy of it) at ``root``."""
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=root, capture_output=True, text=True,
                          env={"PATH": str(LINT_IMPORTS.parent), "PYTHONPATH": str(root)})


def test_no_module_imports_another_modules_private_names():
    assert private_imports() == []


def test_the_private_name_check_catches_a_planted_one(tmp_path, monkeypatch):
    fake = tmp_path / "attn_course"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "a.py").write_text("from attn_course.b import _helper\n")
    (fake / "b.py").write_text("def _helper():\n    pass\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    monkeypatch.setattr(__import__(__name__), "MODULES",
                        {module_name(path): path for path in sorted(fake.rglob("*.py"))})
    assert private_imports() == ["attn_course/a.py:1: from attn_course.b import _helper"]


def test_the_import_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def copy_of_the_checkout(tmp_path_factory) -> pathlib.Path:
    """The root packages and pyproject.toml, copied: a place to plant violations in."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copy(ROOT / "pyproject.toml", root)
    for package in ROOT_PACKAGES:
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.mark.parametrize("importer, imported, broken", [
    # the core reaching up to a teaching aid, inside a function (a lazy import counts)
    ("attn_course/core/masks.py", "attn_course.teaching.plots",
     "attn_course.core is not allowed to import attn_course.teaching"),
    # the kernels reaching for positions, which the flash layer may not use
    ("attn_course/flash/tiled.py", "attn_course.positions.rope",
     "attn_course.flash is not allowed to import attn_course.positions"),
    # the grader importing a teaching aid
    ("attn_course_grading/wire.py", "attn_course.teaching.widgets",
     "attn_course_grading is not allowed to import attn_course.teaching"),
    # the student package importing the benchmarks
    ("attn_course/measure/timing.py", "benchmarks.selfcheck",
     "attn_course is not allowed to import benchmarks"),
    # a kernel launcher importing the GPU tools, which live outside the package
    ("attn_course/flash/launch.py", "gpu_tools.aot",
     "attn_course is not allowed to import gpu_tools"),
    # a cycle inside one layer, which no layer rule sees: the masks importing the attention that imports them
    ("attn_course/core/masks.py", "attn_course.core.attention",
     "No cycles are allowed in attn_course.core"),
])
def test_a_planted_forbidden_import_fails_lint_imports(copy_of_the_checkout, importer, imported, broken):
    path = copy_of_the_checkout / importer
    original = path.read_text(encoding="utf-8")
    before = lint_imports(copy_of_the_checkout)
    assert broken not in before.stdout, before.stdout           # not broken before the plant
    try:
        path.write_text(original + f"\n\ndef _planted():\n    import {imported}  # noqa: F401\n", encoding="utf-8")
        after = lint_imports(copy_of_the_checkout)
    finally:
        path.write_text(original, encoding="utf-8")
    assert after.returncode != 0
    assert broken in after.stdout, after.stdout
    shown = " ".join(after.stdout.split())                       # import-linter wraps long lines
    assert imported.removeprefix("attn_course.core") in shown, after.stdout   # the planted import is named


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_has_a_docstring(name):
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    assert ast.get_docstring(tree), f"{name} has no module docstring saying what it holds"
