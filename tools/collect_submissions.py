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
import errno
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


def _link_problem(target: str, path: pathlib.PurePosixPath, what: str) -> str:
    """Why the symbolic link at ``path`` (``USER/...``, to ``target``) is not followed, saying whether it
    points inside the user's home."""
    home = pathlib.PurePosixPath(path.parts[0])
    resolved = pathlib.PurePosixPath(os.path.normpath(path.parent / target))
    where = "inside" if resolved == home or home in resolved.parents else "outside"
    return f"{what} is a symbolic link (to {display(target, 200)}, {where} {home}/); not followed"


def _not_a_folder(error: OSError, parent: int, name: str, path: pathlib.PurePosixPath, what: str) -> str:
    """Why ``name`` in the open folder ``parent`` could not be opened as a folder without following links."""
    if error.errno in (errno.ELOOP, errno.ENOTDIR):
        try:
            return _link_problem(os.readlink(name, dir_fd=parent), path, what)
        except OSError:                          # no longer a link: swapped back meanwhile
            if error.errno == errno.ELOOP:
                return f"{what} was swapped with a symbolic link while it was collected; not followed"
    return f"{what} cannot be read ({os.strerror(error.errno)})"


def _prepare(out: pathlib.Path) -> None:
    """Make ``out`` an empty folder: new, empty, or an earlier collection (removed whole).

    Raises:
        ValueError: ``out`` is a link or a file, or holds files that no collection wrote.
    """
    if out.is_symlink() or out.exists() and not out.is_dir():
        raise ValueError(f"collect_homes: out must be a folder, got {out}")
    if out.exists() and any(out.iterdir()):
        if not (out / REPORT).is_file():
            raise ValueError(f"collect_homes: out {out} holds files that no collection wrote (no {REPORT}); "
                             "name a new folder")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def _collect_home(homes: int, user: str, parts: tuple[str, ...], chapters: list[str], out: pathlib.Path,
                  report: Collected) -> None:
    """Collect one user's chapters into ``out/USER/``: the home and each folder on the way are opened
    once, without following a link, and every read is relative to them, so swapping a folder for a link
    meanwhile changes nothing. Whatever cannot be read refuses this user (or this chapter) alone."""
    opened, shown = [], pathlib.PurePosixPath(user)
    try:
        try:
            opened.append(os.open(user, reading.FOLDER_FLAGS, dir_fd=homes))
        except OSError as error:
            if error.errno == errno.ENOENT:      # removed since the listing
                return
            report.refused.append((user, None, _not_a_folder(error, homes, user, shown, "the home folder")))
            return
        for part in parts:
            shown = shown / part
            try:
                opened.append(os.open(part, reading.FOLDER_FLAGS, dir_fd=opened[-1]))
            except OSError as error:
                if error.errno == errno.ENOENT or (error.errno == errno.ENOTDIR and not _is_link(opened[-1], part)):
                    report.missing[user] = list(chapters)
                    report.never_pulled.add(user)
                else:
                    report.refused.append((user, None, _not_a_folder(error, opened[-1], part, shown,
                                                                     f"its {'/'.join(parts)}/ folder")))
                return
        for chapter in chapters:
            name = f"{chapter}.ipynb"
            try:
                status = os.stat(name, dir_fd=opened[-1], follow_symlinks=False)
                if stat.S_ISLNK(status.st_mode):
                    raise ValueError(_link_problem(os.readlink(name, dir_fd=opened[-1]), shown / name, "it"))
                data = reading.read_bytes_at(opened[-1], name)
                reading.parse_code_cells(data)
            except FileNotFoundError:
                report.missing.setdefault(user, []).append(chapter)
                continue
            except OSError as error:                 # swapped between the stat and readlink, or unreadable
                report.refused.append((user, chapter, f"it cannot be read ({os.strerror(error.errno)})"))
                continue
            except ValueError as error:
                report.refused.append((user, chapter, str(error)))
                continue
            # Written as it is read: a class's notebooks are never all in memory at once.
            (out / user).mkdir(exist_ok=True)
            (out / user / name).write_bytes(data)
            report.collected.setdefault(user, []).append(chapter)
    finally:
        for descriptor in opened:
            os.close(descriptor)


def _is_link(folder: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def collect_homes(homes: os.PathLike | str, out: os.PathLike | str, chapters: list[str],
                  inside: str = INSIDE) -> Collected:
    """Copy every user's chapters from ``homes`` into ``out/USER/CHAPTER.ipynb``, each as it is read and
    checked, and write the report as ``out/collection.txt``.

    Args:
        homes: a folder of user folders.
        out: the collection's folder: new, empty, or an earlier collection (replaced whole).
        chapters: the chapters to collect, ``["02_formula"]``.
        inside: the folder of each home holding them (``""``: the home itself).

    Returns:
        The report.

    Raises:
        TypeError: ``homes`` or ``out`` is not a path, ``chapters`` not a list of strings, ``inside``
            not a string.
        ValueError: ``homes`` is not a folder, ``chapters`` is empty, ``inside`` leaves the home, or
            ``out`` holds files that no collection wrote.
    """
    for argument, value in (("homes", homes), ("out", out)):
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"collect_homes: {argument} must be a path, got {type(value).__name__}")
    homes, out = pathlib.Path(homes), pathlib.Path(out)
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
    _prepare(out)
    report = Collected()
    # The homes folder is the instructor's (it may be a link); each home in it is the user's.
    folder = os.open(homes, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with os.scandir(folder) as entries:
            users = sorted((entry.name for entry in entries if not entry.name.startswith(".")), key=os.fsencode)
        for user in users:
            try:
                mode = os.stat(user, dir_fd=folder, follow_symlinks=False).st_mode
            except OSError:
                mode = stat.S_IFDIR                # unreadable: opening it says why
            if not stat.S_ISDIR(mode) and not stat.S_ISLNK(mode):
                continue                           # a file beside the homes
            if problem := collect.student_name_problem(user):
                report.refused.append((user, None, problem))
                continue
            _collect_home(folder, user, parts, chapters, out, report)
    finally:
        os.close(folder)
    (out / REPORT).write_text("\n".join(report.lines()) + "\n", encoding="utf-8")
    return report


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
        report = collect_homes(args.homes, args.out, chapters, args.inside)
    except (TypeError, ValueError, OSError) as error:
        print(f"collect: {display(error)}", file=sys.stderr)
        return 2
    for line in report.lines():
        print(line)
    total = sum(len(chapters) for chapters in report.collected.values())
    print(f"collected {total} notebooks of {len(report.collected)} users into {args.out}; "
          f"{len(report.refused)} refused (report: {args.out / REPORT})")
    return 1 if report.refused else 0


if __name__ == "__main__":
    sys.exit(main())
