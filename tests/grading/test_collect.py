"""Finding, reading and reporting submissions that attack the grader itself (issue 31).

Each attack here worked once: a link to the solution notebook scored full marks, ``/dev/zero``
ran the grader to 3.3 GB, a FIFO hung it, a lone surrogate or a tensor in a result ended
``make grade`` with no grades.csv, a folder's name forged rows or ran a formula, escapes forged
the console. The collection and reading (attn_course_grading.collect, .reading) and the writing
(attn_course_grading.report) are tested on hostile folders built here; then tools/grade.py grades
a tiny class (a made-up one-question chapter) with all of tests/grading/hostile/collect.py's
folders in it, and must write every row; last, a unix socket in a folder the sandbox sees
cannot be reached from inside it.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading

import nbformat
import pytest
import torch
from hostile import collect as hostile_collect

from attn_course_grading import collect, reading, report, sandbox
from attn_course_grading.display import display

from helpers import ROOT, TINY_ANSWER, notebook_json, require_sandbox, tiny_chapter

HAS_OTTER = (pathlib.Path(sys.executable).parent / "otter").exists()
LINK = "it is a symbolic link, not a file; hand in the notebook file itself"


def refusal(path: pathlib.Path) -> str:
    with pytest.raises(ValueError) as caught:
        reading.read_code_cells(path)
    return str(caught.value)


# --- reading one notebook -------------------------------------------------------------------------


def test_a_notebook_reads_as_nbformat_reads_it():
    chapter = ROOT / "notebooks" / "03_multi_head.ipynb"
    expected = [cell.source for cell in nbformat.read(chapter, as_version=4).cells if cell.cell_type == "code"]
    assert reading.read_code_cells(chapter) == expected and len(expected) > 10
    # A source stored as a list of lines is joined, as nbformat does.
    assert reading.parse_code_cells(notebook_json(["a = 1\n", "b = 2"], "").encode()) == ["a = 1\nb = 2", ""]


def test_links_are_never_followed(tmp_path):
    (tmp_path / "secret.txt").write_text("the hidden tests' answers")
    student = tmp_path / "ada"
    student.mkdir()
    for name, target in (("solution", ROOT / "notebooks" / "03_multi_head.ipynb"), ("secret", tmp_path / "secret.txt"),
                         ("zero", pathlib.Path("/dev/zero")), ("dangling", tmp_path / "nothing")):
        (student / f"{name}.ipynb").symlink_to(target)
        assert refusal(student / f"{name}.ipynb") == LINK
    # A student folder that is a link: refused even for a real file inside its target.
    (tmp_path / "bob").symlink_to(tmp_path / "carol", target_is_directory=True)
    (tmp_path / "carol").mkdir()
    (tmp_path / "carol" / "03.ipynb").write_text(notebook_json("x = 1"))
    assert reading.read_code_cells(tmp_path / "carol" / "03.ipynb") == ["x = 1"]
    assert refusal(tmp_path / "bob" / "03.ipynb") == ("its folder is a symbolic link or not a folder; "
                                                      "hand in the notebook itself")


def test_a_fifo_is_refused_at_once_rather_than_read_forever(tmp_path):
    os.mkfifo(tmp_path / "03.ipynb")
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(refusal(tmp_path / "03.ipynb")), daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():                                  # blocked in open(): free it, then fail
        os.close(os.open(tmp_path / "03.ipynb", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a FIFO blocked")
    assert outcome == ["it is a FIFO, not a file; hand in the notebook file itself"]


def test_a_device_is_refused_unopened(tmp_path):
    try:
        os.mknod(tmp_path / "03.ipynb", 0o600 | 0o020000, os.makedev(1, 5))    # a /dev/zero of its own
    except PermissionError:
        pytest.skip("making a device needs root (CAP_MKNOD)")
    assert refusal(tmp_path / "03.ipynb") == "it is a character device, not a file; hand in the notebook file itself"


def test_no_more_than_the_cap_is_read_whatever_the_size_says():
    # /proc's files say they are 0 bytes long, as /dev/zero did (its size passed the old check).
    command_line = pathlib.Path(f"/proc/{os.getpid()}/cmdline")
    assert command_line.stat().st_size == 0 and len(command_line.read_bytes()) > 10
    assert reading.read_bytes(command_line, 10**6) == command_line.read_bytes()
    with pytest.raises(ValueError, match="^it is more than the 10 bytes graded; clear its outputs"):
        reading.read_bytes(command_line, 10)


def test_caps_are_checked_before_parsing(tmp_path):
    big = tmp_path / "big.ipynb"
    with open(big, "wb") as handle:
        handle.truncate(reading.MAX_NOTEBOOK_BYTES + 1)                       # sparse: no disk used
    assert refusal(big) == ("it is 16,777,217 bytes, more than the 16,777,216 graded; clear its outputs "
                            "(Edit > Clear Outputs of All Cells), save, and hand it in again")
    many = (tmp_path / "many.ipynb")
    many.write_text(notebook_json(*[""] * (reading.MAX_CELLS + 1)))
    assert refusal(many) == "it has 2,001 cells, more than the 2,000 graded"
    # A million dicts in 3 MB ([{},{},...]) are counted, never parsed: 2 marks each ("{" and ","), and 6 more.
    items = tmp_path / "items.ipynb"
    items.write_bytes(b'{"cells": [' + b"{}," * reading.MAX_JSON_ITEMS + b'{}], "nbformat": 4}')
    assert refusal(items).startswith("it holds about 2,000,006 JSON items, more than the 1,000,000 graded")
    long_cell = tmp_path / "long.ipynb"
    long_cell.write_text(notebook_json("x = 1", "#" * (reading.MAX_CELL_CHARACTERS + 1), cell_type="markdown"))
    assert refusal(long_cell) == "its cell 2 has 262,145 characters, more than the 262,144 graded in one cell"


@pytest.mark.parametrize("content, reason", [
    (notebook_json("x = '\ud800'").encode(), "its cell 1 holds text that is not Unicode (a lone surrogate)"),
    (b"[" * 100_000 + b"]" * 100_000, "its JSON is nested too deeply to be a notebook; save it from JupyterLab"),
    (b'{"cells": [], "nbformat": 4, "x": "\xff"}', "it is not UTF-8 text (byte 35); save it from JupyterLab"),
    (notebook_json("x = 1", version=3).encode(), "it is in notebook format 3, not 4; save it from JupyterLab"),
    (b'{"cells": {}}', "it is JSON but not a notebook (no list of cells); save it from JupyterLab"),
    (b'{"cells": [], "nbformat": 4, "n": ' + b"9" * 5000 + b"}", "it is not valid JSON (Exceeds the limit"),
    (notebook_json("x").replace('"x"', "[1]").encode(), "its cell 1's source is not text; save it from JupyterLab"),
])
def test_what_is_not_a_notebook_is_refused_with_a_reason(tmp_path, content, reason):
    (tmp_path / "03.ipynb").write_bytes(content)
    assert refusal(tmp_path / "03.ipynb").startswith(reason)


# --- finding a class's notebooks --------------------------------------------------------------------


def test_a_class_is_found_with_every_hostile_folder_refused_by_name(tmp_path):
    submissions, chapter = tmp_path / "submissions", "03_multi_head"
    (submissions / "ada").mkdir(parents=True)
    (submissions / "ada" / f"{chapter}.ipynb").write_text(notebook_json("x = 1"))
    (submissions / "ada" / "notes.ipynb").write_text("{}")
    (submissions / ".git").mkdir()
    (tmp_path / "secret").write_text("token")
    expected = hostile_collect.prepare(submissions, {"solution": ROOT / "notebooks" / f"{chapter}.ipynb",
                                                     "other": submissions / "ada" / f"{chapter}.ipynb",
                                                     "secret": tmp_path / "secret"})
    found = collect.find_submissions(submissions, {chapter, "01_intuition"})
    assert found.notebooks == {"ada": {chapter: submissions / "ada" / f"{chapter}.ipynb"},
                               hostile_collect.FORMULA_NAME: {chapter: submissions / hostile_collect.FORMULA_NAME
                                                              / f"{chapter}.ipynb"},
                               "many_cells": {chapter: submissions / "many_cells" / f"{chapter}.ipynb"}}
    refused = {(refusal.student, refusal.chapter): refusal.reason for refusal in found.refused}
    assert refused == {
        ("caf\\xe9", None): "its name is not UTF-8 text; rename the folder",
        ("evil\\u202etxt.exe", None): collect.student_name_problem("evil\u202e"),
        ("fifo", chapter): "it is a FIFO, not a file; hand in the notebook file itself",
        ("forged\\n0,11,11", None): collect.student_name_problem("\n"),
        ("grades.csv", None): "its name is that of the grades file; rename the folder",
        ("links_to_classmate", chapter): LINK, ("links_to_dev_zero", chapter): LINK,
        ("links_to_secret", chapter): LINK, ("links_to_solution", chapter): LINK,
        ("links_to_classmates_folder", None): f"the folder is a symbolic link (to {submissions / 'ada'}), not a "
                                              "student's own folder; copy the folder itself",
        ("too_big", chapter): ("it is 16,777,217 bytes, more than the 16,777,216 graded; clear its outputs (Edit > "
                               "Clear Outputs of All Cells), save, and hand it in again"),
        ("\\x1b]0;pwned\\x07\\x1b[2K", None): collect.student_name_problem("\x1b"),
    }
    assert collect.student_name_problem("\n").startswith("its name holds a character that is not printable")
    # Every refused or found name is in prepare()'s expectations, and only those (with ada's).
    assert {student for student, _ in refused} | set(found.notebooks) == set(expected) | {"ada"}
    assert found.skipped == ["skipped .git: a hidden folder or file",
                             f"skipped ada/notes.ipynb: not a chapter (01_intuition, {chapter})"]


def test_a_folder_of_many_files_is_summed_up(tmp_path):
    (tmp_path / "ada").mkdir()
    for number in range(collect.MAX_SKIPPED_LINES + 5):
        (tmp_path / "ada" / f"x{number:02}.ipynb").touch()
    found = collect.find_submissions(tmp_path, {"01_intuition"})
    assert len(found.skipped) == collect.MAX_SKIPPED_LINES + 1 and found.skipped[-1] == "skipped 5 more in ada"


def test_display_escapes_what_a_terminal_or_a_line_reader_would_obey():
    forged = "0 / 11 \x1b[2K\r11 / 11\x1b]0;title\x07 \u202eevil\u2066 \x85 \udcff café 李\n"
    shown = "0 / 11 \\x1b[2K\\r11 / 11\\x1b]0;title\\x07 \\u202eevil\\u2066 \\x85 \\xff café 李\\n"
    assert display(forged) == shown and display(shown) == shown      # twice: the same
    assert display("x" * 10, 4) == "xxxx… (6 more characters)"
    assert display(b"\x1b") == "b'\\x1b'"           # str() of anything


# --- writing results ------------------------------------------------------------------------------------


def test_feedback_is_always_written_ascii_whatever_the_result_holds(tmp_path):
    result = {"questions": [{"name": "q1", "score": 0, "max_score": 2, "output": "ValueError: \ud800"}],
              "run": {"stopped": "bad dtype \x1b[2K", "cell_errors": [{"cell": 1, "value": torch.ones(2),
                                                                     "nan": float("nan"), 3: b"\xff",
                                                                     "huge": 10**5000}]}}
    report.write_feedback(tmp_path / "ada" / "03.json", result)
    text = (tmp_path / "ada" / "03.json").read_bytes().decode("ascii")
    back = json.loads(text)
    assert back["questions"][0]["output"] == "ValueError: \ud800"          # kept, as its escape
    assert back["run"]["cell_errors"] == [{"cell": 1, "value": "<Tensor: tensor([1., 1.])>", "nan": "nan",
                                           "3": "<bytes: b'\\xff'>", "huge": "<an integer of 16,610 bits>"}]
    assert "cut" not in back


def test_feedback_is_capped_and_says_it_was_cut():
    huge = {"questions": [{"name": "q1", "score": 0, "max_score": 2, "output": "x" * 50_000_000}],
            "run": {"cell_errors": [{"error": "e" * 100}] * 100_000}}
    back = json.loads(report.feedback_json(huge))
    assert back["questions"][0]["output"] == "x" * 8000 + "… [cut: 49,992,000 more characters]"
    assert back["run"]["cell_errors"][-1] == "… [cut: 99,000 more items]" and len(back["run"]["cell_errors"]) == 1001
    assert back["cut"] == ("this feedback was cut to fit 1,048,576 bytes: strings to at most 8,000 characters, "
                           "lists to 1,000 items, nesting to 20 levels")
    # Too large even so (1,000 strings of 8,000): the next cut, 100 strings of 1,000.
    huge["run"]["cell_errors"] = [{"error": "e" * 100_000}] * 100_000
    text = report.feedback_json(huge)
    assert len(text) <= report.MAX_FEEDBACK_BYTES
    back = json.loads(text)
    assert back["run"]["cell_errors"][0] == {"error": "e" * 1000 + "… [cut: 99,000 more characters]"}
    assert back["run"]["cell_errors"][-1] == "… [cut: 99,900 more items]"
    assert back["cut"].startswith("this feedback was cut to fit 1,048,576 bytes: strings to at most 1,000 characters")
    assert back["questions"][0]["score"] == 0 and back["questions"][0]["max_score"] == 2


def test_console_lines_are_escaped():
    result = {"questions": [{"name": "q1", "score": 0, "max_score": 11, "output": ""}],
              "run": {"seconds": 2.5, "stopped": "dtype torch.\x1b[2K\r11 / 11 passed\x1b]0;pwned\x07"}}
    assert report.console_line("ada", "03", result) == ("ada 03: 0 / 11 (2.5 s; stopped: dtype torch.\\x1b[2K\\r"
                                                        "11 / 11 passed\\x1b]0;pwned\\x07)")


def test_grades_csv_cells_cannot_be_formulas_or_forge_rows(tmp_path):
    rows = [report.Row("=1+1", {"03:q1": 2}), report.Row(hostile_collect.FORMULA_NAME, {"03:q1": 1}),
            report.Row("forged\n0,11", notes=["03: refused: it is\ta FIFO"]), report.Row("caf\udce9"),
            report.Row("-2", {"03:q1": 0.5}), report.Row("\tada"), report.Row("ada", {"03:q1": torch.ones(1)})]
    report.write_grades(tmp_path / "grades.csv", rows, {"03:q1": 2})
    text = (tmp_path / "grades.csv").read_text(encoding="utf-8")
    assert len(text.splitlines()) == 1 + len(rows)
    read = list(csv.reader(io.StringIO(text)))
    assert read == [["student", "03:q1", "total", "possible", "notes"],
                    ["'=1+1", "2", "2", "2", ""],
                    ["'" + hostile_collect.FORMULA_NAME, "1", "1", "2", ""],
                    ["forged\\n0,11", "", "0", "2", "03: refused: it is\\ta FIFO"],
                    ["caf\\xe9", "", "0", "2", ""],
                    ["'-2", "0.5", "0.5", "2", ""],
                    ["\\tada", "", "0", "2", ""],
                    ["ada", "", "0", "2", ""]]                             # a tensor is no score
    # A tab or carriage return is escaped first, so that it cannot start a formula either.
    assert report.csv_cell("\tx") == "\\tx" and report.csv_cell("+x") == "'+x" and report.csv_cell(2.5) == "2.5"


def test_grades_csv_prints_every_score_one_way(tmp_path):
    # otter gives floats (2.0), a refused or untouched notebook ints (0): the file shows neither kind.
    rows = [report.Row("ada", {"03:q1": 2.0, "03:q2": 0}), report.Row("grace", {"03:q1": 1.5, "03:q2": 1 / 3})]
    report.write_grades(tmp_path / "grades.csv", rows, {"03:q1": 2.0, "03:q2": 1})
    read = list(csv.reader(io.StringIO((tmp_path / "grades.csv").read_text(encoding="utf-8"))))
    assert read[1:] == [["ada", "2", "0", "2", "3", ""], ["grace", "1.5", "0.3333", "1.8333", "3", ""]]


def test_a_chapter_without_autograder_is_named_and_every_skip_is_in_the_students_notes(tmp_path):
    (tmp_path / "ada").mkdir()
    for name in ("01_intuition.ipynb", "02_formula.ipynb", "scratch.ipynb"):
        (tmp_path / "ada" / name).write_text("{}")
    found = collect.find_submissions(tmp_path, {"01_intuition"}, unbuilt=frozenset({"02_formula", "03_multi_head"}))
    assert set(found.notebooks["ada"]) == {"01_intuition"}
    assert found.without_autograder == {"02_formula"}
    assert found.notes == {"ada": ["skipped ada/02_formula.ipynb: no autograder was built for this chapter",
                                   "skipped ada/scratch.ipynb: not a chapter (01_intuition)"]}


# --- grading a class: tools/grade.py -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not HAS_OTTER, reason="otter-grader is not installed")
def test_a_hostile_class_is_graded_and_every_row_written(tmp_path):
    chapter = "00_tiny"
    autograders, submissions, out = tmp_path / "autograder", tmp_path / "submissions", tmp_path / "grades"
    solution = tiny_chapter(autograders, chapter)
    (tmp_path / "secret.txt").write_text("SECRET-7f3a9c")
    # The one honest student (two notebooks run in all: each costs a Python with torch): a lone
    # surrogate and escapes in a cell's error once left no grades.csv at all.
    (submissions / "ada").mkdir(parents=True)
    (submissions / "ada" / f"{chapter}.ipynb").write_text(notebook_json(
        TINY_ANSWER, "raise ValueError('\\ud800 \\x1b]0;pwned\\x07')"))
    expected = hostile_collect.prepare(submissions, {"solution": solution, "secret": tmp_path / "secret.txt",
                                                     "other": submissions / "ada" / f"{chapter}.ipynb"})
    # A course chapter with no autograder built: skipped, said on the console and in ada's notes.
    (submissions / "ada" / "02_formula.ipynb").write_text(notebook_json(TINY_ANSWER))
    (submissions / "李").mkdir()               # printable, not ASCII: shown escaped on an ASCII console
    (submissions / "李" / f"{chapter}.ipynb").symlink_to(solution)
    completed = subprocess.run([sys.executable, "tools/grade.py", str(submissions), "--autograders", str(autograders),
                                "--out", str(out), "--trusted", "--jobs", "2", "--seconds", "60"], cwd=ROOT,
                               capture_output=True, text=True, env=dict(os.environ, PYTHONIOENCODING="ascii"))
    assert completed.returncode == 0, completed.stdout + completed.stderr
    # No control character reaches the console: every name and reason is escaped.
    assert not any(ord(c) < 32 and c != "\n" or 0x7f <= ord(c) < 0xa0 for c in completed.stdout + completed.stderr)
    with open(out / "grades.csv", encoding="utf-8", newline="") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    assert float(rows["ada"]["total"]) == 2
    assert rows["ada"]["notes"] == "skipped ada/02_formula.ipynb: no autograder was built for this chapter"
    assert (f"no autograder in {autograders} for 02_formula, so those notebooks were skipped: build it with make "
            "assignments, or tools/assign.py 02") in completed.stdout
    text = (out / "ada" / f"{chapter}.json").read_text(encoding="ascii")
    # The error reached the feedback, written as ASCII, its escapes as JSON's; how the surrogate
    # crossed the sandbox is the wire's business (a lone one in a result is tested above).
    assert json.loads(text)["questions"][0]["score"] == 2 and "0;pwned\\u0007" in text
    shown = {name: name for name in expected} | {hostile_collect.FORMULA_NAME: "'" + hostile_collect.FORMULA_NAME}
    assert set(rows) == {"ada", "李"} | set(shown.values())
    assert float(rows["李"]["total"]) == 0
    assert f"\\u674e {chapter}: 0 / 2 (0.0 s; stopped: the notebook was not graded: {LINK})" in completed.stdout
    for student, expectation in ((name, value["expect"]) for name, value in expected.items()):
        row = rows[shown[student]]
        if "score" in expectation:
            assert float(row["total"]) == expectation["score"], (student, row)
        if "refused" in expectation:
            assert expectation["refused"] in row["notes"] and expectation["refused"] in completed.stdout, student
    # A refused notebook's feedback says why, for each question.
    feedback = json.loads((out / "links_to_solution" / f"{chapter}.json").read_text())
    assert feedback["questions"] == [{"name": "q1", "score": 0, "max_score": 2, "output": "the notebook was not "
                                      "graded: " + LINK}]
    assert not (out / "links_to_classmates_folder").exists()          # graded once, as ada
    # Nothing of the secret file reached what the grader wrote or printed.
    assert not any("SECRET" in path.read_text(encoding="utf-8") for path in out.rglob("*") if path.is_file())
    assert "SECRET" not in completed.stdout + completed.stderr


# --- the sandbox: a socket in a folder it sees ----------------------------------------------------------


def test_a_unix_socket_in_a_mounted_folder_cannot_be_reached_from_the_sandbox(tmp_path, monkeypatch):
    require_sandbox()
    mounted = tmp_path / "mounted"
    (mounted / "deep").mkdir(parents=True)
    (mounted / "deep" / "visible.txt").write_text("seen")
    path = mounted / "deep" / "agent.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    os.chmod(path, 0o777)
    listener.listen()
    os.mkfifo(mounted / "deep" / "pipe")
    roots = sandbox.readable_roots()
    monkeypatch.setattr(sandbox, "readable_roots", lambda: roots + [mounted])
    probe = (f"import pathlib, socket\nprint(pathlib.Path({str(mounted / 'deep' / 'visible.txt')!r}).read_text())\n"
             f"client = socket.socket(socket.AF_UNIX)\ntry:\n    client.connect({str(path)!r})\n"
             "    print('connected')\nexcept OSError as error:\n    print(type(error).__name__)\n")

    def run_probe() -> list[str]:
        completed = subprocess.run(sandbox.sandbox_command([sys.executable, "-c", probe], sandbox.Limits()),
                                   capture_output=True, text=True, timeout=60)
        assert completed.returncode == 0, completed.stderr
        return completed.stdout.split()

    try:
        assert sandbox.special_files(mounted) == [str(mounted / "deep" / "agent.sock"), str(mounted / "deep" / "pipe")]
        assert run_probe() == ["seen", "ConnectionRefusedError"]            # mounted, but the socket hidden
        # The same sandbox without the hiding reaches it (as root, or as its owner): the attack.
        monkeypatch.setattr(sandbox, "special_files", lambda root: [])
        assert run_probe() == ["seen", "connected"]
    finally:
        listener.close()
