"""Gather the students' notebooks from a hub's user homes into ``make grade``'s layout.

    .venv/bin/python tools/collect_submissions.py HOMES [--out submissions] [--chapters 02_formula,...]

HOMES holds one folder per user (a hub's ``/home``, or a folder export): the hand-out link cloned
the notebooks into ``HOMES/USER/attn-course/CHAPTER.ipynb`` (``--inside`` names another folder,
``--inside ''`` the home itself). Each becomes ``OUT/USER/CHAPTER.ipynb`` for ``make grade``.

Nothing in a home is trusted: it is read as the grader reads (:mod:`attn_course_grading.reading`: no
link followed, only regular files, the size and JSON caps), and written from the bytes checked. What
cannot be collected is reported per user and chapter, with the reason, on the console and in
``OUT/collection.txt``, and the command then exits with status 1. OUT must not exist, be empty, or be
an earlier collection: it is replaced whole, so last week's notebook never stands in for one refused
today (INSTRUCTORS.md, section 6.3).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import stat
import sys

from attn_course_grading import collect, reading
from attn_course_grading.display import display

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: Where the hand-out link clones the notebooks in each home (tools/handout.py's TARGET).
INSIDE = "attn-course"
#: The file that marks a folder as a collection, with the report in it.
REPORT = "collection.txt"


@dataclasses.dataclass
class Collected:
    """What :func:`collect_homes` found: per user the chapters ``collected`` and ``missing``; each
    refusal ``(user, chapter or None for the whole home, reason)``; homes ``never_pulled``."""

    collected: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    missing: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    refused: list[tuple[str, str | None, str]] = dataclasses.field(default_factory=list)
    never_pulled: set[str] = dataclasses.field(default_factory=set)

    def lines(self) -> list[str]:
        """The report, one line per user and kind, every name escaped (display)."""
        users = sorted(set(self.collected) | set(self.missing) | {user for user, _, _ in self.refused},
                       key=os.fsencode)
        lines = []
        for user in users:
            shown = display(user, 200)
            if self.collected.get(user):
                lines.append(f"{shown}: collected {', '.join(self.collected[user])}")
            for refused_user, chapter, reason in self.refused:
                if refused_user == user:
                    lines.append(f"{shown}: REFUSED {chapter or 'the whole home'}: {display(reason, 400)}")
            if self.missing.get(user):
                why = " (no hand-out folder: the link was never opened)" if user in self.never_pulled else ""
                lines.append(f"{shown}: missing {', '.join(self.missing[user])}{why}")
        return lines


def _link_problem(path: pathlib.Path, home: pathlib.Path, what: str) -> str:
    """Why the symbolic link ``path`` is not followed, saying whether it points inside ``home``."""
    target = os.readlink(path)
    resolved = pathlib.Path(os.path.normpath(path.parent / target))
    where = "inside" if resolved == home or home in resolved.parents else "outside"
    return f"{what} is a symbolic link (to {display(target, 200)}, {where} {home.name}/); not followed"


def _read_notebook(path: pathlib.Path, home: pathlib.Path) -> bytes:
    """The bytes of the notebook at ``path``, checked; ValueError (the reason) if refused."""
    try:
        status = path.lstat()
    except FileNotFoundError:
        raise FileNotFoundError(path) from None
    if stat.S_ISLNK(status.st_mode):
        raise ValueError(_link_problem(path, home, "it"))
    data = reading.read_bytes(path)
    reading.parse_code_cells(data)
    return data


def collect_homes(homes: os.PathLike | str, chapters: list[str], inside: str = INSIDE) -> tuple[Collected, dict]:
    """Read every user's chapters under ``homes``, without writing anything.

    Args:
        homes: a folder of user folders.
        chapters: the chapters to collect, ``["02_formula"]``.
        inside: the folder of each home holding them (``""``: the home itself).

    Returns:
        The report, and ``{user: {chapter: bytes}}`` of every notebook that passed.

    Raises:
        TypeError: ``chapters`` is not a list of strings, ``inside`` not a string.
        ValueError: ``homes`` is not a folder, ``chapters`` is empty, or ``inside`` leaves the home.
    """
    if not isinstance(homes, (str, os.PathLike)):
        raise TypeError(f"collect_homes: homes must be a path, got {type(homes).__name__}")
    homes = pathlib.Path(homes)
    if not homes.is_dir():
        raise ValueError(f"collect_homes: homes must be a folder of user folders, got {homes}")
    if not isinstance(chapters, (list, tuple)) or not all(isinstance(chapter, str) for chapter in chapters):
        raise TypeError(f"collect_homes: chapters must be a list of chapter names, got {chapters!r:.100}")
    if not chapters or any(not chapter or "/" in chapter or chapter.endswith(".ipynb") for chapter in chapters):
        raise ValueError(f"collect_homes: chapters must be names like '02_formula', got {chapters!r:.100}")
    if not isinstance(inside, str):
        raise TypeError(f"collect_homes: inside must be a string, got {type(inside).__name__}")
    parts = pathlib.PurePosixPath(inside).parts
    if any(part in ("..", "/") for part in parts):
        raise ValueError(f"collect_homes: inside must be a folder inside each home, got {inside!r}")
    report, notebooks = Collected(), {}
    for entry in sorted(os.scandir(homes), key=lambda entry: os.fsencode(entry.name)):
        user = entry.name
        if user.startswith(".") or (not entry.is_dir(follow_symlinks=False) and not entry.is_symlink()):
            continue                               # hidden, or a file beside the homes
        home = pathlib.Path(entry.path)
        if entry.is_symlink():
            report.refused.append((user, None, _link_problem(home, homes, "the home folder")))
            continue
        if problem := collect.student_name_problem(user):
            report.refused.append((user, None, problem))
            continue
        folder, problem = home, None
        for part in parts:                         # each folder on the way: no link followed
            folder = folder / part
            if folder.is_symlink():
                problem = _link_problem(folder, home, f"its {inside}/ folder")
            elif not folder.is_dir():
                problem = "missing"
            if problem:
                break
        if problem == "missing":
            report.missing[user] = list(chapters)
            report.never_pulled.add(user)
            continue
        if problem:
            report.refused.append((user, None, problem))
            continue
        for chapter in chapters:
            try:
                data = _read_notebook(folder / f"{chapter}.ipynb", home)
            except FileNotFoundError:
                report.missing.setdefault(user, []).append(chapter)
                continue
            except ValueError as error:
                report.refused.append((user, chapter, str(error)))
                continue
            notebooks.setdefault(user, {})[chapter] = data
            report.collected.setdefault(user, []).append(chapter)
    return report, notebooks


def write_collection(out: os.PathLike | str, report: Collected, notebooks: dict) -> None:
    """Write ``OUT/USER/CHAPTER.ipynb`` for every notebook read, and the report as ``OUT/collection.txt``.

    Raises:
        ValueError: ``out`` exists and is neither empty nor an earlier collection.
    """
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"write_collection: out must be a path, got {type(out).__name__}")
    if not isinstance(report, Collected):
        raise TypeError(f"write_collection: report must be a Collected (collect_homes), got {type(report).__name__}")
    if not isinstance(notebooks, dict) or not all(
            isinstance(chapters, dict) and all(isinstance(data, bytes) for data in chapters.values())
            for chapters in notebooks.values()):
        raise TypeError("write_collection: notebooks must be {user: {chapter: bytes}} (collect_homes), "
                        f"got {type(notebooks).__name__}")
    out = pathlib.Path(out)
    if out.is_symlink() or out.exists() and not out.is_dir():
        raise ValueError(f"write_collection: out must be a folder, got {out}")
    if out.exists() and any(out.iterdir()):
        if not (out / REPORT).is_file():
            raise ValueError(f"write_collection: out {out} holds files that no collection wrote (no {REPORT}); "
                             "name a new folder")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    for user, chapters in notebooks.items():
        (out / user).mkdir()
        for chapter, data in chapters.items():
            (out / user / f"{chapter}.ipynb").write_bytes(data)
    (out / REPORT).write_text("\n".join(report.lines()) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("homes", type=pathlib.Path, help="the folder of user homes (or of a folder export)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "submissions")
    parser.add_argument("--chapters", help="comma-separated, 02_formula,03_multi_head (default: those in --student)")
    parser.add_argument("--student", type=pathlib.Path, default=ROOT / "dist" / "student",
                        help="the handed-out notebooks, whose names are the chapters collected by default")
    parser.add_argument("--inside", default=INSIDE, help=f"the folder of each home that holds them (default {INSIDE})")
    args = parser.parse_args(argv)
    chapters = ([name.strip().removesuffix(".ipynb") for name in args.chapters.split(",") if name.strip()]
                if args.chapters else sorted(path.stem for path in args.student.glob("*.ipynb")))
    if not chapters:
        print(f"collect: no chapters: {args.student} holds no notebook (make assignments), and no --chapters",
              file=sys.stderr)
        return 2
    try:
        report, notebooks = collect_homes(args.homes, chapters, args.inside)
        write_collection(args.out, report, notebooks)
    except (TypeError, ValueError, OSError) as error:
        print(f"collect: {display(error)}", file=sys.stderr)
        return 2
    for line in report.lines():
        print(line)
    total = sum(len(chapters) for chapters in notebooks.values())
    print(f"collected {total} notebooks of {len(notebooks)} users into {args.out}; "
          f"{len(report.refused)} refused (report: {args.out / REPORT})")
    return 1 if report.refused else 0


if __name__ == "__main__":
    sys.exit(main())
