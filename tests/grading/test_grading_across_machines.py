"""Issue 45: a hostile class graded here, then through a Dask scheduler and two workers, the same.

A real ``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1 (as ``make scheduler`` and
``make worker`` start them) grade a class of the tiny chapter: honest and wrong students, and the
notebooks that attack the machine (tests/grading/hostile/machine.py). One worker is killed while it
grades; its notebook is graded again on the other. grades.csv must be the local run's, each attack
stopped for that student alone with the grader's verdict in its feedback and on the console.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest
from hostile import machine

from attn_course_grading import cgroups

from helpers import ROOT, TINY_ANSWER, notebook_json, require_sandbox, tiny_chapter

CHAPTER = "00_tiny"
#: The class's limits, small so that the attacks hit them fast.
LIMITS = ["--memory-gib", "1", "--idle-seconds", "5", "--seconds", "60", "--cell-seconds", "55"]


def grade(submissions: pathlib.Path, autograders: pathlib.Path, out: pathlib.Path, *extra: str):
    completed = subprocess.run([sys.executable, "tools/grade.py", str(submissions), "--autograders", str(autograders),
                                "--out", str(out), *LIMITS, *extra], cwd=ROOT, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    with open(out / "grades.csv", encoding="utf-8", newline="") as handle:
        return {row["student"]: row for row in csv.DictReader(handle)}, completed.stdout


def start(log: pathlib.Path, *command: str) -> subprocess.Popen:
    """A Dask process in a session of its own (so that all of it can be killed, nanny and worker)."""
    with open(log, "w") as handle:
        return subprocess.Popen([str(pathlib.Path(sys.executable).parent / "dask"), *command], stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, DASK_DISTRIBUTED__WORKER__DAEMON="False"))


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {seconds} s")


@pytest.mark.slow
def test_a_hostile_class_graded_through_a_scheduler_gets_the_grades_of_a_local_run(tmp_path):
    require_sandbox()
    if not cgroups.available():
        pytest.skip(cgroups.accounting())
    from distributed import Client

    autograders, submissions = tmp_path / "autograder", tmp_path / "submissions"
    tiny_chapter(autograders, CHAPTER)
    for student, answer in (("ada", TINY_ANSWER), ("carol", "def double(x):\n    return x")):
        (submissions / student).mkdir(parents=True)
        (submissions / student / f"{CHAPTER}.ipynb").write_text(notebook_json(answer))
    attacks = machine.prepare(submissions, CHAPTER)

    processes = []
    try:
        # The scheduler and workers start (importing Dask and the course) while the class is graded here.
        processes.append(start(tmp_path / "scheduler.log", "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard"))
        address = wait_for(lambda: next((line.split("Scheduler at:", 1)[1].strip()
                                         for line in (tmp_path / "scheduler.log").read_text().splitlines()
                                         if "Scheduler at:" in line), None), 60, "scheduler")
        for name in ("kept", "killed"):
            processes.append(start(tmp_path / f"{name}.log", "worker", address, "--name", name, "--nthreads", "1",
                                   "--no-dashboard", "--host", "127.0.0.1"))

        local, local_console = grade(submissions, autograders, tmp_path / "local", "--jobs", "2")
        assert {student: float(row["total"]) for student, row in local.items()} == {
            "ada": 2.0, "carol": 0.0} | {student: expected["score"] for student, expected in attacks.items()}, \
            local_console
        for student, expected in attacks.items():
            run = json.loads((tmp_path / "local" / student / f"{CHAPTER}.json").read_text())["run"]
            assert (run["stopped"] or "").startswith(expected["stopped"] or ""), (student, run["stopped"])
            assert expected["printed"] in run["output_start"], (student, run["output_start"])
            if expected["stopped"]:
                assert expected["stopped"] in local_console
        memory = json.loads((tmp_path / "local" / "holds_unmapped_memory" / f"{CHAPTER}.json").read_text())["run"]
        assert 2**30 < memory["peak_memory_bytes"] < 1.6 * 2**30          # the memfd pages were counted

        with Client(address, timeout="30s") as watcher:
            wait_for(lambda: len(watcher.scheduler_info()["workers"]) == 2, 60, "two workers")

            def kill_mid_notebook() -> None:
                names = {address: worker["name"] for address, worker in watcher.scheduler_info()["workers"].items()}
                # A notebook, not the chapter's files (the first task a worker gets).
                wait_for(lambda: any(names.get(worker) == "killed" and any("grade_on_worker" in key for key in keys)
                                     for worker, keys in watcher.processing().items()), 120, "notebook on it")
                time.sleep(1.0)                                  # well into the notebook
                os.killpg(processes[2].pid, signal.SIGKILL)

            killer = threading.Thread(target=kill_mid_notebook, daemon=True)
            killer.start()
            remote, remote_console = grade(submissions, autograders, tmp_path / "remote", "--scheduler", address)
            killer.join(timeout=5)
        assert processes[2].poll() is not None, "the worker was never killed"
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert remote == local, (remote, local, remote_console)
    assert f"on the workers of {address}" in remote_console
    assert remote_console.count(": memory: a cgroup") == 2, remote_console        # each worker's accounting
    for student in attacks:
        assert (json.loads((tmp_path / "remote" / student / f"{CHAPTER}.json").read_text())["questions"]
                == json.loads((tmp_path / "local" / student / f"{CHAPTER}.json").read_text())["questions"])
