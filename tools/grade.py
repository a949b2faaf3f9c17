"""Grade submitted notebooks with otter's autograders and write one CSV.

    .venv/bin/python tools/grade.py SUBMISSIONS [--autograders dist/autograder] [--out grades]

SUBMISSIONS holds one folder per student, each with that student's notebooks under the
chapter's file name::

    SUBMISSIONS/ada/01_intuition.ipynb
    SUBMISSIONS/ada/02_formula.ipynb
    SUBMISSIONS/grace/01_intuition.ipynb

Each notebook runs in a fresh kernel of this environment (``otter run``, no Docker: use
it for trusted code only; INSTRUCTORS.md describes Docker-isolated grading). Results:

    grades/grades.csv                 a row per student, a column per chapter:question
    grades/STUDENT/CHAPTER.json       otter's full results, with the feedback each test gave
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from assign import kernel_environment, otter_command

ROOT = pathlib.Path(__file__).resolve().parents[1]


def grade_one(autograder: pathlib.Path, submission: pathlib.Path, threads: int = 1) -> list[dict]:
    """Run one submission through ``otter run``; return its per-question results.

    ``threads`` is how many threads the notebook's kernel may give PyTorch (and OpenMP):
    kernels graded side by side that each start a thread per core oversubscribe the CPU.
    """
    environment = kernel_environment()
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        environment.setdefault(variable, str(threads))   # an instructor's own setting wins
    with tempfile.TemporaryDirectory(prefix="grade-") as scratch:
        command = otter_command() + ["run", "-a", str(autograder), "-o", scratch, str(submission)]
        completed = subprocess.run(command, env=environment, capture_output=True, text=True)
        results_file = pathlib.Path(scratch) / "results.json"
        if completed.returncode != 0 or not results_file.exists():
            sys.stderr.write(completed.stdout + completed.stderr)
            raise RuntimeError(f"otter run failed on {submission}")
        tests = json.loads(results_file.read_text())["tests"]
    # The first entry summarises the public tests; the rest are one per question.
    return [test for test in tests if "max_score" in test]


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=pathlib.Path)
    parser.add_argument("--autograders", type=pathlib.Path, default=ROOT / "dist" / "autograder")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "grades")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="notebooks graded at once (default: one per CPU core)")
    args = parser.parse_args()
    if not args.submissions.is_dir():
        raise SystemExit(f"grade: SUBMISSIONS must be a folder of student folders, got {args.submissions}")
    autograders = {zip_file.stem: zip_file for zip_file in sorted(args.autograders.glob("*.zip"))}
    if not autograders:
        raise SystemExit(f"grade: no autograders in {args.autograders}; run `make assignments` first")
    submissions = find_submissions(args.submissions, set(autograders))

    jobs = [(student, chapter, notebook) for student, notebooks in submissions.items()
            for chapter, notebook in notebooks.items()]
    if args.jobs < 1:
        raise SystemExit(f"grade: --jobs must be at least 1, got {args.jobs}")
    # Each job is a kernel running a notebook: run as many at once as there are cores, and
    # share the cores out between them.
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        graded = list(pool.map(lambda job: grade_one(autograders[job[1]], job[2].resolve(), threads), jobs))
    results = {(student, chapter): questions for (student, chapter, _), questions in zip(jobs, graded)}

    rows, columns = [], {}
    for student, notebooks in submissions.items():
        row = {"student": student}
        for chapter in notebooks:
            questions = results[student, chapter]
            feedback = args.out / student / f"{chapter}.json"
            feedback.parent.mkdir(parents=True, exist_ok=True)
            feedback.write_text(json.dumps(questions, indent=1, ensure_ascii=False))
            for question in questions:
                column = f"{chapter}:{question['name']}"
                columns[column] = question["max_score"]
                row[column] = question["score"]
            print(f"{student} {chapter}: {sum(q['score'] for q in questions):g} / "
                  f"{sum(q['max_score'] for q in questions):g}")
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
    print(f"wrote {args.out / 'grades.csv'} ({len(rows)} students, {len(columns)} questions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
