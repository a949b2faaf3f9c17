"""Grading untrusted notebooks: what crosses the sandbox is data, and hostile submissions fail.

The first tests need no sandbox: the message format (attn_course_grading.wire) and the sandbox's
command line and environment. Then a class of hostile students of chapter 03 is graded with
tools/grade.py, as `make grade` does: each hands in the chapter's answers plus one attack, so its
honest score is known. Last, the proxies through which the checks call a submission's answers.
(tests/grading/test_assignments.py grades honest and mistaken notebooks the same way.)
"""

from __future__ import annotations

import ast
import csv
import hashlib
import json
import os
import pathlib
import pickle
import socket
import subprocess
import sys
import time

import nbformat
import pytest
import torch
from hostile import checks as hostile_checks
from hostile import collect as hostile_collect
from hostile import evasion as hostile_evasion
from hostile import protocol as hostile_protocol
from test_assignments import answers_only, write_notebook

from attn_course.core.kv_cache import KVCache
from attn_course.models.tiny_language_model import LanguageModelConfig, TinyLanguageModel
from attn_course_grading import sandbox, wire
from attn_course_grading.proxies import answer_values

from helpers import ROOT, require_sandbox, run_tool, sandbox_installed
from support.exercises import chapter_imports

# --- the messages: data only ----------------------------------------------------------------


def test_values_cross_as_they_were():
    value = {"out": torch.randn(2, 3), "pair": (torch.arange(4), 2.5), "bits": [True, None, "s", ...],
             "dtype": torch.bfloat16, "nan": float("nan"), "half": torch.ones(3, dtype=torch.float16),
             "size": torch.Size([2, 3]), "empty": torch.zeros(0, 4), "strided": torch.randn(4, 4).T}
    back = wire.decode(wire.encode(value))
    assert torch.equal(back["out"], value["out"]) and torch.equal(back["strided"], value["strided"])
    assert isinstance(back["pair"], tuple) and torch.equal(back["pair"][0], value["pair"][0])
    assert back["pair"][1] == 2.5 and back["bits"] == [True, None, "s", ...]
    assert back["dtype"] is torch.bfloat16 and back["half"].dtype == torch.float16
    assert back["size"] == (2, 3) and back["empty"].shape == (0, 4) and back["nan"] != back["nan"]
    leaf = wire.decode(wire.encode(torch.ones(2, requires_grad=True)))
    assert leaf.requires_grad and leaf.is_leaf


@pytest.mark.parametrize("value", [lambda: 1, torch.nn.Linear(2, 2), open, torch.ones(2, dtype=torch.complex64),
                                   {(1, 2): 3}, KVCache()])
def test_what_is_not_data_is_refused_by_name(value):
    with pytest.raises(wire.NotData):
        wire.encode(value)


def test_a_pickle_is_never_unpickled(tmp_path):
    marker = tmp_path / "ran"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    for blob in (pickle.dumps(Exploit()), b"\x10\x00\x00\x00\x00\x00\x00\x00{}", b"", b"\xff" * 64):
        with pytest.raises(ValueError, match="not a grading message"):
            wire.decode(blob)
    assert not marker.exists()


