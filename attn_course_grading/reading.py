"""Reading one submitted notebook without trusting it: no link followed, nothing read past a cap.

A notebook may be a symbolic link (to the solution, a classmate's, a secret file), a device
(``/dev/zero``) or a FIFO that never ends, a file of hundreds of megabytes or a million cells, and
the grader reads it with the instructor's rights: each cap is checked before the next step costs more.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import stat

#: A larger notebook is not read: 16 times the largest executed chapter (0.93 MB, chapter 05), for
#: a student's extra outputs. 16 MiB of the costliest JSON (``[{},{},...]``) takes 0.3 s and 420 MB
#: to parse; :data:`MAX_JSON_ITEMS` bounds that further.
MAX_NOTEBOOK_BYTES = 16 * 2**20
#: At most this many JSON items (the ``, : [ {`` in the file, counted before parsing, those in
#: strings too): at this cap the costliest JSON measured (a million short strings) takes 0.1 s and
#: 70 MB to parse. The chapters hold at most 32,000 (chapter 08).
MAX_JSON_ITEMS = 1_000_000
#: At most this many cells: the course's chapters have at most 128.
MAX_CELLS = 2000
#: At most this many characters in one cell's source: the course's longest cell has 3,155.
MAX_CELL_CHARACTERS = 256 * 2**10
#: Never through a symbolic link, never waiting for a writer (a FIFO opens at once, then is refused
#: as not a regular file), never becoming the grader's terminal.
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CLEAR_OUTPUTS = "clear its outputs (Edit > Clear Outputs of All Cells), save, and hand it in again"
_SAVE_IT = "save it from JupyterLab"


def file_problem(status: os.stat_result, limit: int = MAX_NOTEBOOK_BYTES) -> str | None:
    """Why a file of this ``lstat`` cannot be a notebook (a link, not a regular file, too long); or None."""
    if not stat.S_ISREG(status.st_mode):
        return f"it is {_kind(status.st_mode)}, not a file; hand in the notebook file itself"
    if status.st_size > limit:
        return f"it is {status.st_size:,} bytes, more than the {limit:,} graded; {_CLEAR_OUTPUTS}"
    return None


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

    Raises:
        TypeError: ``limit`` is not a non-negative int.
        ValueError: the file or its folder is a symbolic link, the file is not a regular file, it
            cannot be opened, or it is longer than ``limit`` bytes.
    """
    path = pathlib.Path(path)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise TypeError(f"read_bytes: limit must be a non-negative int, got {limit!r}")
    try:
        folder = os.open(path.parent, FOLDER_FLAGS)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ValueError("its folder is a symbolic link or not a folder; hand in the notebook itself") from None
        raise ValueError(f"its folder cannot be opened ({os.strerror(error.errno)})") from None
    try:
        return read_bytes_at(folder, path.name, limit)
    finally:
        os.close(folder)


def read_bytes_at(folder: int, name: str, limit: int = MAX_NOTEBOOK_BYTES) -> bytes:
    """:func:`read_bytes` of the file ``name`` in the open folder ``folder`` (a descriptor), which
    whoever opened it made sure is no link: nothing on the way can be swapped while it is read.

    Raises:
        TypeError: ``folder`` is not a descriptor, ``name`` not a plain file name.
        ValueError: as :func:`read_bytes`.
    """
    if isinstance(folder, bool) or not isinstance(folder, int) or folder < 0:
        raise TypeError(f"read_bytes_at: folder must be an open folder's descriptor, got {folder!r:.100}")
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise TypeError(f"read_bytes_at: name must be a file name without '/', got {name!r:.100}")
    try:
        before = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError as error:
        raise ValueError(f"it cannot be read ({os.strerror(error.errno)})") from None
    # Refused before opening it: opening a device may itself do something (rewind a tape).
    if problem := file_problem(before, limit):
        raise ValueError(problem)
    try:
        handle = os.open(name, _OPEN_FLAGS, dir_fd=folder)
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
            try:
                chunk = os.read(handle, min(2**20, limit + 1 - size))
            except OSError as error:
                raise ValueError(f"it cannot be read ({os.strerror(error.errno)})") from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ValueError(f"it is more than the {limit:,} bytes graded; {_CLEAR_OUTPUTS}")
        return b"".join(chunks)
    finally:
        os.close(handle)


