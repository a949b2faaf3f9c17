"""Finding and reading submissions without trusting anything in them.

A submission folder comes from students (a git clone, a GitHub Classroom export, an unpacked
archive), so everything in it may be hostile: a notebook may be a symbolic link to the solution
notebook, to a classmate's notebook or to a secret file; a device (``/dev/zero``) or a FIFO that
never ends; a file of hundreds of megabytes or of a million cells; a folder's name may hold bytes
that are not UTF-8, a newline, terminal escapes or a spreadsheet formula. The grader reads
submissions with the instructor's rights, so nothing here follows a link or reads past a cap.

- :func:`read_code_cells`: the sources of a notebook's code cells, read safely, or a
  :class:`ValueError` whose message a student can read.
- :func:`find_submissions`: ``{student: {chapter: notebook}}`` under a folder of student
  folders, and every folder or notebook refused, with the reason (:class:`Collection`).
- :func:`display`: any name or text made safe to print on a terminal or in a file read line by
  line: control characters, bidirectional overrides and lone surrogates escaped.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import pathlib
import stat
import unicodedata

#: A larger notebook is not read. The course's executed chapters are under 1 MB (at most 0.93 MB,
#: chapter 05); a student's may carry more outputs (plots, printed tensors), so 16 times the
#: largest. Parsing 16 MiB of the most expensive JSON there is (``[{},{},...]``) takes about
#: 0.3 s and 420 MB; :data:`MAX_JSON_ITEMS` bounds that further.
MAX_NOTEBOOK_BYTES = 16 * 2**20
#: At most this many JSON items (counted, before parsing, as the ``, : [ {`` in the file, which
#: also counts those inside strings, so a little too many): at this cap the most expensive JSON
#: measured (a million short strings, 13 MiB) takes 0.1 s and 70 MB to parse. The course's
#: chapters hold at most 32,000 (chapter 08).
MAX_JSON_ITEMS = 1_000_000
#: At most this many cells: the course's chapters have at most 128.
MAX_CELLS = 2000
#: At most this many characters in one cell's source: the course's longest cell has 3,155.
MAX_CELL_CHARACTERS = 256 * 2**10
#: How the notebook is opened: never through a symbolic link (``O_NOFOLLOW``), never waiting for a
#: writer (``O_NONBLOCK``: a FIFO opens at once, and is then refused as not a regular file), never
#: becoming the grader's terminal (``O_NOCTTY``).
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CLEAR_OUTPUTS = "clear its outputs (Edit > Clear Outputs of All Cells), save, and hand it in again"


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: os.PathLike | str, limit: int = MAX_NOTEBOOK_BYTES) -> bytes:
    """The bytes of a regular file that is not a symbolic link, in a folder that is not one either.

    Args:
        path: the file.
        limit: the most bytes read; a longer file is refused.

    Raises:
        ValueError: the file or its folder is a symbolic link, the file is not a regular file (a
            FIFO, a device, a folder), it cannot be opened, or it is longer than ``limit``; the
            message says which, in words a student can act on (it does not repeat the path).
    """
    path = pathlib.Path(path)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise TypeError(f"read_bytes: limit must be a non-negative int, got {limit!r}")
    try:
        # The folder too: a student folder that is a link would lead anywhere.
        folder = os.open(path.parent, _FOLDER_FLAGS)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ValueError("its folder is a symbolic link or not a folder; hand in the notebook itself") from None
        raise ValueError(f"its folder cannot be opened ({os.strerror(error.errno)})") from None
    try:
        try:
            before = os.stat(path.name, dir_fd=folder, follow_symlinks=False)
        except OSError as error:
            raise ValueError(f"it cannot be read ({os.strerror(error.errno)})") from None
        # Refused before opening it: opening a device may itself do something (rewind a tape).
        if problem := file_problem(before, limit):
            raise ValueError(problem)
        try:
            handle = os.open(path.name, _OPEN_FLAGS, dir_fd=folder)
        except OSError as error:
            if error.errno == errno.ELOOP:     # replaced by a link since the check above
                raise ValueError("it is a symbolic link; hand in the notebook file itself") from None
            raise ValueError(f"it cannot be opened ({os.strerror(error.errno)})") from None
        try:
            opened = os.fstat(handle)
            if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
                raise ValueError("it changed while it was read; hand it in again")
            chunks, size = [], 0
            # One byte past the limit, whatever the size said: a file may grow, or report size 0.
            while size <= limit:
                chunk = os.read(handle, min(2**20, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if size > limit:
                raise ValueError(f"it is more than the {limit:,} bytes graded; {_CLEAR_OUTPUTS}")
            return b"".join(chunks)
        finally:
            os.close(handle)
    finally:
        os.close(folder)


def parse_code_cells(data: bytes) -> list[str]:
    """The sources of a notebook's code cells, from its bytes, within :data:`MAX_CELLS` and the caps.

    Only what grading needs is read: the notebook must be JSON in notebook format 4 (what
    JupyterLab and Notebook save), and of each cell its type and source. The size of the JSON is
    checked before it is parsed (:data:`MAX_JSON_ITEMS`), the cells before their sources are
    read.

    Raises:
        ValueError: the bytes are not such a notebook, or pass a cap; the message says why.
    """
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"parse_code_cells: data must be bytes, got {type(data).__name__}")
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"it is {len(data):,} bytes, more than the {MAX_NOTEBOOK_BYTES:,} graded; {_CLEAR_OUTPUTS}")
    # bytes.count runs at memory speed: the whole file is counted in milliseconds, before
    # json.loads builds an object per item.
    items = sum(data.count(character) for character in (b",", b":", b"[", b"{"))
    if items > MAX_JSON_ITEMS:
        raise ValueError(f"it holds about {items:,} JSON items, more than the {MAX_JSON_ITEMS:,} graded; "
                         + _CLEAR_OUTPUTS)
    try:
        text = bytes(data).decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(f"it is not UTF-8 text (byte {error.start:,}); save it from JupyterLab") from None
    try:
        notebook = json.loads(text)
    except RecursionError:
        raise ValueError("its JSON is nested too deeply to be a notebook; save it from JupyterLab") from None
    except ValueError as error:  # json.JSONDecodeError, or an integer of too many digits
        raise ValueError(f"it is not valid JSON ({str(error)[:100]}); save it from JupyterLab") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ValueError("it is JSON but not a notebook (no list of cells); save it from JupyterLab")
    if notebook.get("nbformat") != 4:
        version = notebook.get("nbformat")
        shown = repr(version)[:20] if isinstance(version, (int, float, str)) and not isinstance(version, bool) else "?"
        raise ValueError(f"it is in notebook format {shown}, not 4; save it from JupyterLab")
    cells = notebook["cells"]
    if len(cells) > MAX_CELLS:
        raise ValueError(f"it has {len(cells):,} cells, more than the {MAX_CELLS:,} graded")
    sources = []
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict):
            raise ValueError(f"its cell {number} is not a cell; save it from JupyterLab")
        source = cell.get("source", "")
        # nbformat 4 stores a source as one string or as a list of lines, to be joined.
        if isinstance(source, list) and all(isinstance(line, str) for line in source):
            length = sum(len(line) for line in source)
            if length <= MAX_CELL_CHARACTERS:
                source = "".join(source)
        elif isinstance(source, str):
            length = len(source)
        else:
            raise ValueError(f"its cell {number}'s source is not text; save it from JupyterLab")
        if length > MAX_CELL_CHARACTERS:
            raise ValueError(f"its cell {number} has {length:,} characters, more than the {MAX_CELL_CHARACTERS:,} "
                             "graded in one cell")
        if cell.get("cell_type") == "code":
            try:
                # A lone surrogate ("\ud800" in the JSON) is no character: the code could not be
                # compiled or sent, and would break every file it reached.
                source.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"its cell {number} holds text that is not Unicode (a lone surrogate)") from None
            sources.append(source)
    return sources


def read_code_cells(path: os.PathLike | str) -> list[str]:
    """The sources of the code cells of the notebook at ``path``, read without trusting it.

    The notebook must be a regular file, not a symbolic link, in a folder that is not a symbolic
    link (so it cannot be the solution notebook, a classmate's, a secret file, ``/dev/zero`` or a
    FIFO), of at most :data:`MAX_NOTEBOOK_BYTES` bytes, :data:`MAX_JSON_ITEMS` JSON items,
    :data:`MAX_CELLS` cells and :data:`MAX_CELL_CHARACTERS` characters per cell, all checked
    before the next step costs more (:func:`read_bytes`, :func:`parse_code_cells`).

    Args:
        path: the student's ``.ipynb``.

    Returns:
        The code cells' sources, in order, empty ones included.

    Raises:
        ValueError: the notebook is refused; the message says why in words a student can act on,
            without the path (``"it is a symbolic link; hand in the notebook file itself"``).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"read_code_cells: path must be a path, got {type(path).__name__}")
    return parse_code_cells(read_bytes(path, MAX_NOTEBOOK_BYTES))


