"""Grade submitted notebooks, each in a sandbox, and write one CSV.

    .venv/bin/python tools/grade.py SUBMISSIONS [--autograders dist/autograder] [--out grades]
                                                [--jobs N] [--trusted] [--seconds S] ...

SUBMISSIONS holds one folder per student, each with that student's notebooks under the
chapter's file name::

    SUBMISSIONS/ada/01_intuition.ipynb
    SUBMISSIONS/ada/02_formula.ipynb
    SUBMISSIONS/grace/01_intuition.ipynb

Each notebook runs in its own bubblewrap sandbox (no network, a read-only view of the course's
environment, a private scratch folder, limits on time, memory, processes and output); the tests
run in this process, calling the notebook's answers as data in, data out
(:mod:`attn_course_grading`, INSTRUCTORS.md). Without bubblewrap this refuses to grade, unless
``--trusted`` (``make grade TRUSTED=1``) says the submissions are trusted. Results:

    grades/grades.csv                 a row per student, a column per chapter:question
    grades/STUDENT/CHAPTER.json       per question its score and feedback (what otter gives), and
                                      how the run went: seconds, cells that failed, why it stopped
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from attn_course_grading import sandbox
from attn_course_grading.grader import Assignment, grade

ROOT = pathlib.Path(__file__).resolve().parents[1]


def find_submissions(submissions: pathlib.Path, chapters: set[str]) -> dict[str, dict[str, pathlib.Path]]:
    """``{student: {chapter: notebook}}``, skipping files that are not chapters."""
    found: dict[str, dict[str, pathlib.Path]] = {}
    for student_dir in sorted(p for p in submissions.iterdir() if p.is_dir()):
        for notebook in sorted(student_dir.glob("*.ipynb")):
            if notebook.stem in chapters:
                found.setdefault(student_dir.name, {})[notebook.stem] = notebook
            else:
                print(f"skipped {notebook}: not a chapter ({', '.join(sorted(chapters))})")
    return found


def parse_arguments() -> argparse.Namespace:
    defaults = sandbox.Limits()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=pathlib.Path)
    parser.add_argument("--autograders", type=pathlib.Path, default=ROOT / "dist" / "autograder")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "grades")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="notebooks graded at once (default: one per CPU core)")
    parser.add_argument("--trusted", action="store_true", default=os.environ.get("TRUSTED", "") not in ("", "0"),
                        help="run the notebooks without a sandbox (trusted submissions only; also TRUSTED=1)")
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="wall time of one notebook")
    parser.add_argument("--cell-seconds", type=float, default=defaults.cell_seconds, help="wall time of one cell")
    parser.add_argument("--call-seconds", type=float, default=defaults.call_seconds,
                        help="wall time of one call of an answer by a check")
    parser.add_argument("--memory-gib", type=float, default=defaults.memory_bytes / 2**30,
                        help="memory (address space) of one process of a notebook")
    parser.add_argument("--processes", type=int, default=defaults.processes,
                        help="processes and threads one notebook may run at once")
    return parser.parse_args()


def main() -> int:
    args = parse_arguments()
    if not args.submissions.is_dir():
        raise SystemExit(f"grade: SUBMISSIONS must be a folder of student folders, got {args.submissions}")
    if args.jobs < 1:
        raise SystemExit(f"grade: --jobs must be at least 1, got {args.jobs}")
    if not args.trusted and (problem := sandbox.sandbox_problem()):
        raise SystemExit(f"grade: refusing to run submissions without a sandbox: {problem}")
    zips = sorted(args.autograders.glob("*.zip"))
    if not zips:
        raise SystemExit(f"grade: no autograders in {args.autograders}; run `make assignments` first")
    assignments = {zip_file.stem: Assignment(zip_file) for zip_file in zips}
    submissions = find_submissions(args.submissions, set(assignments))
    # Each job is a sandboxed notebook: as many at once as there are cores, the cores shared out.
    limits = sandbox.Limits(seconds=args.seconds, cell_seconds=args.cell_seconds, call_seconds=args.call_seconds,
                            memory_bytes=int(args.memory_gib * 2**30), processes=args.processes,
                            threads=max(1, (os.cpu_count() or 1) // args.jobs))
    jobs = [(student, chapter, notebook) for student, notebooks in submissions.items()
            for chapter, notebook in notebooks.items()]
    print(f"grading {len(jobs)} notebooks of {len(submissions)} students, {args.jobs} at once, "
          f"{'WITHOUT a sandbox (--trusted)' if args.trusted else 'each in a bubblewrap sandbox'}", flush=True)

    failures = []

    def grade_job(job):
        student, chapter, notebook = job
        try:
            result = grade(assignments[chapter], notebook.resolve(), limits, sandboxed=not args.trusted)
        except Exception:  # noqa: BLE001 - a fault of the grader itself: report it, grade the rest
            failures.append(job)
            sys.stderr.write(f"grade: the grader failed on {notebook}:\n{traceback.format_exc()}")
            return None
        feedback = args.out / student / f"{chapter}.json"
        feedback.parent.mkdir(parents=True, exist_ok=True)
        feedback.write_text(json.dumps(result, indent=1, ensure_ascii=False))
        questions, run = result["questions"], result["run"]
        note = f"; stopped: {run['stopped']}" if run["stopped"] else ""
        print(f"{student} {chapter}: {sum(q['score'] for q in questions):g} / "
              f"{sum(q['max_score'] for q in questions):g} ({run['seconds']:.1f} s{note})", flush=True)
        return questions

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        graded = list(pool.map(grade_job, jobs))
    results = {(student, chapter): questions for (student, chapter, _), questions in zip(jobs, graded)}

    rows, columns = [], {}
    for student, notebooks in submissions.items():
        row = {"student": student}
        for chapter in notebooks:
            for question in results[student, chapter] or []:
                column = f"{chapter}:{question['name']}"
                columns[column] = question["max_score"]
                row[column] = question["score"]
        rows.append(row)

    header = ["student"] + sorted(columns) + ["total", "possible"]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "grades.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header, restval="")
        writer.writeheader()
        for row in rows:
            row["total"] = sum(value for key, value in row.items() if ":" in key)
            row["possible"] = sum(columns.values())
            writer.writerow(row)
    minutes = (time.monotonic() - started) / 60
    print(f"wrote {args.out / 'grades.csv'} ({len(rows)} students, {len(columns)} questions); "
          f"{len(jobs)} notebooks in {minutes:.1f} min, {len(jobs) / max(minutes, 1e-9):.1f} per minute")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
