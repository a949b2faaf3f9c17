"""Writing what grading found, so that nothing a submission put in its results can break it.

A result holds text the student controls and values decoded from it. Written as they are, a lone
surrogate stops a UTF-8 write, a tensor stops ``json.dumps``, a string of 290 MB fills the disk, a
formula in a student's name runs in the instructor's spreadsheet, and an escape sequence rewrites the
console: the feedback files (:func:`feedback_json`), grades.csv (:func:`write_grades`) and the console
(:func:`console_line`) are written so that none of these can happen.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import pathlib
import tempfile

from attn_course_grading.display import display

#: A feedback file is at most this many bytes: the longest of the course's own (a whole chapter
#: with every test failing) is a few tens of KB.
MAX_FEEDBACK_BYTES = 2**20
#: How strings, lists and nesting are cut, in turn until the file fits: (characters, items, depth).
CUTS = ((8000, 1000, 20), (1000, 100, 10), (100, 10, 5))
#: Cells of grades.csv that start with one of these are neutralised with a leading ``'``: a
#: spreadsheet would read them as a formula (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class _TooLarge(Exception):
    """What is converted already passes the size: the next, tighter cut is tried."""


class _Bounded:
    """Converts a value to JSON data, cutting strings, lists and depth (``cut`` says if it did);
    stops (:class:`_TooLarge`) as soon as what it kept passes ``budget``, never converting 290 MB whole."""

    def __init__(self, characters: int, items: int, depth: int, budget: int | None = None):
        self.characters, self.items, self.depth, self.budget, self.cut = characters, items, depth, budget, False

    def spend(self, size: int) -> None:
        if self.budget is not None:
            self.budget -= size
            if self.budget < 0:
                raise _TooLarge

    def text(self, value: str) -> str:
        if len(value) > self.characters:
            self.cut = True
            value = value[:self.characters] + f"… [cut: {len(value) - self.characters:,} more characters]"
        self.spend(len(value) + 4)
        return value

    def __call__(self, value: object, depth: int = 0) -> object:
        self.spend(8)                                  # a value's punctuation, a number's digits
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            # json.dumps refuses an int of more than 4300 digits (sys.get_int_max_str_digits).
            return int(value) if value.bit_length() <= 256 else f"<an integer of {value.bit_length():,} bits>"
        if isinstance(value, float):
            return value if math.isfinite(value) else repr(value)      # NaN is not JSON
        if isinstance(value, str):
            return self.text(value)
        if depth >= self.depth and isinstance(value, (dict, list, tuple)):
            self.cut = True
            return f"<{type(value).__name__} nested more than {self.depth} deep: cut>"
        if isinstance(value, dict):
            converted = {}
            for index, (key, item) in enumerate(value.items()):
                if index == self.items:
                    self.cut = True
                    converted["…"] = f"[cut: {len(value) - self.items:,} more entries]"
                    break
                converted[self.text(key if isinstance(key, str) else display(key, self.characters))] = \
                    self(item, depth + 1)
            return converted
        if isinstance(value, (list, tuple)):
            converted = [self(item, depth + 1) for item in value[:self.items]]
            if len(value) > self.items:
                self.cut = True
                converted.append(f"… [cut: {len(value) - self.items:,} more items]")
            return converted
        # Anything else (a tensor, bytes, an object): its type and the start of its repr.
        try:
            shown = repr(value)
        except Exception:  # noqa: BLE001 - a repr that fails must not stop the feedback
            shown = "?"
        return self.text(f"<{type(value).__name__}: {shown[:self.characters]}>")


def feedback_json(result: object) -> str:
    """``result`` (anything) as JSON text that can always be written: ASCII, at most :data:`MAX_FEEDBACK_BYTES`.

    Strings are kept whole when the file fits; otherwise strings, lists and nesting are cut
    (:data:`CUTS`, saying so); as a last resort only the scores are kept. What is not JSON (a
    tensor, bytes, NaN, a huge integer) becomes a short string.
    """
    for characters, items, depth in ((MAX_FEEDBACK_BYTES, 10**9, 100),) + CUTS:
        bounded = _Bounded(characters, items, depth, budget=MAX_FEEDBACK_BYTES)
        try:
            data = bounded(result if isinstance(result, dict) else {"result": result})
        except _TooLarge:
            continue
        if bounded.cut:
            data["cut"] = (f"this feedback was cut to fit {MAX_FEEDBACK_BYTES:,} bytes: strings to at most "
                           f"{bounded.characters:,} characters, lists to {bounded.items:,} items, "
                           f"nesting to {bounded.depth} levels")
        text = json.dumps(data, indent=1, ensure_ascii=True, allow_nan=False)
        if len(text) <= MAX_FEEDBACK_BYTES:
            return text
    questions = result.get("questions") if isinstance(result, dict) else None
    scores = [{key: question.get(key) for key in ("name", "score", "max_score")}
              for question in (questions if isinstance(questions, list) else [])[:100] if isinstance(question, dict)]
    bounded = _Bounded(100, 100, 3)
    return json.dumps({"questions": bounded(scores), "cut": f"this feedback was more than {MAX_FEEDBACK_BYTES:,} "
                       "bytes even cut: only the scores are kept"}, indent=1, ensure_ascii=True, allow_nan=False)


def write_feedback(path: os.PathLike | str, result: object) -> None:
    """Write :func:`feedback_json` of ``result`` to ``path`` (its folder made if missing)."""
    path = pathlib.Path(path)
    text = feedback_json(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="ascii")


def scores(result: dict) -> list[dict]:
    """Each question's ``{"name", "score", "max_score"}`` in a result, checked to be a name and numbers.

    Raises:
        ValueError: a question is not such a dict (then the result's row cannot be trusted).
    """
    checked = []
    for question in result["questions"]:
        name, score, possible = question["name"], question["score"], question["max_score"]
        if not isinstance(name, str) or not all(isinstance(number, (int, float)) and not isinstance(number, bool)
                                                and math.isfinite(number) for number in (score, possible)):
            raise ValueError(f"scores: a question must have a str name and finite scores, got {question!r:.200}")
        checked.append({"name": name, "score": score, "max_score": possible})
    return checked


def console_line(student: str, chapter: str, result: dict) -> str:
    """``ada 03_multi_head: 11 / 12 (23.4 s; stopped: …)``, every control character escaped."""
    questions, run = scores(result), result["run"]
    stopped = run.get("stopped")
    note = f"; stopped: {display(stopped, 300)}" if stopped else ""
    seconds = run.get("seconds")
    took = f"{seconds:.1f} s" if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else "? s"
    return display(f"{student} {chapter}: {sum(q['score'] for q in questions):g} / "
                   f"{sum(q['max_score'] for q in questions):g} ({took}") + note + ")"


def csv_cell(value: object) -> object:
    """A value as grades.csv holds it: a number one way, whether otter gave an int or a float (``2``,
    ``0``, ``1.5``; at most four decimals); anything else escaped (no newline can forge a row), cut to
    1000 characters, and given a leading ``'`` if it starts with :data:`FORMULA_STARTS`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{round(value, 4):.4f}".rstrip("0").rstrip(".") if math.isfinite(value) else str(value)
    text = display("" if value is None else value, 1000)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


@dataclasses.dataclass
class Row:
    """One student's line of grades.csv: ``scores`` ``{"CHAPTER:question": score}``, and ``notes``
    for the instructor (a refused notebook, a grader failure)."""

    student: str
    scores: dict[str, float] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)