#: What :func:`display` escapes besides C0, DEL and C1 (category Cc): format characters (Cf: the
#: bidirectional overrides U+202A-U+202E and isolates U+2066-U+2069, zero-width characters, which
#: make text read other than it is), lone surrogates (Cs) and the line and paragraph separators.
_ESCAPED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def display(text: object, limit: int | None = None) -> str:
    """``text`` as a string safe to print: every control character escaped, nothing else changed.

    A terminal obeys escapes (ESC: move the cursor, rewrite a line, set the title; CR: go back
    over the line; BEL), a newline forges a line for whoever reads line by line, and a
    bidirectional override shows text in another order than it is. Each of them is written as
    Python writes it in a string literal (``\\x1b``, ``\\n``, ``\\u202e``); a name read from the
    file system with bytes that are not UTF-8 (``os.fsdecode``'s ``\\udcXX``) shows those bytes
    (``\\xff``). A backslash is left as it is, so that escaping twice changes nothing
    (``display(display(text)) == display(text)``): text that spells an escape reads like one,
    but none reaches the terminal.

    Args:
        text: a string, or anything (``str()`` of it; an object whose ``str`` fails shows its type).
        limit: at most this many characters of ``text`` are shown, then ``… (N more characters)``.
    """
    if not isinstance(text, str):
        try:
            text = str(text)
        except Exception:  # noqa: BLE001 - a hostile __str__ must not stop a report
            text = f"<{type(text).__name__}>"
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise TypeError(f"display: limit must be a non-negative int or None, got {limit!r}")
    more = len(text) - limit if limit is not None and len(text) > limit else 0
    if more:
        text = text[:limit]
    if text.isprintable():                             # the common case, at C speed
        shown = text
    else:
        shown = "".join(_escaped(character) for character in text)
    return shown + (f"… ({more:,} more characters)" if more else "")