def parse_code_cells(data: bytes) -> list[str]:
    """The sources of a notebook's code cells, from its bytes: JSON in notebook format 4, each cap
    checked before the next step costs more.

    Raises:
        TypeError: ``data`` is not bytes.
        ValueError: the bytes are not such a notebook, or pass a cap; the message says why.
    """
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"parse_code_cells: data must be bytes, got {type(data).__name__}")
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"it is {len(data):,} bytes, more than the {MAX_NOTEBOOK_BYTES:,} graded; {_CLEAR_OUTPUTS}")
    # bytes.count runs at memory speed, before json.loads builds an object per item.
    items = sum(data.count(character) for character in (b",", b":", b"[", b"{"))
    if items > MAX_JSON_ITEMS:
        raise ValueError(f"it holds about {items:,} JSON items, more than the {MAX_JSON_ITEMS:,} graded; "
                         + _CLEAR_OUTPUTS)
    try:
        text = bytes(data).decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(f"it is not UTF-8 text (byte {error.start:,}); {_SAVE_IT}") from None
    try:
        notebook = json.loads(text)
    except RecursionError:
        raise ValueError(f"its JSON is nested too deeply to be a notebook; {_SAVE_IT}") from None
    except ValueError as error:  # json.JSONDecodeError, or an integer of too many digits
        raise ValueError(f"it is not valid JSON ({str(error)[:100]}); {_SAVE_IT}") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ValueError(f"it is JSON but not a notebook (no list of cells); {_SAVE_IT}")
    if notebook.get("nbformat") != 4:
        version = notebook.get("nbformat")
        shown = repr(version)[:20] if isinstance(version, (int, float, str)) and not isinstance(version, bool) else "?"
        raise ValueError(f"it is in notebook format {shown}, not 4; {_SAVE_IT}")
    cells = notebook["cells"]
    if len(cells) > MAX_CELLS:
        raise ValueError(f"it has {len(cells):,} cells, more than the {MAX_CELLS:,} graded")
    sources = []
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict):
            raise ValueError(f"its cell {number} is not a cell; {_SAVE_IT}")
        source = cell.get("source", "")
        # nbformat 4 stores a source as one string or as a list of lines, to be joined.
        if isinstance(source, list) and all(isinstance(line, str) for line in source):
            length = sum(len(line) for line in source)
            if length <= MAX_CELL_CHARACTERS:
                source = "".join(source)
        elif isinstance(source, str):
            length = len(source)
        else:
            raise ValueError(f"its cell {number}'s source is not text; {_SAVE_IT}")
        if length > MAX_CELL_CHARACTERS:
            raise ValueError(f"its cell {number} has {length:,} characters, more than the {MAX_CELL_CHARACTERS:,} "
                             "graded in one cell")
        if cell.get("cell_type") == "code":
            try:
                # A lone surrogate ("\ud800" in the JSON) could not be compiled, sent or written.
                source.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"its cell {number} holds text that is not Unicode (a lone surrogate)") from None
            sources.append(source)
    return sources


def read_code_cells(path: os.PathLike | str) -> list[str]:
    """The sources of the code cells of the notebook at ``path``, in order, empty ones included
    (:func:`read_bytes`, then :func:`parse_code_cells`).

    Raises:
        TypeError: ``path`` is not a path.
        ValueError: the notebook is refused; the message says why in words a student can act on,
            without the path (``"it is a symbolic link; hand in the notebook file itself"``).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"read_code_cells: path must be a path, got {type(path).__name__}")
    return parse_code_cells(read_bytes(path, MAX_NOTEBOOK_BYTES))
