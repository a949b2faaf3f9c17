"""Grade one submission of one chapter: its notebook in a sandbox, the tests in a grading process.

:func:`grade` starts a grading process for the submission alone (from the
:mod:`~attn_course_grading.forkserver`), which runs the notebook
(:class:`~attn_course_grading.remote.Submission`) and otter's own test runner on the chapter's
imports and context (:class:`~attn_course_grading.assignment.Assignment`) and the answers as proxies
(:mod:`~attn_course_grading.proxies`): scores and feedback read as ``otter run`` gives them, but no
test runs in the student's process, and what the checks make of an answer stays in that grading
process, under its own memory limit and time. A program that calls :func:`grade` keeps its main code
under ``if __name__ == "__main__":`` (the fork server imports it).
"""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import pathlib
import resource
import select
import sys
import threading
import time
import traceback

import torch

from attn_course.flash.triton_mode import triton_installed
from attn_course_grading import forkserver, proc, reading, sandbox
from attn_course_grading.assignment import Assignment
from attn_course_grading.proxies import SourceVerdicts, answer_values
from attn_course_grading.remote import Submission

#: Each question's tests start from this seed (in the grading process of each submission).
TEST_SEED = 0
#: The most a grading process's message may hold (its questions' feedback is far smaller).
MAX_RESULT_BYTES = 16 * 2**20
#: How long past its phase's time a grading process is given to stop by itself (it kills its own
#: sandbox and says why) before this process kills it.
KILL_GRACE_SECONDS = 10.0


def grade(assignment: Assignment, notebook: pathlib.Path, limits: sandbox.Limits | None = None, *,
          sandboxed: bool = True) -> dict:
    """Grade one notebook: run it and every test, in a grading process of its own.

    The grading process's memory limit is its address space at start plus ``limits.memory_bytes``.
    Its phases are timed from here: the notebook gets ``limits.seconds``, then the tests
    ``limits.seconds + limits.call_seconds`` (the answers' calls together ``limits.seconds``, the
    checks' own work one call more). Past its time it is killed with its sandbox; the questions not
    graded score 0, and ``run["stopped"]`` says why.

    Args:
        assignment: the chapter's :class:`Assignment`.
        notebook: the student's ``.ipynb``.
        limits: :class:`~attn_course_grading.sandbox.Limits` (the defaults when None).
        sandboxed: False for trusted submissions only (``make grade TRUSTED=1``).

    Returns:
        ``{"questions": [{"name", "score", "max_score", "output"}...], "run": {...}}``, plain data:
        per question what ``otter run`` reports; how the run went (seconds, failed cells, why it
        stopped, peak memory and processes, what the notebook printed).

    Raises:
        TypeError: ``assignment`` is not an :class:`Assignment`, or ``limits`` not a ``Limits``.
        RuntimeError: the grader itself failed (not the submission), with its traceback; or the
            chapter's exercises are Triton kernels and Triton is not installed here.
    """
    if not isinstance(assignment, Assignment):
        raise TypeError(f"grade: assignment must be an Assignment, got {type(assignment).__name__}")
    if assignment.needs_triton and not triton_installed():
        # Its checks would skip, and skipped checks would pass: refuse rather than grade nothing.
        raise RuntimeError(f"grade: {assignment.name}'s exercises are Triton kernels, and Triton is not installed "
                           "here (it ships for Linux only): grade this chapter on Linux")
    limits = sandbox.Limits() if limits is None else limits
    if not isinstance(limits, sandbox.Limits):
        raise TypeError(f"grade: limits must be a sandbox.Limits, got {type(limits).__name__}")
    started = time.monotonic()
    try:
        cells, problem = reading.read_code_cells(notebook), None
    except (ValueError, OSError) as error:   # an unreadable notebook runs empty and scores 0, with the reason
        cells, problem = [], f"the notebook could not be read: {str(error)[:300]}"
    shipped = assignment.shipped_context()
    server = forkserver.context()
    receiving, sending = server.Pipe(duplex=False)
    installed = sandbox.installed_special_files() if sandboxed else {}     # walked here once, not per notebook
    child = server.Process(target=_grade_in_child, name=f"grade {assignment.name}", daemon=True,
                           args=(assignment, shipped, installed, cells, limits, sandboxed, sending))
    child.start()
    sending.close()                # the child holds the only writing end: its end of the pipe is an EOF here
    try:
        questions, run, stopped, failure = _read_messages(receiving, child, limits)
    finally:
        receiving.close()
        if child.is_alive():
            child.kill()
        child.join()
        child.close()
    if failure is not None:
        raise RuntimeError(f"grade: the grader failed on {pathlib.Path(notebook).name}:\n{failure}")
    graded = {question["name"]: question for question in questions}
    return {
        "questions": [graded.get(name) or {"name": name, "score": 0, "max_score": points,
                                           "output": f"{name}: not graded: {stopped or 'the grading process ended'}"}
                      for name, points in assignment.points.items()],
        "run": {
            "seconds": round(time.monotonic() - started, 2), "sandboxed": sandboxed,
            "stopped": problem or stopped, "cell_errors": run.get("cell_errors", []),
            "peak_memory_bytes": run.get("peak_memory_bytes", 0), "peak_processes": run.get("peak_processes", 0),
            "grader_peak_memory_bytes": run.get("grader_peak_memory_bytes", 0),
            "output_bytes": run.get("output_bytes", 0), "output_start": run.get("output_start", ""),
        },
    }


