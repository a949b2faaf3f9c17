"""How fast a class is graded, and what the sandbox costs per submission.

    python -m benchmarks grading --autograders dist/autograder            # a class of 2 x every chapter
    python -m benchmarks grading --autograders dist/autograder --students 4 --jobs 2
    python -m benchmarks grading --quick                                  # the sandbox's overhead only

:func:`sandbox_overhead` starts a one-cell notebook (``x = 1``) as a
:class:`~attn_course_grading.remote.Submission` with and without the sandbox and times it until
the notebook has run (start-up: Python, torch, IPython, and for the sandbox, bubblewrap's
namespaces and mounts). :func:`class_throughput` grades a made-up class, each student handing in
every chapter's solution notebook (the whole chapter, as a student who did the reading hands it
in), with ``jobs`` notebooks at once, each sandboxed, and reports notebooks per minute and the
time a class of 40 would take. Each returns rows; ``attn_course.teaching.tables.table(rows)`` shows them.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from attn_course.measure.timing import timed
from attn_course_grading import sandbox
from attn_course_grading.assignment import Assignment
from attn_course_grading.grader import grade
from attn_course_grading.remote import Submission


@dataclasses.dataclass(frozen=True)
class OverheadRow:
    """Start-up of one tiny notebook: median seconds over ``repeats``."""

    sandboxed: bool
    repeats: int
    median_s: float
    min_s: float


@dataclasses.dataclass(frozen=True)
class ChapterRow:
    """One chapter in the class: seconds per notebook (mean over the students), the largest memory of
    all a notebook's processes together, the points given."""

    chapter: str
    notebooks: int
    mean_s: float
    max_s: float
    peak_memory_mib: float
    mean_score: float
    max_score: float


@dataclasses.dataclass(frozen=True)
class ThroughputRow:
    """The whole class: notebooks, workers, wall minutes, notebooks per minute, and 40 students' time."""

    notebooks: int
    students: int
    chapters: int
    jobs: int
    minutes: float
    per_minute: float
    class_of_40_minutes: float


def sandbox_overhead(repeats: int = 5) -> list[OverheadRow]:
    """Start-up time of a one-cell notebook without and with the sandbox.

    Raises:
        RuntimeError: the sandbox cannot run here (bubblewrap missing or refused).
    """
    if problem := sandbox.sandbox_problem():
        raise RuntimeError(f"sandbox_overhead: {problem}")
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for sandboxed in (False, True):      # alternated, so that a machine's drift hits both alike
            started = time.perf_counter()
            with Submission(["x = 1"], ["x"], sandbox.Limits(), sandboxed=sandboxed) as submission:
                if submission.kinds != {"x": "value"}:
                    raise RuntimeError(f"sandbox_overhead: the notebook did not run ({submission.stopped})")
                times[sandboxed].append(time.perf_counter() - started)
    return [OverheadRow(sandboxed, repeats, round(statistics.median(runs), 3), round(min(runs), 3))
            for sandboxed, runs in times.items()]


def class_throughput(autograders: pathlib.Path, *, students: int = 2, jobs: int = 2,
                     chapters: Sequence[str] | None = None) -> tuple[list[ChapterRow], ThroughputRow]:
    """Grade ``students`` copies of every chapter's solution notebook, ``jobs`` at once, sandboxed.

    Args:
        autograders: ``dist/autograder`` (``make assignments``).
        students: class size to measure with (the 40-student time is extrapolated from it).
        jobs: notebooks at once (one per core is what ``make grade`` uses).
        chapters: chapter names (default: every autograder in ``autograders``).

    Returns:
        ``(per chapter, whole class)`` rows.
    """
    zips = sorted(pathlib.Path(autograders).glob("*.zip"))
    if chapters is not None:
        zips = [z for z in zips if z.stem in set(chapters)]
    if not zips:
        raise ValueError(f"class_throughput: no autograders in {autograders}; run `make assignments`")
    if students < 1 or jobs < 1:
        raise ValueError(f"class_throughput: students and jobs must be at least 1, got {students} and {jobs}")
    assignments = [Assignment(z) for z in zips]
    for assignment in assignments:          # the chapter's context is built once, not per student
        assignment.shipped_context()        # (what each notebook's grading process receives)
    limits = sandbox.Limits(threads=max(1, (os.cpu_count() or 1) // jobs))
    with tempfile.TemporaryDirectory(prefix="class-") as folder:
        jobs_list = []
        for student in range(students):
            for assignment in assignments:
                notebook = pathlib.Path(folder) / f"student{student}" / f"{assignment.name}.ipynb"
                notebook.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(pathlib.Path(autograders) / f"{assignment.name}.ipynb", notebook)
                jobs_list.append((assignment, notebook))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            graded, seconds = timed(lambda: list(pool.map(lambda job: grade(job[0], job[1], limits), jobs_list)))
        minutes = seconds / 60
    per_chapter = []
    for assignment in assignments:
        runs = [result for (a, _), result in zip(jobs_list, graded) if a is assignment]
        seconds = [result["run"]["seconds"] for result in runs]
        scores = [sum(q["score"] for q in result["questions"]) for result in runs]
        memory = max(result["run"]["peak_memory_bytes"] for result in runs) / 2**20
        per_chapter.append(ChapterRow(assignment.name, len(runs), round(statistics.mean(seconds), 1),
                                      round(max(seconds), 1), round(memory), round(statistics.mean(scores), 2),
                                      sum(q["max_score"] for q in runs[0]["questions"])))
    rate = len(jobs_list) / minutes
    whole = ThroughputRow(len(jobs_list), students, len(assignments), jobs, round(minutes, 2), round(rate, 2),
                          round(40 * len(assignments) / rate, 1))
    return per_chapter, whole

