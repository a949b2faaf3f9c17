"""The grader's own resources, bounded per submission (issue 31).

Each submission is graded in a process of its own (:func:`attn_course_grading.grader.grade`):
what its answers return, and what the checks make of it, stays in that process, under its own
memory limit and time; the class graded beside it keeps its marks, its time and its printed lines.
The assignment here is made up (four small questions, no chapter to build) so that the whole
file runs in well under a minute.
"""

from __future__ import annotations

import pathlib
import resource
import subprocess
import sys
import threading
import time
import zipfile

import nbformat
import pytest

from attn_course_grading import grader, sandbox
from attn_course_grading.assignment import Assignment

from helpers import require_sandbox, sandbox_installed

SOLUTION_CELLS = [
    "import time\nimport torch\n",
    "reference = torch.arange(1024.0)          # a teaching cell: the tests' context\n",
    "def double(x):\n    # BEGIN SOLUTION\n    return 2 * x\n    # END SOLUTION\n",
    "def exponent(k):\n    # BEGIN SOLUTION\n    return k\n    # END SOLUTION\n",
    "def repetitions():\n    # BEGIN SOLUTION\n    return 3\n    # END SOLUTION\n",
]

TEST_FILES = {
    # Broadcasting allclose: an answer of shape (n, 1) makes the check hold n x 1024 numbers.
    "q1_double": (2, '''
@test_case(points=None, hidden=False)
def test_q1_double_1(torch, double, reference):
    assert torch.allclose(double(reference), 2 * reference), 'double(x) is not 2 x'

@test_case(points=None, hidden=True)
def test_q1_double_2(torch, double):
    print("PRINTED BY A TEST")
    assert torch.equal(double(torch.ones(3)), torch.full((3,), 2.0)), 'double(ones) is not twos'
'''),
    # The check's own work grows with the answer, holding the GIL: 3 ** 10**8 takes minutes.
    "q2_power": (1, '''
@test_case(points=None, hidden=False)
def test_q2_power_1(exponent):
    assert 3 ** exponent(10) == 59049, 'exponent(10) is not 10'
'''),
    "q3_many_calls": (1, '''
@test_case(points=None, hidden=False)
def test_q3_many_calls_1(torch, double):
    for _i in range(8):
        assert double(torch.tensor(float(_i))) == 2 * _i, 'double is wrong on a number'
'''),
    # A loop as long as the answer says, in torch (which releases the GIL).
    "q4_repeat": (1, '''
@test_case(points=None, hidden=False)
def test_q4_repeat_1(torch, repetitions):
    _count = 0
    for _ in range(repetitions()):
        _ = torch.ones(64, 64) @ torch.ones(64, 64)
        _count += 1
    assert _count == 3, 'repetitions() is not 3'
'''),
}
HONEST = 5.0


def make_assignment(folder: pathlib.Path) -> Assignment:
    """The made-up chapter ``99_resources``: its autograder zip and solution notebook."""
    archive = folder / "99_resources.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for name, (points, body) in TEST_FILES.items():
            handle.writestr(f"tests/{name}.py", "from otter.test_files import test_case\n\nOK_FORMAT = False\n\n"
                                                f"name = {name!r}\npoints = {points}\n{body}")
    solution = nbformat.v4.new_notebook()
    solution.cells = [nbformat.v4.new_code_cell(source) for source in SOLUTION_CELLS]
    nbformat.write(solution, archive.with_suffix(".ipynb"))
    return Assignment(archive)


def submission(folder: pathlib.Path, student: str, replace: dict[str, str] | None = None,
               cell: str | None = None) -> pathlib.Path:
    """A student's notebook: the solution's cells, some answers replaced, an attack cell first."""
    cells = [cell] if cell else []
    for source in SOLUTION_CELLS:
        name = next((name for name in replace or {} if source.startswith(f"def {name}(")), None)
        cells.append(replace[name] if name else source)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    path = folder / student / "99_resources.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)
    return path


@pytest.fixture(scope="module")
def assignment(tmp_path_factory):
    require_sandbox()
    return make_assignment(tmp_path_factory.mktemp("assignment"))