def _escaped(character: str) -> str:
    if unicodedata.category(character) not in _ESCAPED_CATEGORIES:
        return character
    code = ord(character)
    if character in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[character]
    if 0xDC80 <= code <= 0xDCFF:                       # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def student_name_problem(name: str) -> str | None:
    """Why ``name`` (a folder name, as ``os.fsdecode`` gives it) cannot name a student; None if it can.

    A name must be printable UTF-8 text (letters, digits, punctuation, spaces; no control
    character, no bidirectional override, no byte that is not UTF-8), since it goes into
    grades.csv, into file names under the grades folder, and onto the console. It may not be
    ``grades.csv``, whose place it would take.
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
    """A student folder, or one notebook in it, that is not graded.

    Attributes:
        folder: the folder's name as ``os.fsdecode`` gives it (it may not be printable: show it
            with :func:`display`, as :attr:`student` does).
        chapter: the chapter of the refused notebook; None when the whole folder is refused.
        reason: why, in words for the instructor and the student.
    """

    folder: str
    chapter: str | None
    reason: str

    @property
    def student(self) -> str:
        """The folder's name, escaped."""
        return display(self.folder, 200)


@dataclasses.dataclass
class Collection:
    """What :func:`find_submissions` found.

    Attributes:
        notebooks: ``{student: {chapter: path}}``, each path a regular file, not a symbolic link,
            in the student's own folder (also not a link), of at most :data:`MAX_NOTEBOOK_BYTES`.
        refused: every student folder and notebook that is not graded, with the reason.
        skipped: lines saying what was passed over (files that are not chapters, hidden folders),
            escaped, at most :data:`MAX_SKIPPED_LINES` per folder.
    """

    notebooks: dict[str, dict[str, pathlib.Path]] = dataclasses.field(default_factory=dict)
    refused: list[Refusal] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)


