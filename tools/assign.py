"""Build the student notebooks and autograders from the chapter (master) notebooks.

    .venv/bin/python tools/assign.py                   # every chapter -> dist/
    .venv/bin/python tools/assign.py --no-run-tests notebooks/02_formula.ipynb

For each ``notebooks/NN_name.ipynb`` this runs ``otter assign`` and writes

    dist/student/NN_name.ipynb       solutions replaced by ``...``, hidden tests removed
    dist/autograder/NN_name.zip      what ``otter run`` / ``otter grade`` grade with
    dist/autograder/NN_name.ipynb    the solution notebook

The student notebooks are byte-for-byte reproducible: otter gives new cells random ids,
which are replaced here by ids derived from the chapter name and the cell's position.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "notebooks"


def otter_command() -> list[str]:
    """The ``otter`` of this Python environment (never a different one on PATH)."""
    return [str(pathlib.Path(sys.executable).parent / "otter")]


def kernel_environment() -> dict[str, str]:
    """Environment in which the notebook kernel "python3" is this environment's Python."""
    environment = dict(os.environ)
    own_kernels = str(pathlib.Path(sys.prefix) / "share" / "jupyter")
    environment["JUPYTER_PATH"] = os.pathsep.join(
        [own_kernels] + [p for p in environment.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    )
    environment.setdefault("HF_HUB_OFFLINE", "1")
    return environment


def tidy_student_notebook(path: pathlib.Path) -> None:
    """Give every cell an id derived from the notebook name and its position, and drop the
    saved widget state, which belongs to the master's outputs (students start with none)."""
    notebook = nbformat.read(path, as_version=4)
    notebook.metadata.pop("widgets", None)
    for index, cell in enumerate(notebook.cells):
        digest = hashlib.sha1(f"{path.stem}:{index}".encode()).hexdigest()[:8]
        cell["id"] = f"{path.stem[:2]}-{index:03d}-{digest}"
    nbformat.write(notebook, path)


def assign(master: pathlib.Path, out: pathlib.Path, *, run_tests: bool) -> None:
    """Run ``otter assign`` on one chapter and copy its results into ``out``."""
    name = master.stem
    with tempfile.TemporaryDirectory(prefix=f"assign-{name}-") as scratch:
        result = pathlib.Path(scratch) / "result"
        command = otter_command() + ["assign", master.name, str(result)]
        if not run_tests:
            command.append("--no-run-tests")
        completed = subprocess.run(
            command, cwd=master.parent, env=kernel_environment(), capture_output=True, text=True
        )
        if completed.returncode != 0:
            sys.stderr.write(completed.stdout + completed.stderr)
            raise SystemExit(f"otter assign failed for {master.name}")
        (out / "student").mkdir(parents=True, exist_ok=True)
        (out / "autograder").mkdir(parents=True, exist_ok=True)
        student = out / "student" / master.name
        shutil.copyfile(result / "student" / master.name, student)
        tidy_student_notebook(student)
        shutil.copyfile(result / "autograder" / master.name, out / "autograder" / master.name)
        (zip_file,) = (result / "autograder").glob("*.zip")
        shutil.copyfile(zip_file, out / "autograder" / f"{name}.zip")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=pathlib.Path, help="default: every chapter")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "dist")
    parser.add_argument("--no-run-tests", action="store_true",
                        help="skip otter's own run of the tests against the solutions (faster)")
    args = parser.parse_args()
    chapters = [c.resolve() for c in args.chapters] or sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    for master in chapters:
        print(f"{master.name}: ", end="", flush=True)
        assign(master, args.out.resolve(), run_tests=not args.no_run_tests)
        print(f"dist/student/{master.name}, dist/autograder/{master.stem}.zip")
    return 0


if __name__ == "__main__":
    sys.exit(main())
