"""The package's seams: no module reaches into another's private names, and imports form no cycle.

Both are read from the source with ``ast`` (nothing is imported), so a lazy import inside a
function counts as much as one at the top of a file.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "attn_course"


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


def import_graph() -> dict[str, set[str]]:
    """Module to the attn_course modules it imports (``from pkg import submodule`` points at the submodule)."""
    graph = {}
    for name, path in MODULES.items():
        targets = set()
        for module, imported, _ in imports(path):
            target = f"{module}.{imported}" if imported and is_module(f"{module}.{imported}") else module
            if target != name and is_module(target):
                targets.add(target)
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_module_imports_another_modules_private_names():
    assert private_imports() == []


def test_the_package_imports_form_no_cycle():
    assert find_cycle(import_graph()) is None


def test_the_checks_catch_what_they_look_for(tmp_path, monkeypatch):
    # A planted private import and a planted cycle must both be found.
    fake = tmp_path / "attn_course"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "a.py").write_text("from attn_course.b import _helper\n")
    (fake / "b.py").write_text("def f():\n    from attn_course import a\n\n\ndef _helper():\n    pass\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    monkeypatch.setattr(__import__(__name__), "MODULES",
                        {module_name(path): path for path in sorted(fake.rglob("*.py"))})
    assert private_imports() == ["attn_course/a.py:1: from attn_course.b import _helper"]
    assert find_cycle(import_graph()) == ["attn_course.a", "attn_course.b", "attn_course.a"]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_has_a_docstring(name):
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    assert ast.get_docstring(tree), f"{name} has no module docstring saying what it holds"
