"""Grading untrusted notebooks: what crosses the sandbox is data, and hostile submissions fail.

The first tests need no sandbox: the message format (attn_course.grading.wire) and the sandbox's
command line and environment. The class tests grade with tools/grade.py, as `make grade` does:
a class of hostile students of chapter 02 (each hands in the solutions plus one attack, so its
honest score is known), and the two chapters whose exercises are called with more than tensors
(04: a model and its caches; 06: a Triton kernel), as short notebooks of their answers.
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

from attn_course.grading import sandbox, wire
from attn_course.kv_cache import KVCache
from attn_course.language_model import LanguageModelConfig, TinyLanguageModel

from helpers import ROOT, in_ci, require_sandbox, run_tool

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


def test_without_bubblewrap_make_grade_refuses_and_says_how_to_install(tmp_path):
    (tmp_path / "submissions" / "ada").mkdir(parents=True)
    environment = dict(os.environ, PATH=str(pathlib.Path(sys.executable).parent))   # no bwrap on it
    environment.pop("TRUSTED", None)
    completed = subprocess.run([sys.executable, "tools/grade.py", str(tmp_path / "submissions"), "--autograders",
                                str(tmp_path)], cwd=ROOT, capture_output=True, text=True, env=environment)
    assert completed.returncode != 0
    assert "refusing to run submissions without a sandbox" in completed.stderr
    assert "apt-get install bubblewrap" in completed.stderr and "TRUSTED=1" in completed.stderr


# --- short submissions: the chapter's imports and its answers ---------------------------------


def answers_only(solution: pathlib.Path, replaced: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """A notebook of a solution notebook's imports and answer cells (``replaced``: a planted
    student's versions of some answers): what a student who skipped the reading hands in."""
    imports, answers = [], []
    for cell in nbformat.read(solution, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        if "# BEGIN SOLUTION" in cell.source:
            name = next((n for n in (replaced or {}) if cell.source.startswith(f"def {n}(")), None)
            answers.append(replaced[name] if name else cell.source)
            continue
        try:
            body = ast.parse(cell.source).body
        except SyntaxError:
            continue
        imports += [node for node in body if isinstance(node, (ast.Import, ast.ImportFrom))
                    and "otter" not in ast.unparse(node)]
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(ast.unparse(ast.Module(body=imports, type_ignores=[])))]
    notebook.cells += [nbformat.v4.new_code_cell(source) for source in answers]
    return notebook


def write(notebook: nbformat.NotebookNode, path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)
    return path


def results(grades: pathlib.Path) -> tuple[dict, dict]:
    """``({student: csv row}, {(student, chapter): result json})`` of a tools/grade.py run."""
    with open(grades / "grades.csv") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    feedback = {(path.parent.name, path.stem): json.loads(path.read_text()) for path in grades.glob("*/*.json")}
    return rows, feedback


# Chapters whose answers are called with more than tensors: 04 (a TinyLanguageModel and KVCaches,
# appended to by the call) and 06 (a Triton kernel, launched as kernel[grid](...), writing its output).
OBJECT_CHAPTERS = ("04_causal", "06_flash_attention")


@pytest.mark.slow
def test_models_caches_and_kernels_cross_as_data(dist, tmp_path):
    from test_assignments import PLANTED

    submissions = tmp_path / "submissions"
    expected = {}
    for chapter in OBJECT_CHAPTERS:
        solution = dist / "autograder" / f"{chapter}.ipynb"
        write(answers_only(solution), submissions / "solutions" / f"{chapter}.ipynb")
        student = max(sorted(s for s in PLANTED if chapter in PLANTED[s]), key=lambda s: len(PLANTED[s][chapter]))
        functions = PLANTED[student][chapter]
        write(answers_only(solution, {name: code for name, (code, _, _) in functions.items()}),
              submissions / student / f"{chapter}.ipynb")
        expected[student, chapter] = functions
    trusted = [] if in_ci() or sandbox.sandbox_problem() is None else ["--trusted"]
    run_tool("tools/grade.py", str(submissions), "--autograders", str(dist / "autograder"), "--out",
             str(tmp_path / "grades"), *trusted)
    rows, feedback = results(tmp_path / "grades")
    assert float(rows["solutions"]["total"]) == float(rows["solutions"]["possible"]) > 0
    for (student, chapter), functions in expected.items():
        questions = {q["name"]: q for q in feedback[student, chapter]["questions"]}
        for _, question, hint in functions.values():
            assert questions[question]["score"] < questions[question]["max_score"]
            assert hint in questions[question]["output"], questions[question]["output"]


# --- a class of hostile students -----------------------------------------------------------------
# Each hands in chapter 02's answers (12 points when right) and one attack, placed before them
# unless it replaces them. LIMITS are tight so that the class is graded in about a minute.

LIMITS = ["--seconds", "25", "--cell-seconds", "3", "--call-seconds", "5", "--memory-gib", "2",
          "--processes", "64", "--jobs", "2"]


