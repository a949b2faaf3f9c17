"""Start JupyterLab for this course, offline, with this environment's kernel.

    .venv/bin/python tools/lab.py                          # what `make lab` runs: my-notebooks/
    .venv/bin/python tools/lab.py --root notebooks         # the chapters with their worked solutions
    .venv/bin/python tools/lab.py --root DIR --no-browser --port=8899

By default it first builds or refreshes the student's own copies of the chapters in ``my-notebooks/``
(``tools/student_copies.py``: blank exercises; a copy the student edited is never replaced) and serves them.

The one place for JupyterLab's flags and environment (`make lab`, the browser tests, otter's kernels
in tools/assign.py). Any other option goes to JupyterLab.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Offline by design: no update checks, no news feed, no extension catalogue queries.
OFFLINE_FLAGS = [
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    "--LabApp.news_url=None",
    "--LabApp.extension_manager=readonly",
]


def lab_environment() -> dict[str, str]:
    """This process's environment with this environment's Jupyter data first, so that its kernel
    "python3" and its JupyterLab settings win over any user-level ones, and the Hugging Face hub offline."""
    environment = dict(os.environ)
    own = str(pathlib.Path(sys.prefix) / "share" / "jupyter")
    others = [path for path in environment.get("JUPYTER_PATH", "").split(os.pathsep) if path and path != own]
    environment["JUPYTER_PATH"] = os.pathsep.join([own, *others])
    environment.setdefault("HF_HUB_OFFLINE", "1")
    environment.setdefault("PYTHONHASHSEED", "0")
    return environment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=pathlib.Path, default=None,
                        help="folder to serve (default: your own copies of the chapters, my-notebooks/, "
                             "built or refreshed first)")
    args, extra = parser.parse_known_args(argv)
    if args.root is None:
        if str(ROOT) not in sys.path:          # run as a script: tools/ is found from the checkout
            sys.path.insert(0, str(ROOT))
        from tools import student_copies

        student_copies.main([])
        args.root = student_copies.FOLDER
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={args.root.resolve()}", *OFFLINE_FLAGS]
    if hasattr(os, "getuid") and os.getuid() == 0:
        command.append("--allow-root")  # containers and CI machines often run as root
    command += extra
    # Replace this process: Ctrl+C and signals reach JupyterLab itself.
    os.execve(command[0], command, lab_environment())
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