def refused_result(points: dict[str, float], reason: str) -> dict:
    """The result of a notebook refused unrun: 0 for each question of ``points`` (``{question:
    its points}``), with ``reason``.

    Raises:
        TypeError: ``reason`` is not a str.
    """
    if not isinstance(reason, str):
        raise TypeError(f"refused_result: reason must be a str, got {type(reason).__name__}")
    stopped = f"the notebook was not graded: {reason}"
    return {"questions": [{"name": name, "score": 0, "max_score": possible, "output": stopped}
                          for name, possible in points.items()],
            "run": {"seconds": 0.0, "sandboxed": None, "refused": reason, "stopped": stopped, "cell_errors": [],
                    "peak_memory_bytes": 0, "peak_processes": 0, "output_bytes": 0, "output_start": ""}}


def _read_messages(receiving, child, limits: sandbox.Limits) -> tuple[list[dict], dict, str | None, str | None]:
    """Read a grading process's messages until it ends or runs past its phase's time: ``(questions
    graded, run, why it stopped or None, the grader's own traceback or None)``."""
    questions: list[dict] = []
    run: dict = {}
    stopped = failure = None
    done = False
    # Setting up (the chapter's context) may take as long as the notebook; then each phase its own time.
    deadline = time.monotonic() + limits.seconds + KILL_GRACE_SECONDS
    late = f"the grader's set-up of its tests ran past {limits.seconds:g} s"
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not multiprocessing.connection.wait([receiving], timeout=left):
            child.kill()                  # its sandbox dies with it (bubblewrap --die-with-parent)
            return questions, run, stopped or late, failure
        try:
            kind, value = json.loads(receiving.recv_bytes(MAX_RESULT_BYTES))
        except EOFError:                  # it ended: said why, or was killed
            break
        except (OSError, ValueError) as error:
            child.kill()
            return questions, run, stopped or f"the grader's process sent a bad message ({error})", failure
        if kind == "started":
            deadline = time.monotonic() + limits.seconds + KILL_GRACE_SECONDS
            late = f"stopped after {limits.seconds:g} s, the time limit of the whole notebook"
        elif kind == "ran":
            run = value
            seconds = limits.seconds + limits.call_seconds
            deadline = time.monotonic() + seconds + KILL_GRACE_SECONDS
            late = f"the grader's tests of it ran past {seconds:g} s in all"
        elif kind == "question":
            questions.append(value)
        elif kind == "done":
            run, done = value, True
        elif kind == "stopped":
            stopped = value
        elif kind == "failed":
            failure = value
    child.join(timeout=KILL_GRACE_SECONDS)
    if done:
        stopped = run.get("stopped")
    elif stopped is None and failure is None:      # it died without a word: killed, or crashed
        code = child.exitcode
        stopped = (f"the grader's process for its tests was killed by signal {-code}" if code is not None and code < 0
                   else f"the grader's process for its tests ended with code {code}")
    return questions, run, stopped, failure


