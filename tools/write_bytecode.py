"""Write the bytecode of what the course runs where it cannot write any: `make`'s step after installing.

The grader's sandboxes (`make grade`, and the tests) see .venv read-only, so a module they import without its
bytecode is compiled again in every sandbox, as is a module a hub student's server imports as its own user.
This imports, in one process that can write, every module those processes start with: each chapter's imports,
every module of the course and of its grader, and the hub's single-user server with its kernel. Python writes
each one's bytecode as it imports it: some 3,400 of the 22,000 modules installed, a sixth of the time that
compiling all of them took (29 s on 2 cores, 52 s of CPU). A module imported later, by a cell or a check, is
compiled where it is imported, once per process if that process cannot write.
"""

from __future__ import annotations

import ast
import compileall
import importlib
import json
import pathlib
import pkgutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("attn_course", "attn_course_grading")
#: What a hub student's server imports as it starts, and the kernel it runs the chapters in.
SERVER_MODULES = ("jupyterhub.singleuser", "jupyterlab.labapp", "jupyter_server.serverapp", "ipykernel.kernelapp",
                  "ipykernel.ipkernel", "matplotlib_inline.backend_inline")


def chapter_imports() -> set[str]:
    """Every module a chapter's code cells import by name (``import x``, ``from x import y``)."""
    found = set()
    for chapter in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(chapter.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                if isinstance(node, ast.Import):
                    found |= {alias.name for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module)
    return {name for name in found if not name.startswith("google.")}      # Colab's, in its first cell only


def main() -> int:
    modules = chapter_imports() | set(SERVER_MODULES)
    for package in PACKAGES:
        modules |= {info.name for info in pkgutil.walk_packages(importlib.import_module(package).__path__,
                                                                 f"{package}.")}
    for name in sorted(modules):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            # Not installed: a tool's extra (the hub's, on a student's .venv), or Triton where it does not run.
            if error.name != name.partition(".")[0] and error.name != "triton":
                raise
    # The course's own files, all of them: a module no process has imported yet is compiled too.
    ok = all(compileall.compile_dir(ROOT / package, quiet=1, workers=0) for package in PACKAGES)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
