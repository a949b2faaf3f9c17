"""Build the student notebooks and autograders from the chapter (master) notebooks.

    .venv/bin/python tools/assign.py                   # every chapter -> dist/
    .venv/bin/python tools/assign.py 02 05             # chapters by number (or name: 02_formula)
    .venv/bin/python tools/assign.py --no-run-tests 02_formula
    .venv/bin/python tools/assign.py --jobs 1          # one chapter at a time (default: one per core)

For each ``notebooks/NN_name.ipynb`` this runs ``otter assign`` and writes

    dist/student/NN_name.ipynb       solutions replaced by ``...``, hidden tests removed
    dist/autograder/NN_name.zip      what ``otter run`` / ``otter grade`` grade with
    dist/autograder/NN_name.ipynb    the solution notebook

The student notebooks are reproducible byte for byte (otter's random cell ids are replaced). Each
test cell (``check_softmax(stable_softmax)``) becomes an otter *exception-based* test first
(:func:`exception_test`), so that a failing check shows the student one line of the test and the
check's diagnosis, not a 30-line doctest traceback.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import functools
import hashlib
import multiprocessing
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ProcessPoolExecutor

import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:                  # run as a script: tools/ is found from the checkout
    sys.path.insert(0, str(ROOT))

from tools.lab import lab_environment  # noqa: E402

CHAPTERS = ROOT / "notebooks"


def otter_command() -> list[str]:
    """The ``otter`` of this Python environment (never a different one on PATH), run as a module: its
    script lies beside Python in a venv, but in ``Scripts\\`` in a conda environment on Windows."""
    return [sys.executable, "-m", "otter"]


#: What otter's set-up cell says to the student, in place of its "# Initialize Otter".
SETUP_COMMENT = "# Run this cell once before the exercises: it loads the tests that each check cell below runs."


def tidy_student_notebook(path: pathlib.Path) -> None:
    """Move otter's set-up cell from the top of the chapter to the start of its exercises, where it is
    needed, saying what it is for; give every cell an id derived from the notebook name and its
    position; drop the saved widget state, which belongs to the master's outputs (students start with none)."""
    notebook = nbformat.read(path, as_version=4)
    notebook.metadata.pop("widgets", None)
    cells = notebook.cells
    setup = next((i for i, cell in enumerate(cells) if cell.source.startswith("# Initialize Otter\n")), None)
    exercises = next((i for i, cell in enumerate(cells)
                      if cell.cell_type == "markdown" and cell.source.startswith("## Exercises")), None)
    if setup is not None and exercises is not None:
        cell = cells.pop(setup)
        cell.source = cell.source.replace("# Initialize Otter", SETUP_COMMENT, 1)
        cells.insert(exercises + (setup > exercises), cell)
    for index, cell in enumerate(notebook.cells):
        digest = hashlib.sha1(f"{path.stem}:{index}".encode()).hexdigest()[:8]
        cell["id"] = f"{path.stem[:2]}-{index:03d}-{digest}"
    nbformat.write(notebook, path)


def free_names(tree: ast.AST) -> list[str]:
    """Names a piece of code reads but never binds (nor are builtins), in order of first use."""
    bound, read = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            read.append(node.id)
        elif isinstance(node, ast.Name):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return [name for name in dict.fromkeys(read) if name not in bound and not hasattr(builtins, name)]


def exception_test(source: str, name: str) -> str:
    """One chapter test cell as an otter exception-based test: ``def name(...): ...`` and its call.

    The parameters are the names the cell reads (otter passes the notebook's variables by name). A
    final expression that is not a check call (``torch.allclose(...)``) becomes an ``assert``; a
    check raises its own diagnosis. A leading ``# HIDDEN`` line is kept.
    """
    hidden, _, body = source.partition("\n") if source.startswith("# HIDDEN") else ("", "", source)
    tree = ast.parse(body)
    last = tree.body[-1]
    is_check = (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
                and isinstance(last.value.func, ast.Name) and last.value.func.id.startswith("check"))
    if isinstance(last, ast.Expr) and not is_check:
        tree.body[-1] = ast.Assert(test=last.value, msg=ast.Constant("this check did not hold"))
    parameters = free_names(tree)
    function = ast.FunctionDef(
        name=name, args=ast.arguments(posonlyargs=[], args=[ast.arg(p) for p in parameters], kwonlyargs=[],
                                      kw_defaults=[], defaults=[]),
        body=tree.body, decorator_list=[], returns=None, type_params=[],
    )
    call = ast.Expr(ast.Call(ast.Name(name, ast.Load()), [ast.Name(p, ast.Load()) for p in parameters], []))
    module = ast.fix_missing_locations(ast.Module(body=[function, call], type_ignores=[]))
    return (hidden + "\n" if hidden else "") + ast.unparse(module)


