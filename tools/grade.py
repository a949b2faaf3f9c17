"""Grade submitted notebooks, each in a sandbox, and write one CSV.

    .venv/bin/python tools/grade.py SUBMISSIONS [--autograders dist/autograder] [--out grades]
                                                [--jobs N] [--trusted] [--seconds S] ...

SUBMISSIONS holds one folder per student with their notebooks under the chapters' file names
(``SUBMISSIONS/ada/01_intuition.ipynb``). Each notebook runs in its own bubblewrap sandbox, the tests
outside it (:mod:`attn_course_grading`); without bubblewrap this refuses to grade unless ``--trusted``
(``make grade TRUSTED=1``). It writes ``grades/grades.csv`` (a row per student, a column per
chapter:question, then total, possible and notes) and ``grades/STUDENT/CHAPTER.json`` (each
question's score and feedback, and how the run went). What is refused says why on the console and in
the notes, and scores 0; grades.csv is always written (INSTRUCTORS.md, section 2).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from attn_course.flash.triton_mode import triton_installed
from attn_course_grading import cgroups, collect, reading, report, sandbox
from attn_course_grading.assignment import Assignment
from attn_course_grading.display import display
from attn_course_grading.grader import grade, refused_result

ROOT = pathlib.Path(__file__).resolve().parents[1]
_PRINTING = threading.Lock()


def say(line: str, stream=None) -> None:
    """Print one line, escaped (a newline cannot make two, an escape cannot move the cursor), whole."""
    with _PRINTING:
        print(display(line), file=stream or sys.stdout, flush=True)


def parse_arguments() -> argparse.Namespace:
    defaults = sandbox.Limits()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=pathlib.Path)
    parser.add_argument("--autograders", type=pathlib.Path, default=ROOT / "dist" / "autograder")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "grades")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="notebooks graded at once (default: one per CPU core)")
    parser.add_argument("--scheduler", default=os.environ.get("SCHEDULER") or None,
                        help="a Dask scheduler's address (tcp://host:8786): grade on its workers, not here")
    parser.add_argument("--trusted", action="store_true", default=os.environ.get("TRUSTED", "") not in ("", "0"),
                        help="run the notebooks without a sandbox (trusted submissions only; also TRUSTED=1)")
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="wall time of one notebook")
    parser.add_argument("--cell-seconds", type=float, default=defaults.cell_seconds, help="wall time of one cell")
    parser.add_argument("--call-seconds", type=float, default=defaults.call_seconds,
                        help="wall time of one call of an answer by a check")
    parser.add_argument("--idle-seconds", type=float, default=defaults.idle_seconds,
                        help="how long a notebook may use next to no CPU while the grader waits for it")
    parser.add_argument("--memory-gib", type=float, default=defaults.memory_bytes / 2**30,
                        help="memory (address space) of one process of a notebook")
    parser.add_argument("--processes", type=int, default=defaults.processes,
                        help="processes and threads one notebook may run at once")
    return parser.parse_args()


def main() -> int:
    # Whatever the terminal's encoding, a name it cannot show is written escaped, never raised.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    args = parse_arguments()
    if not args.submissions.is_dir():
        raise SystemExit(f"grade: SUBMISSIONS must be a folder of student folders, got {args.submissions}")
    if args.jobs < 1:
        raise SystemExit(f"grade: --jobs must be at least 1, got {args.jobs}")
    if not args.trusted and (problem := sandbox.sandbox_problem()):
        raise SystemExit(f"grade: refusing to run submissions without a sandbox: {problem}")
    zips = {zip_file.stem: zip_file for zip_file in sorted(args.autograders.glob("*.zip"))}
    if not zips:
        raise SystemExit(f"grade: no autograders in {args.autograders}; run `make assignments` first")
    course = {master.stem for master in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    found = collect.find_submissions(args.submissions, set(zips), frozenset(course - set(zips)))
    for line in found.skipped:
        say(line)
    if missing := sorted(found.without_autograder):
        say(f"no autograder in {args.autograders} for {', '.join(missing)}, so those notebooks were skipped: "
            f"build it with make assignments, or tools/assign.py {' '.join(chapter[:2] for chapter in missing)}")
    # {folder name: what the instructor should know}: every skip and refusal
    notes: dict[str, list[str]] = {student: list(lines) for student, lines in found.notes.items()}
    for refusal in found.refused:
        if refusal.chapter is None:            # a refused notebook is reported when it is graded, below
            say(f"refused {refusal.folder}/: {refusal.reason}")
            notes.setdefault(refusal.folder, []).append(f"refused: {refusal.reason}")
    # Each job is a sandboxed notebook: as many at once as there are cores, the cores shared out.
    limits = sandbox.Limits(seconds=args.seconds, cell_seconds=args.cell_seconds, call_seconds=args.call_seconds,
                            idle_seconds=args.idle_seconds, memory_bytes=int(args.memory_gib * 2**30),
                            processes=args.processes, threads=max(1, (os.cpu_count() or 1) // args.jobs))
    # (student, chapter, notebook, why it is refused): a refused notebook scores 0, the reason its feedback.
    jobs = [(student, chapter, notebook, None) for student, notebooks in found.notebooks.items()
            for chapter, notebook in notebooks.items()]
    jobs += [(refusal.folder, refusal.chapter, None, refusal.reason) for refusal in found.refused if refusal.chapter]
    # Only the chapters handed in: each Assignment adds its chapter's imports to what every grading
    # process starts with: one notebook of chapter 03 took 24 s to grade with all thirteen chapters', 14 s with its own.
    try:
        assignments = {chapter: Assignment(zips[chapter]) for chapter in sorted({job[1] for job in jobs})}
    except FileNotFoundError as error:
        raise SystemExit(f"grade: {error}") from None
    # A chapter of Triton kernels is not graded where Triton is missing: its checks could not run.
    if not triton_installed():
        for chapter in sorted({job[1] for job in jobs if assignments[job[1]].needs_triton}):
            why = "its exercises are Triton kernels, and Triton is not installed here (it ships for Linux only)"
            say(f"not grading {chapter}: {why}; grade it on Linux")
            for job in [job for job in jobs if job[1] == chapter]:
                notes.setdefault(job[0], []).append(f"{chapter}: not graded: {why}")
                jobs.remove(job)
    students = sorted({job[0] for job in jobs} | set(notes), key=os.fsencode)
    sandboxed = not args.trusted
    if args.scheduler:
        from attn_course_grading.cluster import Scheduler

        try:
            scheduler = Scheduler(args.scheduler, {chapter: args.autograders / f"{chapter}.zip"
                                                   for chapter in {job[1] for job in jobs}}, limits,
                                  sandboxed=sandboxed)
        except OSError as error:
            raise SystemExit(f"grade: no Dask scheduler answers at {args.scheduler}: {error}") from None
        args.jobs = max(1, len(jobs))          # each waits for its worker; the scheduler queues them
        where = f"on the workers of {args.scheduler} ({scheduler.workers} at once)"
    else:
        scheduler, where = None, f"here, {args.jobs} at once"
    say(f"grading {len(jobs)} notebooks of {len(students)} students {where}, "
        f"{'WITHOUT a sandbox (--trusted)' if args.trusted else 'each in a bubblewrap sandbox'}")
    if sandboxed and scheduler is None:
        say(cgroups.accounting())
    elif sandboxed:
        for worker, line in sorted(scheduler.accounting().items()):
            say(f"{worker}: {line}")

    failures = []

    def note(student: str, line: str) -> None:
        with _PRINTING:
            notes.setdefault(student, []).append(line)

    def grade_job(job) -> list[dict] | None:
        student, chapter, notebook, refused = job
        assignment = assignments[chapter]

        def failed(what: str, line: str) -> None:
            failures.append(job)
            note(student, f"{chapter}: {what}")
            say(line, sys.stderr)

        if refused is None:
            try:
                # Read here first, safely: a notebook refused now costs no sandbox.
                data = reading.read_bytes(notebook)
                reading.parse_code_cells(data)
            except ValueError as error:
                refused = str(error)
        try:
            if refused is not None:            # its console line below says why
                note(student, f"{chapter}: refused: {refused}")
                result = refused_result(assignment.points, refused)
            elif scheduler is not None:        # the bytes checked here are what the worker grades
                result = scheduler.grade(chapter, data)
            else:
                # The path as found, never resolved: the notebook is no link, and stays read as found.
                result = grade(assignment, notebook, limits, sandboxed=sandboxed)
        except Exception:  # noqa: BLE001 - a fault of the grader itself: report it, grade the rest
            failed("the grader failed (see its output)", f"grade: the grader failed on {student}/{chapter}.ipynb:")
            for line in traceback.format_exc().splitlines():
                say(line, sys.stderr)
            return None
        # Whatever is in a notebook's results, a failure here is this student's note, not the class's.
        try:
            questions = report.scores(result)
        except Exception as error:  # noqa: BLE001
            failed(f"its scores could not be read ({type(error).__name__})",
                   f"grade: the scores of {student}/{chapter}.ipynb could not be read: {error}")
            return None
        try:
            report.write_feedback(args.out / student / f"{chapter}.json", result)
        except Exception as error:  # noqa: BLE001
            failed(f"its feedback could not be written ({type(error).__name__})",
                   f"grade: the feedback of {student}/{chapter}.ipynb could not be written: {error}")
        try:
            say(report.console_line(student, chapter, result))
        except Exception as error:  # noqa: BLE001
            say(f"{student} {chapter}: graded, but its line could not be shown ({type(error).__name__})")
        return questions

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            graded = list(pool.map(grade_job, jobs))
    finally:
        if scheduler is not None:
            scheduler.close()

    rows = {student: report.Row(student, notes=notes.get(student, [])) for student in students}
    possible: dict[str, float] = {}
    for (student, chapter, _, _), questions in zip(jobs, graded):
        for question in questions or []:
            column = f"{chapter}:{question['name']}"
            possible[column] = question["max_score"]
            rows[student].scores[column] = question["score"]
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_grades(args.out / "grades.csv", list(rows.values()), possible)
    minutes = (time.monotonic() - started) / 60
    say(f"wrote {args.out / 'grades.csv'} ({len(rows)} students, {len(possible)} questions); "
        f"{len(jobs)} notebooks in {minutes:.1f} min, {len(jobs) / max(minutes, 1e-9):.1f} per minute")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
