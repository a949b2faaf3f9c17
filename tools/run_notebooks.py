"""Re-execute notebooks top to bottom in a fresh kernel and save them with their outputs.

    .venv/bin/python tools/run_notebooks.py                 # every chapter
    .venv/bin/python tools/run_notebooks.py notebooks/02_formula.ipynb

Run it (or `make execute`) whenever code a notebook uses changes: nbval compares against the committed
outputs. Each chapter's run time is recorded and published (tools/run_times.py): time on an idle machine.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The kernel the chapters name. `make venv` registers python3 under the same display name (the
# Makefile's KERNEL_DISPLAY_NAME; also ipykernel's default, as on conda and Binder): where the two
# differ, JupyterLab rewrites the metadata as a chapter opens and marks it modified.
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def execute(path: pathlib.Path, timeout: int) -> float:
    notebook = nbformat.read(path, as_version=4)
    notebook.metadata["kernelspec"] = KERNELSPEC
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}}, store_widget_state=True)
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    nbformat.validate(notebook)
    nbformat.write(notebook, path)
    return elapsed


def main() -> int:
    import run_times  # tools/run_times.py, beside this script (tools/ is sys.path[0] when run)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args()
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for path in paths:
        print(f"{path.name}: ", end="", flush=True)
        seconds = execute(path, args.timeout)
        print(f"{seconds:.1f} s")
        run_times.record(path.stem, seconds)
    return run_times.main([])                  # README's and the chapters' run times rewritten


if __name__ == "__main__":
    sys.exit(main())