def with_exception_tests(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of a chapter whose test cells are exception-based tests, and whose assignment
    config tells otter so (``tests: ok_format: false``)."""
    notebook = nbformat.from_dict(notebook)
    question, in_tests, count = None, False, 0
    for cell in notebook.cells:
        if cell.cell_type == "raw":
            first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
            if first == "# ASSIGNMENT CONFIG":
                cell.source = cell.source.rstrip() + "\ntests:\n  ok_format: false"
            elif first == "# BEGIN QUESTION":
                question, count = cell.source.split("name:")[1].split()[0], 0
            in_tests = {"# BEGIN TESTS": True, "# END TESTS": False}.get(first, in_tests)
        elif cell.cell_type == "code" and in_tests and cell.source.strip():
            count += 1
            cell.source = exception_test(cell.source, f"test_{question}_{count}")
    return notebook


#: One in-process `otter assign` at a time per process (tools/student_copies.py calls assign from threads).
IN_PROCESS = threading.Lock()


def assign(master: pathlib.Path, out: pathlib.Path, *, run_tests: bool) -> None:
    """Run ``otter assign`` on one chapter and copy its results into ``out``."""
    name = master.stem
    with tempfile.TemporaryDirectory(prefix=f"assign-{name}-") as scratch:
        result = pathlib.Path(scratch) / "result"
        source = pathlib.Path(scratch) / "source"
        source.mkdir()
        nbformat.write(with_exception_tests(nbformat.read(master, as_version=4)), source / master.name)
        if run_tests:                # otter runs the solutions' tests in kernels of its own: its command line
            command = otter_command() + ["assign", master.name, str(result)]
            completed = subprocess.run(command, cwd=source, env=lab_environment(), capture_output=True, text=True)
            if completed.returncode != 0:
                sys.stderr.write(completed.stdout + completed.stderr)
                raise SystemExit(f"otter assign failed for {master.name}")
        else:                        # in this process, which imports otter once for all its chapters
            import otter.assign

            with IN_PROCESS:         # otter changes the process's working folder while it works
                try:
                    otter.assign.main(str(source / master.name), str(result), no_run_tests=True)
                except Exception as error:
                    raise SystemExit(f"otter assign failed for {master.name}: {error!r}") from error
        (out / "student").mkdir(parents=True, exist_ok=True)
        (out / "autograder").mkdir(parents=True, exist_ok=True)
        student = out / "student" / master.name
        shutil.copyfile(result / "student" / master.name, student)
        tidy_student_notebook(student)
        shutil.copyfile(result / "autograder" / master.name, out / "autograder" / master.name)
        (zip_file,) = (result / "autograder").glob("*.zip")
        shutil.copyfile(zip_file, out / "autograder" / f"{name}.zip")


def find_chapters(names: list[str]) -> list[pathlib.Path]:
    """The masters named by number (``02``), name (``02_formula``), file name or path; every chapter
    for none. Raises SystemExit naming the chapters there are, for a name that matches none."""
    masters = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return masters
    found = []
    for name in " ".join(names).replace(",", " ").split():
        stem = pathlib.PurePath(name).name.removesuffix(".ipynb")
        matches = [m for m in masters
                   if stem in (m.stem, m.stem[:2]) or stem.isdigit() and int(stem) == int(m.stem[:2])]
        if not matches:
            raise SystemExit(f"assign: no chapter {name!r}; the chapters are {', '.join(m.stem for m in masters)} "
                             "(name one by its number, 02, or its name, 02_formula)")
        found += [m for m in matches if m not in found]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="chapters by number (02) or name (02_formula); default: every one")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "dist")
    parser.add_argument("--no-run-tests", action="store_true",
                        help="skip otter's own run of the tests against the solutions (faster)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="chapters built at once (default: one per core)")
    args = parser.parse_args()
    chapters = find_chapters(args.chapters)
    if args.jobs < 1:
        raise SystemExit(f"assign: --jobs must be at least 1, got {args.jobs}")
    # --jobs processes, each running `otter assign` for one chapter at a time (otter changes the working
    # folder while it works), in chapter order; started after the environment is the lab's (PYTHONHASHSEED, which
    # otter's output depends on, is read when a Python starts). Importing otter took 3 s of the 5 s a chapter took
    # as a process of its own each.
    os.environ.update(lab_environment())
    build = functools.partial(assign, out=args.out.resolve(), run_tests=not args.no_run_tests)
    with ProcessPoolExecutor(max_workers=min(args.jobs, len(chapters)),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        for master, _ in zip(chapters, pool.map(build, chapters)):
            print(f"{master.name}: dist/student/{master.name}, dist/autograder/{master.stem}.zip", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