#: At most this many "skipped" lines per folder: a folder of a million files is summed up.
MAX_SKIPPED_LINES = 10


def file_problem(status: os.stat_result, limit: int = MAX_NOTEBOOK_BYTES) -> str | None:
    """Why a file of this ``lstat`` cannot be a notebook (a link, not a regular file, too long); or None."""
    if not stat.S_ISREG(status.st_mode):
        return f"it is {_kind(status.st_mode)}, not a file; hand in the notebook file itself"
    if status.st_size > limit:
        return f"it is {status.st_size:,} bytes, more than the {limit:,} graded; {_CLEAR_OUTPUTS}"
    return None


def _entries(folder: pathlib.Path) -> list[os.DirEntry]:
    with os.scandir(folder) as entries:
        # Sorted by bytes: a name that is not UTF-8 sorts too.
        return sorted(entries, key=lambda entry: os.fsencode(entry.name))


def find_submissions(submissions: os.PathLike | str, chapters: set[str]) -> Collection:
    """The notebooks to grade under ``submissions``, one folder per student, and what is refused.

    Nothing found is followed or opened: each name is checked (:func:`student_name_problem`),
    each folder and notebook ``lstat``-ed. Refused, with the reason: a student folder that is a
    symbolic link (it would grade another student's work twice, or anything the link names), or
    whose name is not printable UTF-8; a notebook named after a chapter that is a symbolic link
    (to the solution, a classmate's, a secret file, ``/dev/zero``), not a regular file (a FIFO, a
    device, a folder) or larger than :data:`MAX_NOTEBOOK_BYTES`. Skipped: hidden folders
    (``.git``), files that are not folders, and files that are not named after a chapter.

    Args:
        submissions: a folder of student folders (it may itself be a link: it is the instructor's).
        chapters: the chapters' names (``"03_multi_head"``); a notebook is found as
            ``STUDENT/CHAPTER.ipynb``.

    Raises:
        TypeError: ``chapters`` is not a set of strings.
        OSError: ``submissions`` cannot be listed.
    """
    if not isinstance(chapters, (set, frozenset)) or not all(isinstance(chapter, str) for chapter in chapters):
        raise TypeError(f"find_submissions: chapters must be a set of str, got {chapters!r:.100}")
    submissions = pathlib.Path(submissions)
    found = Collection()
    skipped_in: dict[str, int] = {}

    def skip(folder: str, line: str) -> None:
        skipped_in[folder] = skipped_in.get(folder, 0) + 1
        if skipped_in[folder] <= MAX_SKIPPED_LINES:
            found.skipped.append(line)

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
                if chapter is not None:
                    skip(shown, f"skipped {shown}/{display(file.name, 200)}: not a chapter ({known})")
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
    return found