def write_grades(path: os.PathLike | str, rows: list[Row], possible: dict[str, float]) -> None:
    """Write grades.csv: a row per student, a column per ``chapter:question``, ``total``, ``possible``, ``notes``.

    The file is written whole or not at all (a temporary file, then renamed); a row that cannot be
    written becomes the student's name and a note saying so.

    Args:
        path: the CSV file.
        rows: one :class:`Row` per student, in order.
        possible: ``{"CHAPTER:question": max_score}`` of every column.
    """
    path = pathlib.Path(path)
    columns = sorted(possible)
    header = ["student", *columns, "total", "possible", "notes"]
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", newline="", dir=path.parent, prefix=".grades-",
                                         suffix=".csv", delete=False)
    try:
        with handle:
            writer = csv.writer(handle, quoting=csv.QUOTE_MINIMAL)
            writer.writerow([csv_cell(name) for name in header])
            total_possible = sum(possible.values())
            for row in rows:
                try:
                    scores = [row.scores.get(column, "") for column in columns]
                    scores = [score if isinstance(score, (int, float)) and not isinstance(score, bool) else ""
                              for score in scores]
                    total = sum(score for score in scores if score != "")
                    cells = [csv_cell(row.student), *map(csv_cell, scores), csv_cell(total),
                             csv_cell(total_possible), csv_cell("; ".join(row.notes))]
                except Exception as error:  # noqa: BLE001 - one bad row must not lose the class
                    cells = [csv_cell(row.student)] + [""] * (len(columns) + 2) + [
                        csv_cell(f"its row could not be written ({type(error).__name__})")]
                writer.writerow(cells)
        os.replace(handle.name, path)
    except BaseException:
        pathlib.Path(handle.name).unlink(missing_ok=True)
        raise