def test_course_objects_cross_only_towards_the_submission():
    model = TinyLanguageModel(LanguageModelConfig(vocab_size=7, max_length=8, embed_dim=8, num_heads=2)).eval()
    cache = KVCache()
    cache.append(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    blob = wire.encode({"model": model, "cache": cache}, objects=True)
    with pytest.raises(ValueError, match="unexpected"):
        wire.decode(blob)                                    # what the grader reads: refused
    rebuilt = wire.decode(blob, objects=True)                # what the submission reads: rebuilt
    ids = torch.randint(0, 7, (1, 5))
    assert torch.equal(rebuilt["model"](ids), model(ids)) and not rebuilt["model"].training
    assert torch.equal(rebuilt["cache"].keys, cache.keys) and len(rebuilt["cache"]) == 3


def test_a_cache_may_only_grow_when_sent_back():
    cache = KVCache()
    cache.append(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    grown = KVCache()
    grown.append(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    grown.append(torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))
    wire.update_in_place(cache, wire.cache_state(grown))
    assert len(cache) == 3 and torch.equal(cache.keys, grown.keys)
    rewritten = KVCache()
    rewritten.append(torch.ones(1, 1, 4, 2), torch.ones(1, 1, 4, 2))
    with pytest.raises(ValueError, match="may only append"):
        wire.update_in_place(cache, wire.cache_state(rewritten))


def test_oversized_and_deep_messages_are_refused():
    deep: list = []
    for _ in range(wire.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(wire.NotData, match="nested"):
        wire.encode(deep)
    with pytest.raises(ValueError, match="larger than"):
        wire.decode(b"\x00" * (wire.MAX_MESSAGE_BYTES + 1))


# --- the sandbox's view ----------------------------------------------------------------------


def test_the_sandbox_sees_the_environment_and_package_but_not_the_checkout_or_home(monkeypatch):
    monkeypatch.setattr(sandbox, "bubblewrap", lambda: "/usr/bin/bwrap")
    command = sandbox.sandbox_command(["python"], sandbox.Limits())
    bound = {command[i + 1] for i, option in enumerate(command) if option in ("--ro-bind", "--bind")}
    assert str(ROOT / "attn_course") in bound and str(pathlib.Path(sys.prefix).resolve()) in bound
    assert str(ROOT / "attn_course_grading") in bound    # its in_sandbox runs the notebook
    assert "--bind" not in command                        # nothing of the host is writable
    for hidden in (ROOT, ROOT / "notebooks", ROOT / "dist", pathlib.Path.home(), pathlib.Path("/")):
        assert str(hidden) not in bound
    assert "--unshare-net" in command and "--unshare-pid" in command and "--die-with-parent" in command


def test_the_sandbox_gets_none_of_the_instructors_environment(monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "secret")
    environment = sandbox.environment(sandbox.Limits(threads=2))
    assert "GITHUB_TOKEN" not in environment and environment["HOME"] == "/scratch"
    assert environment["OMP_NUM_THREADS"] == "2" and "secret" not in json.dumps(environment)


@pytest.mark.parametrize("field", ["seconds", "memory_bytes", "processes"])
def test_limits_must_be_positive(field):
    with pytest.raises(ValueError, match=field):
        sandbox.Limits(**{field: 0})


@pytest.mark.slow
def test_without_bubblewrap_make_grade_refuses_and_says_how_to_install(tmp_path):
    (tmp_path / "submissions" / "ada").mkdir(parents=True)
    environment = dict(os.environ, PATH=str(pathlib.Path(sys.executable).parent))   # no bwrap on it
    environment.pop("TRUSTED", None)
    completed = subprocess.run([sys.executable, "tools/grade.py", str(tmp_path / "submissions"), "--autograders",
                                str(tmp_path)], cwd=ROOT, capture_output=True, text=True, env=environment)
    assert completed.returncode != 0
    assert "refusing to run submissions without a sandbox" in completed.stderr
    assert "apt-get install bubblewrap" in completed.stderr and "TRUSTED=1" in completed.stderr


def results(grades: pathlib.Path) -> tuple[dict, dict]:
    """``({student: csv row}, {(student, chapter): result json})`` of a tools/grade.py run."""
    with open(grades / "grades.csv", encoding="utf-8", newline="") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    feedback = {(path.parent.name, path.stem): json.loads(path.read_text(encoding="ascii"))
                for path in grades.glob("*/*.json")}
    return rows, feedback


# --- a class of hostile students -----------------------------------------------------------------
# Each hands in chapter 03's answers (11 points when right; its checks take a tenth of a second)
# and one attack, placed before them unless it replaces them. LIMITS are tight so that the class
# is graded in a few minutes, but not so tight that a loaded machine trips them on honest work.
# On CI's two cores, beside the rest of the suite, the first cell (it imports torch and the course)
# ran past a 10 s cell limit, and so did chapter 11's evasion that measures twelve models at cell
# time; and a notebook ran past 30 s in all.
CHAPTER = "03_multi_head"
NOTEBOOK_SECONDS, CELL_SECONDS, CALL_SECONDS = 45, 20, 8
LIMITS = ["--seconds", str(NOTEBOOK_SECONDS), "--cell-seconds", str(CELL_SECONDS), "--call-seconds", str(CALL_SECONDS),
          "--memory-gib", "2", "--processes", "32", "--jobs", "3"]


def attacks(paths: dict[str, str], port: int) -> dict[str, dict]:
    """student -> {"cell": the attack, "replace": answers it replaces, "before": put first}."""
    snoop = [paths["other"], paths["hidden_tests"], paths["master"], paths["grades"], "/root/.bashrc",
             "/etc/shadow", paths["checkout"]]
    targets = [paths["other"], paths["grades"] + "/pwned.txt", paths["package_init"], paths["checkout"] + "/pwned.txt",
               "/usr/pwned.txt"]
    wrong_split = "def split_fused_qkv(qkv, num_heads, num_kv_heads):\n    return qkv, qkv, qkv\n"
    return {
        # At the lowest priority, so that its 20 s of spinning do not slow the notebooks graded beside it.
        "loops_forever": {"cell": "import os\nos.nice(19)\nwhile True:\n    pass\n"},
        # It waits rather than spins: the clock is what it tests, and a spinning loop would take a
        # core from the notebooks graded beside it for the whole notebook's time.
        "ignores_the_clock": {"cell": "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                                      "while True:\n    time.sleep(1)\n"},
        # It spins at the lowest priority too: its call's 8 s of CPU go to no one else's work.
        "hangs_when_called": {"replace": {"split_fused_qkv": "def split_fused_qkv(qkv, num_heads, num_kv_heads):\n"
                                                             "    import os\n    os.nice(19)\n"
                                                             "    while True:\n        pass\n"}},
        "memory_bomb": {"cell": "huge = torch.empty(2**40, dtype=torch.uint8)\n"},
        # bytes(n) maps zeroed pages it does not touch: the address-space limit is reached at once,
        # however slowly the machine fills pages (touching 1.3 GiB took over 3 s on a loaded CI run).
        "memory_creep": {"cell": "hog = []\nwhile True:\n    hog.append(bytes(2**26))\n",
                         "after": "del hog\n"},
        # Six children of 512 MiB each (pages touched), 3 GiB in all. The notebook waits until they
        # hold it, then sleeps past its cell's limit and once more in the next cell: the watch gets
        # seconds to see the sum, however slowly the machine fills pages.
        "memory_in_many_processes": {"cell": "import os, time\nready, done = os.pipe()\nfor _ in range(6):\n"
                                             "    if os.fork() == 0:\n"
                                             "        hog = b'x' * 2**29\n        os.write(done, b'.')\n"
                                             "        time.sleep(60)\n        os._exit(0)\n"
                                             "held = b''\nwhile len(held) < 6:\n    held += os.read(ready, 6)\n"
                                             "time.sleep(60)\n",
                                     "after": "time.sleep(2.5)\n"},
        "fork_bomb": {"cell": "import os, subprocess\n"
                              "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
                              "while True:\n    os.fork()\n"},
        "connects_to_loopback": {"cell": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), "
                                         "timeout=2)\n"},
        "reads_others": {"cell": "import os\nfound = {}\n"
                                 f"for path in {snoop!r}:\n"
                                 "    try:\n"
                                 "        is_folder = os.path.isdir(path)\n"
                                 "        found[path] = os.listdir(path) if is_folder else open(path).read()\n"
                                 "    except OSError as error:\n"
                                 "        found[path] = type(error).__name__\n"
                                 "print('FOUND', found)\n"},
        "writes_outside": {"cell": "import os\nwritten = {}\n"
                                   f"for path in {targets!r}:\n"
                                   "    try:\n"
                                   "        with open(path, 'a') as handle:\n"
                                   "            handle.write('pwned')\n"
                                   "        written[path] = 'written'\n"
                                   "    except OSError as error:\n"
                                   "        written[path] = type(error).__name__\n"
                                   "print('WRITTEN', written)\n"},
        "patches_the_checker": {"replace": {"split_fused_qkv": wrong_split},
                                "cell": "import attn_course.checks.heads, attn_course.checks.diagnosis\n"
                                        "attn_course.checks.heads.check_split_fused_qkv = lambda *a, **k: True\n"
                                        "attn_course.checks.diagnosis.same = lambda *a, **k: True\n"
                                        "torch.allclose = lambda *a, **k: True\n"
                                        "torch.equal = lambda *a, **k: True\n"
                                        "check_split_fused_qkv = lambda *a, **k: True\n"},
        "fakes_results": {"replace": {"split_fused_qkv": wrong_split},
                          "cell": "import json\nfake = {'tests': [{'name': 'q1_split_fused_qkv', 'score': 2, "
                                  "'max_score': 2}]}\n"
                                  f"for path in ['results.json', '/tmp/results.json', {paths['own_result']!r}]:\n"
                                  "    try:\n"
                                  "        open(path, 'w').write(json.dumps(fake))\n"
                                  "    except OSError:\n"
                                  "        pass\n"
                                  "print('q1_split_fused_qkv results: All test cases passed!')\n"},
        "floods_the_output": {"cell": "for _ in range(3):\n    print('x' * 10**8)\n"},
        "returns_junk": {"replace": {
            "split_fused_qkv": "def split_fused_qkv(qkv, num_heads, num_kv_heads):\n"
                               "    return (torch.full_like(qkv, float('nan')),) * 3\n",
            "gqa_parameter_count": "def gqa_parameter_count(embed_dim, num_heads, num_kv_heads, bias):\n"
                                   "    return 'many'\n",
            "fixed_multi_head_attention": "def fixed_multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads):\n"
                                          "    return lambda: x\n",
            "grouped_query_attention": "def grouped_query_attention(q, k, v):\n    return q.half()\n",
            "mean_pool_kv_heads": "def mean_pool_kv_heads(w, num_heads, num_kv_heads):\n    return w.new_zeros(1, 1)\n",
        }},
        "fails_on_import": {"cell": "import a_module_that_does_not_exist\n", "first": True},
    }


#: Issue 31's attacks, each module's for its part of the grader: the protocol with the sandbox
#: (hostile/protocol.py; the grader's own resources are test_grader_resources.py's), the tests themselves
#: (hostile/checks.py: answers that mutate their inputs, return empty or broadcasting tensors, or
#: measure where they must predict). Each says its chapter and what grading must give it.
GRADER_ATTACKS = hostile_protocol.ATTACKS
TEST_ATTACKS = hostile_checks.ATTACKS
#: Issue 44's: the forbidden operation, hidden (another spelling, a thread, the garbage collector, the checks).
EVASIONS = hostile_evasion.ATTACKS


def attack_answers_only(solution: pathlib.Path, replace: dict[str, str]) -> nbformat.NotebookNode:
    """The imports and only the attacking answers: every other question is unanswered (scores 0)."""
    notebook = answers_only(solution, replace)
    notebook.cells = notebook.cells[:1] + [cell for cell in notebook.cells[1:]
                                           if any(cell.source == code for code in replace.values())]
    return notebook


def hostile_notebook(solution: pathlib.Path, attack: dict) -> nbformat.NotebookNode:
    notebook = answers_only(solution, attack.get("replace"))
    if "cell" in attack:
        if attack.get("first"):
            notebook.cells[0].source = attack["cell"] + notebook.cells[0].source
        else:
            notebook.cells.insert(1, nbformat.v4.new_code_cell(attack["cell"]))
    if "after" in attack:
        notebook.cells.insert(2, nbformat.v4.new_code_cell(attack["after"]))
    return notebook


def digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def hostile_class(dist, tmp_path_factory):
    require_sandbox()
    base = tmp_path_factory.mktemp("hostile")
    submissions, grades = base / "submissions", base / "grades"
    solution = dist / "autograder" / f"{CHAPTER}.ipynb"
    other = write_notebook(answers_only(solution), submissions / "honest" / f"{CHAPTER}.ipynb")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    paths = {"other": str(other), "hidden_tests": str(dist / "autograder" / f"{CHAPTER}.zip"),
             "master": str(ROOT / "notebooks" / f"{CHAPTER}.ipynb"), "grades": str(grades),
             "checkout": str(ROOT), "package_init": str(ROOT / "attn_course" / "__init__.py"),
             "own_result": str(grades / "fakes_results" / f"{CHAPTER}.json")}
    students = attacks(paths, listener.getsockname()[1])
    for student, attack in students.items():
        write_notebook(hostile_notebook(solution, attack), submissions / student / f"{CHAPTER}.ipynb")
    for student, attack in {**GRADER_ATTACKS, **TEST_ATTACKS, **EVASIONS}.items():
        chapter_solution = dist / "autograder" / f"{attack['chapter']}.ipynb"
        notebook = (attack_answers_only(chapter_solution, attack["replace"]) if student in {**TEST_ATTACKS, **EVASIONS}
                    else hostile_notebook(chapter_solution, attack))
        write_notebook(notebook, submissions / student / f"{attack['chapter']}.ipynb")
    for chapter in {attack["chapter"] for attack in TEST_ATTACKS.values()} - {CHAPTER}:   # honest there too
        write_notebook(answers_only(dist / "autograder" / f"{chapter}.ipynb"),
                       submissions / "honest" / f"{chapter}.ipynb")
    secret = base / "secret.txt"
    secret.write_text("the instructor's secret: 7f3a91c2\n")
    folders = hostile_collect.prepare(submissions, {"solution": solution, "other": other, "secret": secret})
    watched = [other, ROOT / "attn_course" / "__init__.py", dist / "autograder" / f"{CHAPTER}.zip"]
    before = {path: digest(path) for path in watched}
    started = time.monotonic()
    output = run_tool("tools/grade.py", str(submissions), "--autograders", str(dist / "autograder"),
                      "--out", str(grades), *LIMITS)
    seconds = time.monotonic() - started
    try:
        listener.accept()
        connected = True
    except BlockingIOError:
        connected = False
    listener.close()
    rows, feedback = results(grades)
    leftovers = subprocess.run(["pgrep", "-f", "sleep 600"], capture_output=True, text=True).stdout.split()
    feedback_bytes = {(path.parent.name, path.stem): path.stat().st_size for path in grades.glob("*/*.json")}
    return {"rows": rows, "feedback": feedback, "seconds": seconds, "output": output, "connected": connected,
            "unchanged": all(digest(path) == before[path] for path in watched), "leftovers": leftovers,
            "students": students, "paths": paths, "folders": folders, "feedback_bytes": feedback_bytes,
            "grades": grades, "secret": secret.read_text(), "submissions": submissions}


def score(hostile_class, student):
    return float(hostile_class["rows"][student]["total"])


def run_of(hostile_class, student):
    return hostile_class["feedback"][student, CHAPTER]["run"]


def questions_of(hostile_class, student):
    return {q["name"]: q for q in hostile_class["feedback"][student, CHAPTER]["questions"]}


def lost(hostile_class, student):
    """Why a student lost points, for an assertion's message: its run's errors and the output of
    every question not fully scored."""
    run = run_of(hostile_class, student)
    return {"stopped": run["stopped"], "cell_errors": run["cell_errors"],
            "questions": {name: q["output"][:500] for name, q in questions_of(hostile_class, student).items()
                          if q["score"] < q["max_score"]}}


HONEST = 11.0


@pytest.mark.slow
def chapter_score(hostile_class, student, chapter):
    return sum(q["score"] for q in hostile_class["feedback"][student, chapter]["questions"])


@pytest.mark.slow
def test_the_honest_student_in_a_hostile_class_gets_full_marks(hostile_class):
    # (Chapter 11, which only the evasions hand in here, is graded in full for the solutions by test_assignments.)
    possible = sum(q["max_score"] for (student, _), result in hostile_class["feedback"].items()
                   if student == "honest" for q in result["questions"])
    assert score(hostile_class, "honest") == possible > 0
    assert chapter_score(hostile_class, "honest", CHAPTER) == HONEST, lost(hostile_class, "honest")
    for (student, chapter), result in hostile_class["feedback"].items():
        if student == "honest":
            assert result["run"]["stopped"] is None, chapter
            assert all(q["score"] == q["max_score"] for q in result["questions"]), (chapter, result["questions"])
            # The sandbox's user reads /etc/fonts (run by root, a user of its own): no fontconfig noise
            # opens the output that its feedback shows.
            assert "Fontconfig" not in result["run"]["output_start"], (chapter, result["run"]["output_start"][:300])


@pytest.mark.slow
def test_the_whole_class_is_graded_in_bounded_time(hostile_class):
    assert set(hostile_class["rows"]) == {"honest", *hostile_class["students"], *GRADER_ATTACKS, *TEST_ATTACKS,
                                          *EVASIONS, *hostile_class["folders"]} - {hostile_collect.FORMULA_NAME} | {
                                              "'" + hostile_collect.FORMULA_NAME}
    for (student, chapter), result in hostile_class["feedback"].items():
        # the notebook's time, then its calls' (the same again), and the grace of a kill
        assert result["run"]["seconds"] < 2 * NOTEBOOK_SECONDS + 10, (student, chapter)
    assert hostile_class["seconds"] < 420


@pytest.mark.slow
@pytest.mark.parametrize("student", sorted({**GRADER_ATTACKS, **TEST_ATTACKS}))
def test_an_attack_on_the_grader_or_the_tests_gets_exactly_what_it_must(hostile_class, student):
    """Issue 31: hung pipes, forged replies, huge or slow answers, answers that mutate their inputs,
    return empty or broadcasting tensors, or measure instead of predicting."""
    attack = {**GRADER_ATTACKS, **TEST_ATTACKS}[student]
    chapter, expect = attack["chapter"], attack["expect"]
    result = hostile_class["feedback"][student, chapter]
    assert chapter_score(hostile_class, student, chapter) == expect["score"], (result["run"]["stopped"],
                                                                               result["run"]["cell_errors"])
    if "stopped" in expect:
        if expect["stopped"] is None:
            assert result["run"]["stopped"] is None
        else:
            assert expect["stopped"] in (result["run"]["stopped"] or ""), result["run"]["stopped"]
    if "feedback_bytes_below" in expect:
        assert hostile_class["feedback_bytes"][student, chapter] < expect["feedback_bytes_below"]


@pytest.mark.slow
@pytest.mark.parametrize("student", sorted(EVASIONS))
def test_an_answer_that_hides_a_forbidden_call_scores_nothing(hostile_class, student):
    """Issue 44: each answer computes the right value through what its exercise forbids, hidden from a
    watch in the student's process; the grader reads the submitted source, and the question scores 0
    (hidden tests included), saying which call broke which rule."""
    chapter = EVASIONS[student]["chapter"]
    questions = hostile_class["feedback"][student, chapter]["questions"]
    assert len(questions) == len(EVASIONS[student]["replace"])
    for question in questions:
        assert question["score"] == 0 and "which this exercise forbids" in question["output"], question


@pytest.mark.slow
@pytest.mark.parametrize("student", sorted(TEST_ATTACKS))
def test_an_attack_on_the_tests_scores_what_otter_run_gives(hostile_class, dist, tmp_path, student):
    """Issue 31: the mutating, empty, broadcasting and measuring answers once scored under make grade
    what otter run did not give (and fooled otter run too); now both give the same, question by question."""
    from support.exercises import otter_run

    chapter = TEST_ATTACKS[student]["chapter"]
    # The notebook make grade graded, with the student notebook's metadata (otter run reads the
    # assignment's name there; make grade needs no metadata).
    graded = nbformat.read(pathlib.Path(hostile_class["submissions"]) / student / f"{chapter}.ipynb", as_version=4)
    graded.metadata = nbformat.read(dist / "student" / f"{chapter}.ipynb", as_version=4).metadata
    notebook = write_notebook(graded, tmp_path / "submission" / f"{chapter}.ipynb")
    by_otter = otter_run(dist / "autograder" / f"{chapter}.zip", notebook, tmp_path)
    ours = {q["name"]: q for q in hostile_class["feedback"][student, chapter]["questions"]}
    assert set(ours) == set(by_otter)
    assert {name: q["score"] for name, q in ours.items()} == {name: t["score"] for name, t in by_otter.items()}


@pytest.mark.slow
def test_hostile_folders_are_refused_by_name_and_every_row_is_written(hostile_class):
    """Issue 31: links to the solution, a classmate, a secret or /dev/zero, a FIFO, an oversized
    notebook, too many cells, a linked classmate's folder, names that are not UTF-8 or printable,
    a formula for a name."""
    rows, console = hostile_class["rows"], hostile_class["output"]
    for student, entry in hostile_class["folders"].items():
        expect = entry["expect"]
        if "student_cell" in expect:
            assert float(rows[expect["student_cell"]]["total"]) == expect["score"]
            continue
        row = rows[student]
        assert expect["refused"] in row["notes"] and expect["refused"] in console, (student, row)
        if "score" in expect:
            assert float(row["total"]) == expect["score"]
    assert not any(ord(c) < 32 and c not in "\n" for c in console)          # escaped, never raw
    secret = hostile_class["secret"].strip()
    assert secret not in console
    assert all(secret not in path.read_text(errors="replace") for path in hostile_class["grades"].rglob("*")
               if path.is_file())


@pytest.mark.slow
@pytest.mark.parametrize("student, expected, reason", [
    ("loops_forever", HONEST, f"stopped after {CELL_SECONDS} s, the time limit of one cell"),
    ("memory_bomb", HONEST, "RuntimeError"),
    ("memory_creep", HONEST, "MemoryError"),
    ("connects_to_loopback", HONEST, "ConnectionRefusedError"),   # its own loopback: nothing listens
])
def test_a_cell_that_breaks_a_limit_is_stopped_and_the_rest_is_graded(hostile_class, student, expected, reason):
    run = run_of(hostile_class, student)
    assert score(hostile_class, student) == expected, lost(hostile_class, student)
    assert any(reason in event["error"] for event in run["cell_errors"]), run["cell_errors"]


@pytest.mark.slow
def test_a_failed_import_costs_the_answers_that_need_it(hostile_class):
    # Its first cell fails before its imports: the answers that use them fail, naming what is missing.
    run = run_of(hostile_class, "fails_on_import")
    assert any("ModuleNotFoundError" in event["error"] for event in run["cell_errors"])
    lost = [q for q in questions_of(hostile_class, "fails_on_import").values() if q["score"] < q["max_score"]]
    assert lost and all("is not defined" in q["output"] for q in lost)
    assert score(hostile_class, "fails_on_import") < HONEST


@pytest.mark.slow
def test_a_notebook_past_its_time_is_killed_with_the_reason(hostile_class):
    run = run_of(hostile_class, "ignores_the_clock")
    assert score(hostile_class, "ignores_the_clock") == 0
    assert run["stopped"] == f"stopped after {NOTEBOOK_SECONDS} s, the time limit of the whole notebook"


@pytest.mark.slow
def test_a_fork_bomb_is_stopped_at_its_process_limit(hostile_class):
    # Stopped at once: its processes, all busy forking, would starve the notebooks graded alongside.
    run = run_of(hostile_class, "fork_bomb")
    assert score(hostile_class, "fork_bomb") == 0
    assert run["stopped"] == "it reached its limit of 32 processes and threads"
    assert run["seconds"] < NOTEBOOK_SECONDS                   # before the notebook's clock


@pytest.mark.slow
def test_memory_is_limited_for_all_processes_together(hostile_class):
    # Six processes of 512 MiB each, every one within its own 2 GiB address space: 3 GiB in all.
    run = run_of(hostile_class, "memory_in_many_processes")
    assert score(hostile_class, "memory_in_many_processes") == 0
    assert run["stopped"] == "its processes together used more than 2 GiB of memory, the limit"
    assert 2 * 2**30 < run["peak_memory_bytes"] < 3 * 2**30     # stopped on the way, before the 3 GiB


@pytest.mark.slow
def test_an_answer_that_hangs_when_called_is_stopped(hostile_class):
    assert score(hostile_class, "hangs_when_called") == 0
    late = f"ran past {CALL_SECONDS} s"
    assert late in run_of(hostile_class, "hangs_when_called")["stopped"]
    assert late in questions_of(hostile_class, "hangs_when_called")["q1_split_fused_qkv"]["output"]


@pytest.mark.slow
def test_nothing_outside_the_sandbox_can_be_read(hostile_class):
    printed = run_of(hostile_class, "reads_others")["output_start"]
    # The checkout's folder exists inside only as the place where the environment and the two packages
    # are mounted: it holds those and nothing else (no notebooks/, no dist/, no
    # tests/; the grader's package holds no answers, which live only in dist/autograder).
    mounted = {name for name in (".venv", "attn_course", "attn_course_grading") if (ROOT / name).exists()}
    assert "FOUND " in printed, lost(hostile_class, "reads_others")
    found = ast.literal_eval(printed.split("FOUND ", 1)[1].splitlines()[0])
    assert set(found.pop(str(ROOT))) <= mounted
    assert found and all(value in ("FileNotFoundError", "PermissionError") for value in found.values()), found
    assert score(hostile_class, "reads_others") == HONEST, lost(hostile_class, "reads_others")


@pytest.mark.slow
def test_nothing_outside_the_sandbox_can_be_written(hostile_class):
    printed = run_of(hostile_class, "writes_outside")["output_start"]
    written = ast.literal_eval(printed.split("WRITTEN ", 1)[1].splitlines()[0])
    assert written and "written" not in written.values(), written
    assert hostile_class["unchanged"]
    assert not (pathlib.Path(hostile_class["paths"]["grades"]) / "pwned.txt").exists()
    assert not (ROOT / "pwned.txt").exists()


@pytest.mark.slow
def test_the_loopback_port_saw_no_connection(hostile_class):
    assert not hostile_class["connected"]


@pytest.mark.slow
def test_no_process_of_a_submission_outlives_its_grading(hostile_class):
    assert hostile_class["leftovers"] == []


@pytest.mark.slow
@pytest.mark.parametrize("student", ["patches_the_checker", "fakes_results"])
def test_patching_the_checks_or_faking_results_earns_nothing(hostile_class, student):
    questions = questions_of(hostile_class, student)
    q1 = questions["q1_split_fused_qkv"]
    assert score(hostile_class, student) == HONEST - q1["max_score"]      # its split_fused_qkv is wrong
    assert q1["score"] == 0 and "❌ Test case failed" in q1["output"]


@pytest.mark.slow
def test_a_flood_of_output_is_cut_short(hostile_class):
    run = run_of(hostile_class, "floods_the_output")
    # Three prints of 100 MB: all of it is counted, unless the cell ran past its CELL_SECONDS first (seen
    # once in a fresh-clone run: 200,000,324 bytes, three gradings sharing two cores), and then at least
    # the prints it finished. Either way only the start is kept.
    timed_out = any("CellTimedOut" in event["error"] for event in run["cell_errors"])
    assert run["output_bytes"] >= (10**8 if timed_out else 3 * 10**8), run["cell_errors"]
    assert len(run["output_start"]) <= 2000
    assert score(hostile_class, "floods_the_output") == HONEST


@pytest.mark.slow
def test_nan_wrong_dtypes_shapes_and_non_data_fail_with_their_diagnosis(hostile_class):
    questions = questions_of(hostile_class, "returns_junk")
    assert score(hostile_class, "returns_junk") == 0
    assert "which is not data" in questions["q3_find_the_bug"]["output"]
    for question in questions.values():
        assert "❌" in question["output"] and "Traceback" not in question["output"]


@pytest.mark.slow
def test_what_one_submission_changes_in_the_chapters_context_never_reaches_the_next(dist):
    from attn_course_grading.assignment import Assignment

    assignment = Assignment(dist / "autograder" / "01_intuition.zip")
    assert "sentence" in assignment.environment()               # what chapter 01's hidden tests read
    first, second = assignment.environment(), assignment.environment()
    first["sentence"].embeddings.mul_(0)                         # as a call's in-place change would
    assert second["sentence"].embeddings.abs().sum() > 0
    assert first["torch"] is second["torch"]                     # modules are shared, not copied
    # Chapter 01's first cell sets torch's print options; the grader's process keeps its own.
    assert "set_printoptions(precision=3" in "".join(assignment.context)
    assert str(torch.tensor([0.5])) == "tensor([0.5000])"


# --- the proxies: a check calls the student's function as if it were its own ------------------

PROXIED = '''
import time
import torch

class NotMine(Exception):
    pass

def raises_value_error(x):
    raise ValueError(f"bad x of shape {list(x.shape)}")

def raises_its_own(x):
    raise NotMine("mine")

def returns_a_function(x):
    return lambda: x

def doubles_in_place(x):
    x.mul_(2)
    return None

def grad_mode(x):
    return torch.is_grad_enabled(), x.requires_grad

def softmax_with_torch(x):
    return x.softmax(-1)

def softmax_by_hand(x):
    exp = (x - x.max(-1, keepdim=True).values).exp()
    return exp / exp.sum(-1, keepdim=True)

def sleeps(seconds):
    time.sleep(seconds)
    return seconds

answer = 42
'''


@pytest.fixture(scope="module")
def proxied():
    from attn_course_grading.remote import Submission

    sandboxed = sandbox_installed()
    names = ["raises_value_error", "raises_its_own", "returns_a_function", "doubles_in_place", "grad_mode",
             "answer", "undefined", "softmax_with_torch", "softmax_by_hand"]
    with Submission([PROXIED], names, sandbox.Limits(), sandboxed=sandboxed) as submission:
        yield submission, answer_values(submission)


@pytest.mark.slow
def test_answers_are_found_by_kind(proxied):
    submission, answers = proxied
    assert submission.kinds["answer"] == "value" and answers["answer"] == 42
    assert submission.kinds["undefined"] == "missing" and "undefined" not in answers
    assert submission.kinds["raises_value_error"] == "function"


@pytest.mark.slow
def test_the_students_exception_comes_back_with_its_name_and_message(proxied):
    from attn_course_grading.remote import SubmissionError

    _, answers = proxied
    with pytest.raises(ValueError, match=r"^bad x of shape \[2, 3\]$"):
        answers["raises_value_error"](torch.zeros(2, 3))
    with pytest.raises(SubmissionError, match="^mine$") as raised:
        answers["raises_its_own"](torch.zeros(1))
    assert type(raised.value).__name__ == "NotMine"
    with pytest.raises(TypeError, match="which is not data"):
        answers["returns_a_function"](torch.zeros(1))


@pytest.mark.slow
def test_in_place_changes_stay_in_the_sandbox_and_grad_mode_is_the_callers(proxied):
    # An ordinary answer's change of a tensor argument is not copied back (issue 31: answers that
    # zeroed v in place fooled checks); only kernel launches and caches are (test_hostile_protocol).
    _, answers = proxied
    x = torch.ones(3)
    assert answers["doubles_in_place"](x) is None and torch.equal(x, torch.ones(3))
    with torch.no_grad():
        assert answers["grad_mode"](torch.ones(1, requires_grad=True)) == (False, True)
    assert answers["grad_mode"](torch.ones(1)) == (True, False)


@pytest.mark.slow
def test_a_forbidden_call_is_seen_in_the_sandbox_and_named_as_in_the_notebook(proxied):
    from attn_course.checks.diagnosis import CheckFailed, call_answer
    from attn_course.checks.forbidden import Forbidden

    _, answers = proxied
    rules = [Forbidden("torch.softmax", "write it from exp and sum")]
    x = torch.randn(2, 5)
    with pytest.raises(CheckFailed) as remote:
        call_answer("check_softmax", answers["softmax_with_torch"], x, forbidden=rules)
    with pytest.raises(CheckFailed) as local:
        call_answer("check_softmax", lambda t: t.softmax(-1), x, forbidden=rules)
    assert str(remote.value) == str(local.value)
    assert "calls Tensor.softmax, which this exercise forbids: write it from exp and sum" in str(remote.value)
    assert torch.allclose(call_answer("check_softmax", answers["softmax_by_hand"], x, forbidden=rules),
                          x.softmax(-1))


@pytest.mark.slow
def test_all_calls_together_get_the_notebooks_time():
    from attn_course_grading.remote import Submission, SubmissionStopped

    sandboxed = sandbox_installed()
    # 10 s for the notebook: starting torch in the sandbox took over 4 s on a loaded CI machine.
    limits = sandbox.Limits(seconds=10, call_seconds=3)
    with Submission([PROXIED], ["sleeps"], limits, sandboxed=sandboxed) as submission:
        sleeps = answer_values(submission)["sleeps"]
        assert sleeps(0.1) == 0.1
        with pytest.raises(SubmissionStopped, match="ran past 3 s"):
            sleeps(3.5)                                   # one call past --call-seconds
    # Each call gets 5 s here, twice what it sleeps: on a loaded machine a 2.5 s call once took over
    # 3 s with the round trip, and the per-call limit fired before the one on all calls together.
    with Submission([PROXIED], ["sleeps"], sandbox.Limits(seconds=10, call_seconds=5),
                    sandboxed=sandboxed) as submission:
        sleeps = answer_values(submission)["sleeps"]
        with pytest.raises(SubmissionStopped, match="ran past 10 s in all"):
            for _ in range(6):                            # each call within its 5 s, 15 s in all
                assert sleeps(2.5) == 2.5


# --- every forbidden shortcut: the same verdict in the notebook and through the sandbox ---------

def shortcut_cases():
    """(chapter, function, planted code, question, hint) of every planted shortcut (students
    alan and zoe), each refused by name."""
    from support.planted import PLANTED_BY_CHAPTER

    return [pytest.param(chapter, name, *entry, id=f"{chapter[:2]}-{student}-{name}")
            for chapter, students in PLANTED_BY_CHAPTER.items() for student in ("alan", "zoe")
            for name, entry in students.get(student, {}).items() if "forbids" in entry[2]]


@pytest.fixture(scope="module")
def shortcut_submissions():
    """{chapter: the answer proxies of the planted shortcuts}, every chapter's in one sandbox (one
    start of torch, not ten): each chapter's imports, then its shortcuts, each kept under its own
    alias (two students may plant the same function). The shortcuts look up names when called, so
    a name two chapters bind to different objects, if a shortcut uses it, would be the later
    chapter's: the fixture refuses that case instead of testing the wrong function."""
    from attn_course_grading.remote import Submission

    cases = [case.values for case in shortcut_cases()]
    used = {node.id for _, _, code, _, _ in cases for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name)}
    cells, bound = [], {}
    for chapter in sorted({chapter for chapter, *_ in cases}):
        imports = "\n".join(ast.unparse(node) for node in chapter_imports(ROOT / "notebooks" / f"{chapter}.ipynb"))
        cells.append(imports)
        namespace: dict = {}
        exec(imports, namespace)                                  # the same modules, imported here too
        for name in used & namespace.keys():
            if bound.setdefault(name, (chapter, namespace[name]))[1] is not namespace[name]:
                pytest.fail(f"{name} is one thing in chapter {bound[name][0]} and another in {chapter}: grade "
                            "their shortcuts in separate sandboxes")
        cells += [cell for index, (case_chapter, name, code, _, _) in enumerate(cases) if case_chapter == chapter
                  for cell in (code, f"shortcut_{index} = {name}")]
    with Submission(cells, [f"shortcut_{index}" for index in range(len(cases))], sandbox.Limits(),
                    sandboxed=sandbox_installed()) as submission:
        values = answer_values(submission)
        proxies: dict[str, dict] = {}
        for index, (chapter, name, code, _, _) in enumerate(cases):
            proxies.setdefault(chapter, {})[name, code] = values[f"shortcut_{index}"]
        yield proxies


@pytest.mark.slow
@pytest.mark.parametrize("chapter, name, code, question, hint", shortcut_cases())
def test_a_forbidden_shortcut_gets_one_verdict_in_the_notebook_and_under_make_grade(shortcut_submissions, chapter,
                                                                                      name, code, question, hint):
    from support.exercises import chapter_namespace, failures, public_tests

    master = ROOT / "notebooks" / f"{chapter}.ipynb"
    tests = public_tests(master)[question]
    local = chapter_namespace(master)
    exec(compile(code, f"<planted {name}>", "exec"), local)
    in_notebook = failures(tests, local, question)
    remote = dict(chapter_namespace(master), **{name: shortcut_submissions[chapter][(name, code)]})
    under_grading = failures(tests, remote, question)
    assert any(hint in message for message in in_notebook), in_notebook
    assert under_grading == in_notebook
