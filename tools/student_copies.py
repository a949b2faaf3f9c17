"""The student's own copies of the chapters (``make lab``): blank exercises, kept once edited.

    .venv/bin/python tools/student_copies.py                 # my-notebooks/, what `make lab` serves
    .venv/bin/python tools/student_copies.py --folder DIR 02 05

Each chapter is built from its master in ``notebooks/`` as ``make assignments`` builds it for a class
(``otter assign``: solutions replaced by ``...``, hidden tests and otter's markup removed, a check cell
under each exercise), without otter's run of the tests. A copy the student has not changed is replaced
when its master changes; a copy the student has edited is never touched (this says so, and how to get
the new version). ``.built.json`` in the folder remembers what was built: each master's and each
copy's SHA-256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:                  # run as a script: tools/ is found from the checkout
    sys.path.insert(0, str(ROOT))

from tools.assign import assign, find_chapters  # noqa: E402

FOLDER = ROOT / "my-notebooks"
RECORD = ".built.json"


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refresh(masters: list[pathlib.Path], folder: pathlib.Path, *, jobs: int = os.cpu_count() or 1,
            announce=None) -> list[str]:
    """Build or refresh the student copies of ``masters`` in ``folder``; return one line per chapter
    that changed or was kept back (nothing for a copy already up to date). ``announce``, if given, is
    called with one line before a build starts."""
    folder.mkdir(parents=True, exist_ok=True)
    record_path = folder / RECORD
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    to_build, lines = {}, []                   # {master: what the line will say}
    hashes = {master: sha256(master) for master in masters}
    for master in masters:
        copy, built, master_hash = folder / master.name, record.get(master.name, {}), hashes[master]
        if not copy.exists():
            to_build[master] = "ready"
        elif sha256(copy) != built.get("copy"):
            if built.get("master") != master_hash:
                lines.append(f"{copy.name}: kept as you edited it; the course has a newer version of this chapter "
                             f"(rename or delete yours, then run make lab again to get it)")
        elif built.get("master") != master_hash:
            to_build[master] = "updated from the course's newer version"

    def build(master: pathlib.Path) -> pathlib.Path:
        with tempfile.TemporaryDirectory(prefix="student-copy-") as scratch:
            assign(master, pathlib.Path(scratch), run_tests=False)
            new = folder / f".{master.name}.new"
            new.write_bytes((pathlib.Path(scratch) / "student" / master.name).read_bytes())
            os.replace(new, folder / master.name)   # whole or not at all
        return master

    if to_build and announce is not None:
        announce(f"{folder.name}/: building {len(to_build)} chapter(s) from notebooks/ with blank exercises "
                 f"(otter assign, a few seconds each)")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for master in pool.map(build, to_build):
            record[master.name] = {"master": hashes[master], "copy": sha256(folder / master.name)}
            lines.append(f"{master.name}: {to_build[master]}")
    record_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="chapters by number or name (default: every chapter)")
    parser.add_argument("--folder", type=pathlib.Path, default=FOLDER, help="default: my-notebooks/")
    args = parser.parse_args(argv)
    lines = refresh(find_chapters(args.chapters), args.folder, announce=lambda line: print(line, flush=True))
    for line in lines:
        print(f"{args.folder.name}/{line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