def running(*argv: str) -> list[int]:
    """The processes whose command line is exactly ``argv`` (``pgrep -f`` would also find any
    shell whose command line merely mentions it)."""
    found, wanted = [], [part.encode() for part in argv]
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().split(b"\0")[:-1] == wanted:
                found.append(int(entry.name))
        except OSError:
            pass                           # ended meanwhile
    return found


def grade_at_once(assignment, notebooks: dict[str, pathlib.Path], limits: sandbox.Limits) -> dict[str, dict]:
    """Grade ``notebooks`` at the same time, one thread each, as ``make grade --jobs N`` does;
    each result gains ``finished``: seconds from the start of all to its end."""
    results: dict[str, dict] = {}
    started = time.monotonic()

    def one(student: str) -> None:
        results[student] = grader.grade(assignment, notebooks[student], limits, sandboxed=sandbox_installed())
        results[student]["finished"] = time.monotonic() - started

    threads = [threading.Thread(target=one, args=(student,)) for student in notebooks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def total(result: dict) -> float:
    return sum(question["score"] for question in result["questions"])


def by_name(result: dict) -> dict[str, dict]:
    return {question["name"]: question for question in result["questions"]}


@pytest.mark.slow
def test_an_answer_that_makes_the_checks_exhaust_memory_is_stopped_in_its_own_process(assignment, tmp_path):
    # 2 MiB of answer that a broadcasting allclose turns into 2 GiB per intermediate tensor: more
    # than the 2 GiB the checks may add to what the grading process held when it started.
    hostile = submission(tmp_path, "huge", {"double": "def double(x):\n    return torch.zeros(2**19, 1)\n"})
    honest = submission(tmp_path, "honest")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    results = grade_at_once(assignment, {"huge": hostile, "honest": honest},
                            sandbox.Limits(seconds=60, memory_bytes=2 * 2**30))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < 128 * 2**20, f"the grader's own process grew by {grown / 2**20:.0f} MiB"
    assert total(results["honest"]) == HONEST and results["honest"]["run"]["stopped"] is None
    huge = by_name(results["huge"])
    assert huge["q1_double"]["score"] == 0 and "can't allocate memory" in huge["q1_double"]["output"]
    # Its process survived the failed allocation: the questions its answer does not spoil are graded.
    assert huge["q2_power"]["score"] == huge["q4_repeat"]["score"] == 1
    # It held the 512 MiB of booleans allclose makes first, never the 2 GiB tensors that follow.
    assert results["huge"]["run"]["grader_peak_memory_bytes"] < 1 * 2**30


@pytest.mark.slow
def test_a_slow_answer_neither_delays_a_classmate_nor_silences_a_line(assignment, tmp_path, capsys):
    # Every call sleeps 2 s, under the 3 s a call may take: 10 calls in all, past the 10 s all get.
    slow = submission(tmp_path, "slow", {"double": "def double(x):\n    time.sleep(2)\n    return 2 * x\n"})
    honest = submission(tmp_path, "honest")
    printing, ticks = threading.Event(), []

    def tick() -> None:                # the class's progress lines, printed meanwhile
        while not printing.is_set():
            ticks.append(f"tick {len(ticks)}")
            print(ticks[-1], flush=True)
            time.sleep(0.05)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        results = grade_at_once(assignment, {"slow": slow, "honest": honest},
                                sandbox.Limits(seconds=10, call_seconds=3))
    finally:
        printing.set()
        ticker.join()
    slow_run = results["slow"]["run"]
    assert total(results["honest"]) == HONEST
    assert "10 s in all" in slow_run["stopped"], slow_run
    # Graded beside it, not after it: the honest student's tests never waited for the slow ones.
    assert results["honest"]["finished"] < results["slow"]["finished"] - 5, results
    # The slow one's tests were capped: the notebook, then 10 s of calls (not 10 x 2 s).
    assert slow_run["seconds"] < 10 + 10 + 5, slow_run
    printed = capsys.readouterr().out.splitlines()
    assert [line for line in printed if line.startswith("tick")] == ticks
    assert "PRINTED BY A TEST" not in printed


@pytest.mark.slow
def test_checks_that_run_long_on_an_answer_are_stopped_at_the_test_phase_cap(assignment, tmp_path, monkeypatch):
    monkeypatch.setattr(grader, "KILL_GRACE_SECONDS", 2.0)
    marker = "sleep 613"               # a process each notebook leaves behind, if its sandbox survived
    starts = f"import subprocess\nsubprocess.Popen({marker.split()!r}, start_new_session=True)\n"
    # The loop yields the GIL: the grading process stops itself. 3 ** 10**8 holds it for minutes:
    # the grader kills the grading process, and its sandbox dies with it.
    looping = submission(tmp_path, "looping", {"repetitions": "def repetitions():\n    return 10**9\n"}, starts)
    wedged = submission(tmp_path, "wedged", {"exponent": "def exponent(k):\n    return 10**8\n"}, starts)
    limits = sandbox.Limits(seconds=8, call_seconds=1)
    results = grade_at_once(assignment, {"looping": looping, "wedged": wedged}, limits)
    cap = limits.seconds + limits.call_seconds
    for student, graded, lost in (("looping", ["q1_double", "q2_power", "q3_many_calls"], "q4_repeat"),
                                  ("wedged", ["q1_double"], "q2_power")):
        run, questions = results[student]["run"], by_name(results[student])
        assert run["stopped"] == f"the grader's tests of it ran past {cap:g} s in all", (student, run)
        assert run["seconds"] < limits.seconds + cap + grader.KILL_GRACE_SECONDS + 5, (student, run)
        assert [questions[name]["score"] for name in graded] == [2, 1, 1][:len(graded)], (student, questions)
        assert questions[lost]["score"] == 0 and "not graded" in questions[lost]["output"]
        assert list(questions) == list(TEST_FILES)        # every question, graded or not
    assert wait_for(lambda: not running(*marker.split()), 5), "a sandbox outlived its grading"


GRADER_KILLED_MID_WAY = '''
import pathlib, sys
sys.path[:0] = [{tests!r}, {grading!r}]
import test_grader_resources as here
from attn_course_grading import grader, sandbox

if __name__ == "__main__":
    folder = pathlib.Path({folder!r})
    slow = ("def double(x):\\n    import subprocess\\n"
            "    subprocess.Popen(['sleep', '619'], start_new_session=True)\\n    time.sleep(20)\\n    return 2 * x\\n")
    notebook = here.submission(folder, "slow", {{"double": slow}})
    grader.grade(here.make_assignment(folder), notebook, sandbox.Limits(seconds=60, call_seconds=30))
'''


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.slow
def test_nothing_of_a_submission_outlives_a_grader_that_is_killed(assignment, tmp_path):
    # make grade killed (kill -9, a closed terminal) in the middle of a call of 20 s, when the
    # grading process has nothing to send: it ends at once all the same, and its sandbox with it.
    here = pathlib.Path(__file__).resolve().parent
    script = tmp_path / "grade_one.py"
    script.write_text(GRADER_KILLED_MID_WAY.format(tests=str(here.parent), grading=str(here), folder=str(tmp_path)))

    process = subprocess.Popen([sys.executable, str(script)], cwd=here.parent.parent)
    try:
        assert wait_for(lambda: running("sleep", "619"), 60), "the answer was never called"
    finally:
        process.kill()
        process.wait()
    assert wait_for(lambda: not running("sleep", "619"), 5), "a sandbox outlived the grader"


def test_a_context_whose_process_dies_is_reported_with_its_exit_code(tmp_path):
    # The context is built in a process of its own; one that dies before sending it is named with
    # the code it ended with (read after the process is joined: before, it is unknown).
    dying = make_assignment(tmp_path)
    dying.context = ["import os\nos._exit(3)\n"]
    with pytest.raises(RuntimeError, match=r"building 99_resources's context failed \(its process ended with code 3\)"):
        dying.shipped_context()


def test_two_processes_never_hold_the_same_sandbox_user():
    # RLIMIT_NPROC counts per user: two graders that both took uid 61000 made one notebook's fork fail
    # for the other's processes. Another process asks while this one holds the first free id.
    ask = [sys.executable, "-c", "from attn_course_grading.sandbox import SandboxUser; print(SandboxUser().uid)"]
    held = sandbox.SandboxUser()
    try:
        root = pathlib.Path(__file__).resolve().parents[2]
        other = int(subprocess.run(ask, capture_output=True, text=True, check=True, cwd=root).stdout)
        assert other != held.uid and other in sandbox.SANDBOX_UIDS
    finally:
        held.release()