def _grade_in_child(assignment: Assignment, shipped: bytes, installed: dict, cells: list[str],
                    limits: sandbox.Limits, sandboxed: bool, sending) -> None:
    """One submission's grading, in a process of its own (started by :func:`grade`).

    Each message to :func:`grade` is ``[kind, value]`` as JSON: ``started`` (the tests' context
    is ready), ``ran`` (the notebook has run; how it went), ``question`` (one question's result,
    as soon as it is known), ``stopped`` (why this process stops early), ``done`` (how it all
    went), ``failed`` (the grader's own traceback).
    """
    forkserver.die_with_parent()
    if installed:
        sandbox.use_installed_special_files(installed)
    sending_lock = threading.Lock()

    def send(kind: str, value: object) -> None:
        with sending_lock:
            sending.send_bytes(json.dumps([kind, value]).encode())

    # What the tests print is dropped (a check printing a huge answer), at Python's level and C's.
    sys.stdout = open(os.devnull, "w")   # this process's standard output until it ends
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    submission = None
    running: list[Submission] = []

    def end_with_the_grader() -> None:
        # The pipe reports an error when the grader ends, however it ends (the fork server does not
        # end before this process): this ends it, and its sandbox, at once.
        watch = select.poll()
        watch.register(sending.fileno(), select.POLLERR | select.POLLHUP)
        while not watch.poll():
            pass
        for started in running:
            started.close()
        os._exit(4)

    threading.Thread(target=end_with_the_grader, daemon=True).start()
    try:
        environment = assignment.environment_from(shipped)
        # The checks may use as much memory as one process of the notebook on top of the grader and
        # the context (soft limit: the sandbox sets its own); past it, an allocation fails a test.
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (proc.address_space_bytes() + limits.memory_bytes, hard))
        send("started", None)
        submission = Submission(cells, assignment.answers, limits, sandboxed=sandboxed)
        running.append(submission)
        send("ran", _run_of(submission))
        seconds = limits.seconds + limits.call_seconds

        def stop_late() -> None:
            # The tests' time is up, wherever they are (this thread runs while torch holds no GIL).
            send("stopped", f"the grader's tests of it ran past {seconds:g} s in all")
            submission.close()
            os._exit(3)

        timer = threading.Timer(seconds, stop_late)
        timer.daemon = True
        timer.start()
        verdicts = SourceVerdicts(submission.cells)
        environment.update(answer_values(submission, verdicts))
        for test_file in assignment.test_files():       # each question's result sent as soon as it is known
            torch.manual_seed(TEST_SEED)
            verdicts.take()
            test_file.run(environment)
            score, output = round(test_file.score, 5), test_file.summary()
            if broken := verdicts.take():
                # An answer that breaks its exercise's rule scores nothing, hidden tests' share included.
                score = 0
                output = "\n".join([*broken.values(), output])
            send("question", {"name": test_file.name, "score": score,
                              "max_score": round(test_file.possible, 5), "output": output})
        timer.cancel()
        submission.close()
        send("done", dict(_run_of(submission), done=True))
    except MemoryError:
        # Past the memory limit outside any one test (a reply decoded): the submission's doing.
        send("stopped", f"the grader's checks of it used more than their {limits.memory_bytes / 2**30:g} GiB "
                        "of memory")
    except BaseException:  # noqa: BLE001 - the grader's own fault, reported with its traceback
        send("failed", traceback.format_exc())
    finally:
        if submission is not None:
            submission.close()
        sending.close()


def _run_of(submission: Submission) -> dict:
    return {"stopped": submission.stopped, "cell_errors": submission.events,
            "peak_memory_bytes": submission.peak_memory_bytes, "peak_processes": submission.peak_tasks,
            "output_bytes": submission.output_size, "output_start": submission.output[:2000],
            "grader_peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

