"""Grading a class on many machines: each notebook sent to a Dask worker and graded there as here.

``make grade SUBMISSIONS=... SCHEDULER=tcp://host:8786`` finds, reads and refuses notebooks as a
local run does, then hands each one to a `Dask distributed <https://distributed.dask.org>`_
scheduler instead of its own threads. A worker (``make worker SCHEDULER=...`` on each machine) runs
:func:`grade_on_worker`: :func:`~attn_course_grading.grader.grade` on that machine, in its own
bubblewrap sandbox, with the same limits, and returns the same plain result; tools/grade.py then
scores it and writes the feedback and grades.csv exactly as for a local run.

A worker that dies mid-notebook loses no student: the scheduler runs the notebook again on another
worker (up to ``distributed.scheduler.allowed-failures`` times, 3 by default) and only then gives up
(``KilledWorker``), which tools/grade.py reports in that student's notes like any failure of the
grader. A worker whose course code differs from the grader's refuses to grade (:func:`course_digest`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import multiprocessing
import os
import pathlib
import tempfile
import threading

from attn_course_grading import cgroups, sandbox
from attn_course_grading.assignment import Assignment
from attn_course_grading.grader import grade

#: The packages whose code decides a grade: a worker must run exactly the grader's.
GRADING_PACKAGES = ("attn_course", "attn_course_grading")


@dataclasses.dataclass(frozen=True)
class ChapterFiles:
    """A chapter's autograder as bytes (its ``.zip`` and solution ``.ipynb``), sent once to each worker."""

    name: str
    autograder: bytes
    solution: bytes

    @classmethod
    def read(cls, autograder: pathlib.Path) -> ChapterFiles:
        """The files of ``dist/autograder/NN_name.zip`` and the solution beside it."""
        autograder = pathlib.Path(autograder)
        return cls(autograder.stem, autograder.read_bytes(), autograder.with_suffix(".ipynb").read_bytes())

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.autograder + b"\0" + self.solution).hexdigest()[:16]


@functools.cache
def course_digest() -> str:
    """A hash of the grading packages' source on this machine (what a grade depends on), read once per
    process: the code it has imported."""
    digest = hashlib.sha256()
    for package in GRADING_PACKAGES:
        root = pathlib.Path(__import__(package).__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


_ASSIGNMENTS: dict[str, Assignment] = {}
_ASSIGNMENTS_LOCK = threading.Lock()


def _assignment(chapter: ChapterFiles) -> Assignment:
    """The chapter's :class:`Assignment`, built once per worker process from its files."""
    with _ASSIGNMENTS_LOCK:
        if chapter.digest not in _ASSIGNMENTS:
            folder = pathlib.Path(tempfile.mkdtemp(prefix=f"attn-course-{chapter.name}-"))
            (folder / f"{chapter.name}.zip").write_bytes(chapter.autograder)
            (folder / f"{chapter.name}.ipynb").write_bytes(chapter.solution)
            _ASSIGNMENTS[chapter.digest] = Assignment(folder / f"{chapter.name}.zip")
        return _ASSIGNMENTS[chapter.digest]


def _the_same(files: ChapterFiles) -> ChapterFiles:
    return files


def grade_on_worker(chapter: ChapterFiles, notebook: bytes, limits: sandbox.Limits, *, sandboxed: bool,
                    expected_course: str) -> dict:
    """Grade one notebook on this worker: :func:`~attn_course_grading.grader.grade`, unchanged.

    ``limits.threads`` becomes this machine's share: its cores over the notebooks its worker grades
    at once, as a local run shares out its cores over ``--jobs``.

    Args:
        chapter: the chapter's :class:`ChapterFiles`.
        notebook: the submission's bytes, as the grader read and checked them.
        limits: the grader's :class:`~attn_course_grading.sandbox.Limits`.
        sandboxed: False for trusted submissions only.
        expected_course: the grader's :func:`course_digest`.

    Raises:
        RuntimeError: this worker runs other course code than the grader, it cannot start a sandbox,
            or it is a daemonic process (which may not start the grading processes).
    """
    if (here := course_digest()) != expected_course:
        raise RuntimeError(f"grade_on_worker: this worker's course code ({here}) is not the grader's "
                           f"({expected_course}); install the same commit on every worker")
    if multiprocessing.current_process().daemon:
        raise RuntimeError("grade_on_worker: this worker is a daemonic process, which may not start grading "
                           "processes; start it with `make worker` (DASK_DISTRIBUTED__WORKER__DAEMON=False)")
    if sandboxed and (problem := sandbox.sandbox_problem()):
        raise RuntimeError(f"grade_on_worker: this worker cannot start a sandbox: {problem}")
    from distributed import get_worker

    at_once = max(1, get_worker().state.nthreads)
    limits = dataclasses.replace(limits, threads=max(1, (os.cpu_count() or 1) // at_once))
    with tempfile.TemporaryDirectory(prefix="attn-course-submission-") as folder:
        path = pathlib.Path(folder) / f"{chapter.name}.ipynb"
        path.write_bytes(notebook)
        return grade(_assignment(chapter), path, limits, sandboxed=sandboxed)


class Scheduler:
    """The grader's connection to a Dask scheduler: :meth:`grade` sends one notebook and waits for its
    result. Thread-safe (tools/grade.py calls it from many threads).

    Args:
        address: the scheduler's, ``tcp://host:8786``.
        autograders: ``{chapter: its .zip}`` of the chapters to grade.
        limits: each notebook's :class:`~attn_course_grading.sandbox.Limits`.
        sandboxed: False for trusted submissions only.

    Raises:
        TypeError: ``address`` is not a string.
        OSError: no scheduler answers at ``address`` within 30 s.
    """

    def __init__(self, address: str, autograders: dict[str, pathlib.Path], limits: sandbox.Limits, *,
                 sandboxed: bool):
        if not isinstance(address, str):
            raise TypeError(f"Scheduler: address must be a string like 'tcp://host:8786', got {address!r:.100}")
        from distributed import Client

        self.client = Client(address, timeout="30s", set_as_default=False)
        self.limits, self.sandboxed, self.course = limits, sandboxed, course_digest()
        # Each chapter's files travel once per worker, not once per notebook; as a task (not scattered
        # data) the scheduler can make them again when the worker that held them dies.
        self.chapters = {}
        for chapter, path in autograders.items():
            files = ChapterFiles.read(path)
            self.chapters[chapter] = self.client.submit(_the_same, files, key=f"chapter-{chapter}-{files.digest}")

    def accounting(self) -> dict[str, str]:
        """``{worker: what it counts of a notebook's memory and CPU}`` (:func:`~.cgroups.accounting` there);
        a worker that cannot answer (it just died) is left out: grading goes on without it."""
        return {worker: line for worker, line in self.client.run(cgroups.accounting, on_error="return").items()
                if isinstance(line, str)}

    @property
    def workers(self) -> int:
        """How many notebooks the workers grade at once (their threads together)."""
        return sum(worker["nthreads"] for worker in self.client.scheduler_info()["workers"].values())

    def grade(self, chapter: str, notebook: bytes) -> dict:
        """Grade ``notebook`` (bytes) of ``chapter`` on a worker; raise what the worker raised."""
        return self.client.submit(grade_on_worker, self.chapters[chapter], notebook, self.limits,
                                  sandboxed=self.sandboxed, expected_course=self.course, pure=False).result()

    def close(self) -> None:
        self.client.close()
