"""Finding the submissions in a folder of student folders, without trusting anything in it.

A submission folder comes from students (a git clone, a GitHub Classroom export, an archive): a
student folder or a notebook may be a symbolic link, a notebook a device or a FIFO, a folder's name
may hold bytes that are not UTF-8, a newline, terminal escapes or a spreadsheet formula.
:func:`find_submissions` follows no link and opens nothing; :mod:`~attn_course_grading.reading`
then reads each notebook.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

from attn_course_grading.display import display
from attn_course_grading.reading import file_problem

#: At most this many "skipped" lines per folder: a folder of a million files is summed up.
MAX_SKIPPED_LINES = 10


def student_name_problem(name: str) -> str | None:
    """Why ``name`` (a folder name, as ``os.fsdecode`` gives it) cannot name a student; None if it can.

    A name goes into grades.csv, file names under the grades folder and the console: it must be
    printable UTF-8 (no control character, no bidirectional override), and not ``grades.csv``.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not UTF-8 text; rename the folder"
    if not name.isprintable():
        return "its name holds a character that is not printable (a control character or a bidirectional override); " \
               "rename the folder"
    if name == "grades.csv":
        return "its name is that of the grades file; rename the folder"
    return None


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A student folder (``chapter`` None), or one notebook in it, that is not graded, and why.
    ``folder`` is the name as ``os.fsdecode`` gives it, maybe not printable: :attr:`student` shows it."""

    folder: str
    chapter: str | None
    reason: str

    @property
    def student(self) -> str:
        """The folder's name, escaped."""
        return display(self.folder, 200)


@dataclasses.dataclass
class Collection:
    """What :func:`find_submissions` found: ``notebooks`` ``{student: {chapter: path}}`` (each a
    regular file within the size cap, no link on the way), every :class:`Refusal`, and the escaped
    ``skipped`` lines (at most :data:`MAX_SKIPPED_LINES` per folder), and ``notes`` per student."""

    notebooks: dict[str, dict[str, pathlib.Path]] = dataclasses.field(default_factory=dict)
    refused: list[Refusal] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    #: ``{student folder: [each notebook of theirs skipped, and why]}``, for grades.csv's notes
    notes: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    #: the ``unbuilt`` chapters someone handed in
    without_autograder: set[str] = dataclasses.field(default_factory=set)


def _entries(folder: pathlib.Path) -> list[os.DirEntry]:
    with os.scandir(folder) as entries:
        # Sorted by bytes: a name that is not UTF-8 sorts too.
        return sorted(entries, key=lambda entry: os.fsencode(entry.name))


def find_submissions(submissions: os.PathLike | str, chapters: set[str],
                     unbuilt: frozenset[str] = frozenset()) -> Collection:
    """The notebooks to grade under ``submissions``, one folder per student, and what is refused.

    Each name is checked, each folder and notebook ``lstat``-ed. Refused: a student folder that is a
    symbolic link (it would grade another student's work twice) or badly named; a chapter's notebook
    that is a link, not a regular file, or too large. Skipped: hidden folders (``.git``), files that
    are not folders, files that are not named after a chapter.

    Args:
        submissions: a folder of student folders (it may itself be a link: it is the instructor's).
        chapters: the chapters' names (``"03_multi_head"``); a notebook is found as
            ``STUDENT/CHAPTER.ipynb``.
        unbuilt: the course's other chapters, those with no autograder: a notebook of one is
            skipped as such, not as "not a chapter".

    Raises:
        TypeError: ``chapters`` is not a set of strings.
        OSError: ``submissions`` cannot be listed.
    """
    if not isinstance(chapters, (set, frozenset)) or not all(isinstance(chapter, str) for chapter in chapters):
        raise TypeError(f"find_submissions: chapters must be a set of str, got {chapters!r:.100}")
    submissions = pathlib.Path(submissions)
    found = Collection()
    skipped_in: dict[str, int] = {}

    def skip(folder: str, line: str, student: str | None = None) -> None:
        skipped_in[folder] = skipped_in.get(folder, 0) + 1
        if skipped_in[folder] <= MAX_SKIPPED_LINES:
            found.skipped.append(line)
            if student is not None:
                found.notes.setdefault(student, []).append(line)

    top, known = display(str(submissions), 200), ", ".join(sorted(chapters))
    for entry in _entries(submissions):
        shown = display(entry.name, 200)
        if entry.name.startswith("."):
            skip(top, f"skipped {shown}: a hidden folder or file")
            continue
        try:
            is_link, is_folder = entry.is_symlink(), entry.is_dir(follow_symlinks=False)
        except OSError as error:
            found.refused.append(Refusal(entry.name, None, f"its folder cannot be read ({os.strerror(error.errno)})"))
            continue
        if is_link:
            target = display(os.readlink(entry.path), 200)
            found.refused.append(Refusal(entry.name, None, f"the folder is a symbolic link (to {target}), not a "
                                                      "student's own folder; copy the folder itself"))
            continue
        if not is_folder:
            skip(top, f"skipped {shown}: not a folder")
            continue
        if problem := student_name_problem(entry.name):
            found.refused.append(Refusal(entry.name, None, problem))
            continue
        try:
            files = _entries(pathlib.Path(entry.path))
        except OSError as error:
            found.refused.append(Refusal(entry.name, None, f"its folder cannot be read ({os.strerror(error.errno)})"))
            continue
        for file in files:
            chapter = file.name[:-len(".ipynb")] if file.name.endswith(".ipynb") else None
            if chapter not in chapters:
                if chapter in unbuilt:
                    found.without_autograder.add(chapter)
                    skip(shown, f"skipped {shown}/{display(file.name, 200)}: no autograder was built for this chapter",
                         entry.name)
                elif chapter is not None:
                    skip(shown, f"skipped {shown}/{display(file.name, 200)}: not a chapter ({known})", entry.name)
                continue
            try:
                problem = file_problem(file.stat(follow_symlinks=False))
            except OSError as error:
                problem = f"it cannot be read ({os.strerror(error.errno)})"
            if problem:
                found.refused.append(Refusal(entry.name, chapter, problem))
            else:
                found.notebooks.setdefault(entry.name, {})[chapter] = pathlib.Path(file.path).absolute()
    for folder, count in skipped_in.items():
        if count > MAX_SKIPPED_LINES:
            found.skipped.append(f"skipped {count - MAX_SKIPPED_LINES:,} more in {folder}")
    for student, lines in found.notes.items():
        if skipped_in[display(student, 200)] > MAX_SKIPPED_LINES:
            lines.append(f"skipped {skipped_in[display(student, 200)] - MAX_SKIPPED_LINES:,} more")
    return found