def attacks(paths: dict[str, str], port: int) -> dict[str, dict]:
    """student -> {"cell": the attack, "replace": answers it replaces, "before": put first}."""
    snoop = [paths["other"], paths["hidden_tests"], paths["master"], paths["grades"], "/root/.bashrc",
             "/etc/shadow", paths["checkout"]]
    targets = [paths["other"], paths["grades"] + "/pwned.txt", paths["package_init"], paths["checkout"] + "/pwned.txt",
               "/usr/pwned.txt"]
    wrong_softmax = "def stable_softmax(scores):\n    return torch.zeros_like(scores)\n"
    return {
        "loops_forever": {"cell": "while True:\n    pass\n"},
        "ignores_the_clock": {"cell": "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                                      "while True:\n    pass\n"},
        "hangs_when_called": {"replace": {"stable_softmax": "def stable_softmax(scores):\n    while True:\n"
                                                            "        pass\n"}},
        "memory_bomb": {"cell": "huge = torch.empty(2**40, dtype=torch.uint8)\n"},
        "memory_creep": {"cell": "hog = []\nwhile True:\n    hog.append(bytearray(2**26))\n",
                         "after": "del hog\n"},
        "memory_in_many_processes": {"cell": "import os, time\nfor _ in range(6):\n    if os.fork() == 0:\n"
                                             "        hog = b'x' * 2**30\n        time.sleep(60)\n"
                                             "        os._exit(0)\ntime.sleep(60)\n"},
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
        "patches_the_checker": {"replace": {"stable_softmax": wrong_softmax},
                                "cell": "import attn_course.checks.softmax, attn_course.checks.diagnosis\n"
                                        "attn_course.checks.softmax.check_softmax = lambda *a, **k: True\n"
                                        "attn_course.checks.diagnosis.same = lambda *a, **k: True\n"
                                        "torch.allclose = lambda *a, **k: True\n"
                                        "torch.equal = lambda *a, **k: True\n"
                                        "check_softmax = lambda *a, **k: True\n"},
        "fakes_results": {"replace": {"stable_softmax": wrong_softmax},
                          "cell": "import json\nfake = {'tests': [{'name': 'q1_stable_softmax', 'score': 2, "
                                  "'max_score': 2}]}\n"
                                  f"for path in ['results.json', '/tmp/results.json', {paths['own_result']!r}]:\n"
                                  "    try:\n"
                                  "        open(path, 'w').write(json.dumps(fake))\n"
                                  "    except OSError:\n"
                                  "        pass\n"
                                  "print('q1_stable_softmax results: All test cases passed!')\n"},
        "floods_the_output": {"cell": "for _ in range(3):\n    print('x' * 10**8)\n"},
        "returns_junk": {"replace": {
            "stable_softmax": "def stable_softmax(scores):\n    return torch.full_like(scores, float('nan'))\n",
            "my_attention": "def my_attention(q, k, v, mask=None):\n    return (q @ k.transpose(-2, -1)).half()\n",
            "predicted_score_std": "def predicted_score_std(d_k, std_q=1.0, std_k=1.0):\n    return 'big'\n",
            "fixed_attention": "def fixed_attention(q, k, v, mask):\n    return lambda: v\n",
            "query_gradient": "def query_gradient(q, k, upstream):\n    return q.new_zeros(1, 1)\n",
        }},
        "fails_on_import": {"cell": "import a_module_that_does_not_exist\n", "first": True},
    }


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
    solution = dist / "autograder" / "02_formula.ipynb"
    other = write(answers_only(solution), submissions / "honest" / "02_formula.ipynb")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    paths = {"other": str(other), "hidden_tests": str(dist / "autograder" / "02_formula.zip"),
             "master": str(ROOT / "notebooks" / "02_formula.ipynb"), "grades": str(grades),
             "checkout": str(ROOT), "package_init": str(ROOT / "attn_course" / "__init__.py"),
             "own_result": str(grades / "fakes_results" / "02_formula.json")}
    students = attacks(paths, listener.getsockname()[1])
    for student, attack in students.items():
        write(hostile_notebook(solution, attack), submissions / student / "02_formula.ipynb")
    watched = [other, ROOT / "attn_course" / "__init__.py", dist / "autograder" / "02_formula.zip"]
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
    return {"rows": rows, "feedback": feedback, "seconds": seconds, "output": output, "connected": connected,
            "unchanged": all(digest(path) == before[path] for path in watched), "leftovers": leftovers,
            "students": students, "paths": paths}


def score(hostile_class, student):
    return float(hostile_class["rows"][student]["total"])


def run_of(hostile_class, student):
    return hostile_class["feedback"][student, "02_formula"]["run"]


HONEST = 12.0


@pytest.mark.slow
def test_the_honest_student_in_a_hostile_class_gets_full_marks(hostile_class):
    assert float(hostile_class["rows"]["honest"]["possible"]) == HONEST
    assert score(hostile_class, "honest") == HONEST and run_of(hostile_class, "honest")["stopped"] is None


@pytest.mark.slow
def test_the_whole_class_is_graded_in_bounded_time(hostile_class):
    assert set(hostile_class["rows"]) == {"honest", *hostile_class["students"]}
    for student in hostile_class["rows"]:
        assert run_of(hostile_class, student)["seconds"] < 25 + 15, student     # --seconds 25, plus the tests
    assert hostile_class["seconds"] < 240


@pytest.mark.slow
@pytest.mark.parametrize("student, expected, reason", [
    ("loops_forever", HONEST, "stopped after 3 s, the time limit of one cell"),
    ("memory_bomb", HONEST, "RuntimeError"),
    ("memory_creep", HONEST, "MemoryError"),
    ("fork_bomb", HONEST, "BlockingIOError"),
    ("connects_to_loopback", HONEST, "ConnectionRefusedError"),   # its own loopback: nothing listens
    ("fails_on_import", 0.0, "ModuleNotFoundError"),
])
def test_a_cell_that_breaks_a_limit_is_stopped_and_the_rest_is_graded(hostile_class, student, expected, reason):
    run = run_of(hostile_class, student)
    assert score(hostile_class, student) == expected
    assert any(reason in event["error"] for event in run["cell_errors"]), run["cell_errors"]


@pytest.mark.slow
def test_a_notebook_past_its_time_is_killed_with_the_reason(hostile_class):
    run = run_of(hostile_class, "ignores_the_clock")
    assert score(hostile_class, "ignores_the_clock") == 0
    assert run["stopped"] == "stopped after 25 s, the time limit of the whole notebook"


@pytest.mark.slow
def test_memory_is_limited_for_all_processes_together(hostile_class):
    # Six processes of 1 GiB each, every one within its own 2 GiB address space: 6 GiB in all.
    run = run_of(hostile_class, "memory_in_many_processes")
    assert score(hostile_class, "memory_in_many_processes") == 0
    assert run["stopped"] == "its processes together used more than 2 GiB of memory, the limit"
    assert run["peak_memory_bytes"] < 4 * 2**30         # stopped on the way, far from 6 GiB


@pytest.mark.slow
def test_an_answer_that_hangs_when_called_is_stopped(hostile_class):
    assert score(hostile_class, "hangs_when_called") == 0
    assert "ran past 5 s" in run_of(hostile_class, "hangs_when_called")["stopped"]
    q1 = hostile_class["feedback"]["hangs_when_called", "02_formula"]["questions"][0]
    assert "ran past 5 s" in q1["output"]


@pytest.mark.slow
def test_nothing_outside_the_sandbox_can_be_read(hostile_class):
    printed = run_of(hostile_class, "reads_others")["output_start"]
    found = ast.literal_eval(printed.split("FOUND ", 1)[1].splitlines()[0])
    # The checkout's folder exists inside only as the place where the environment and the package
    # are mounted: it holds those two and nothing else (no notebooks/, no dist/, no tests/).
    mounted = {name for name in (".venv", "attn_course") if (ROOT / name).exists()}
    assert set(found.pop(str(ROOT))) <= mounted
    assert found and all(value in ("FileNotFoundError", "PermissionError") for value in found.values()), found
    assert score(hostile_class, "reads_others") == HONEST


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
    assert score(hostile_class, student) == HONEST - 2                  # its stable_softmax is wrong
    questions = {q["name"]: q for q in hostile_class["feedback"][student, "02_formula"]["questions"]}
    assert questions["q1_stable_softmax"]["score"] == 0
    assert "❌ Test case failed" in questions["q1_stable_softmax"]["output"]


@pytest.mark.slow
def test_a_flood_of_output_is_cut_short(hostile_class):
    run = run_of(hostile_class, "floods_the_output")
    assert run["output_bytes"] >= 3 * 10**8 and len(run["output_start"]) <= 2000
    assert score(hostile_class, "floods_the_output") == HONEST


@pytest.mark.slow
def test_nan_wrong_dtypes_shapes_and_non_data_fail_with_their_diagnosis(hostile_class):
    questions = {q["name"]: q for q in hostile_class["feedback"]["returns_junk", "02_formula"]["questions"]}
    assert score(hostile_class, "returns_junk") == 0
    assert "NaN" in questions["q1_stable_softmax"]["output"]
    assert "which is not data" in questions["q4_find_the_bug"]["output"]
    for question in questions.values():
        assert "❌" in question["output"]


@pytest.mark.slow
def test_what_one_submission_changes_in_the_chapters_context_never_reaches_the_next(dist):
    from attn_course.grading.grader import Assignment

    assignment = Assignment(dist / "autograder" / "01_intuition.zip")
    assert "sentence" in assignment.environment()               # what chapter 01's hidden tests read
    first, second = assignment.environment(), assignment.environment()
    first["sentence"].embeddings.mul_(0)                         # as a call's in-place change would
    assert second["sentence"].embeddings.abs().sum() > 0
    assert first["torch"] is second["torch"]                     # modules are shared, not copied
