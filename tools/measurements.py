"""Every time, size and count that README.md and INSTRUCTORS.md state, from one file: measurements.json.

    .venv/bin/python tools/measurements.py record make_unit.seconds=131 make_unit.tests=3440 --how "make unit"
    .venv/bin/python tools/measurements.py grading bench-results   # python -m benchmarks grading's CSVs
    .venv/bin/python tools/measurements.py write                   # into README.md and INSTRUCTORS.md

A number in a document sits between two markers, ``<!--m:KEY-->12 min 7 s<!--/m-->`` (invisible once
rendered); ``write`` puts the measurement's text there, and tests/course/test_measurements.py fails
where a document and the file disagree. A key names a measurement and one of its values
(``make_test.seconds``); the value's name says how it is shown (:func:`shown`). The chapters' own run
times live in notebooks/run_times.json (tools/run_times.py, which writes them and their sum into README);
``course.chapters`` counts them.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
MEASUREMENTS = ROOT / "measurements.json"
DOCUMENTS = [ROOT / "README.md", ROOT / "INSTRUCTORS.md"]
MARKED = re.compile(r"<!--m:([\w.]+)-->(.*?)<!--/m-->", re.DOTALL)


def duration(seconds: float) -> str:
    """``41 s``, ``2 min 5 s``, ``12 min``; under 10 s with two decimals (``2.87 s``)."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{rest} s" if not minutes else f"{minutes} min" + (f" {rest} s" if rest else "")


def shown(name: str, value) -> str:
    """A value as the documents print it, by the suffix of its name: ``seconds`` a duration, ``minutes``
    and ``hours`` rounded, ``_mb``
    megabytes and ``_gb`` gigabytes (decimal, as ``du`` and pip say), ``_gib``/``_mib`` binary ones,
    ``_x`` a ratio, ``_pct`` a percentage; an integer with thousands separators; a float as recorded."""
    if isinstance(value, str):
        return value
    if name.endswith("seconds"):
        return duration(value)
    if name.endswith("minutes"):
        return f"{value:.0f} min"
    if name.endswith("hours"):
        return f"{value:.1f} hours"
    for suffix, text in (("_gb", "{:.1f} GB"), ("_mb", "{:,.0f} MB"), ("_gib", "{:.1f} GiB"), ("_mib", "{:,.1f} MiB"),
                         ("_x", "{:.0f}×"), ("_pct", "{:.1f} %")):
        if name.endswith(suffix):
            return text.format(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def load() -> dict:
    return json.loads(MEASUREMENTS.read_text())


def grading_table(measurements: dict) -> str:
    """INSTRUCTORS.md section 5's table: seconds per notebook and peak memory, chapter by chapter."""
    lines = ["| chapter | seconds per notebook | peak memory, all its processes |", "|---|---|---|"]
    for row in measurements["grading"]["chapters"]:
        lines.append(f"| {row['chapter']} | {row['mean_s']:.1f} | {row['peak_memory_mib'] / 1024:.1f} GiB |")
    return "\n" + "\n".join(lines) + "\n"      # the markers on lines of their own, around the table


def derived(measurements: dict) -> dict:
    """Values computed from others, so that they cannot disagree with them."""
    run_times = json.loads((ROOT / "notebooks" / "run_times.json").read_text())["chapters"]
    values = {"course.chapters": len(run_times)}
    if "grading" in measurements:
        grading = measurements["grading"]
        chapters = {row["chapter"]: row for row in grading["chapters"]}
        per_minute = grading["notebooks"] / grading["minutes"]
        largest = max(chapters.values(), key=lambda row: row["peak_memory_mib"])
        values |= {
            "grading.per_minute": round(per_minute, 1),
            "grading.class_of_40_minutes": 40 * len(chapters) / per_minute,
            "grading.class_of_40_notebooks": 40 * len(chapters),
            "grading.class_of_300_hours": 300 * len(chapters) / per_minute / 60,
            # one chapter for 40 students, graded as the class was (jobs at once)
            "grading.fastest_chapter_minutes": 40 * min(r["mean_s"] for r in chapters.values()) / grading["jobs"] / 60,
            "grading.slowest_chapter_minutes": 40 * max(r["mean_s"] for r in chapters.values()) / grading["jobs"] / 60,
            "grading.largest_memory": f"{largest['chapter']} ({largest['peak_memory_mib'] / 1024:.1f} GiB)",
        }
    return values


def text_of(key: str, measurements: dict | None = None) -> str:
    """What a document shows between ``<!--m:KEY-->`` and ``<!--/m-->``."""
    measurements = load() if measurements is None else measurements
    if key == "grading.table":
        return grading_table(measurements)
    values = derived(measurements)
    if key in values:
        return shown(key, values[key])
    name, _, field = key.partition(".")
    if name not in measurements or field not in measurements[name]:
        raise KeyError(f"measurements.json has no {key!r}")
    return shown(field, measurements[name][field])


def disagreements(text: str, measurements: dict | None = None) -> list[tuple[str, str, str]]:
    """``(key, what the document says, what the measurement says)`` for each marked number that differs."""
    measurements = load() if measurements is None else measurements
    expected = {key: text_of(key, measurements) for key, _ in MARKED.findall(text)}
    return [(key, said, expected[key]) for key, said in MARKED.findall(text) if said != expected[key]]


def write(measurements: dict) -> list[str]:
    """Put every measurement into the documents; return the documents changed."""
    changed = []
    for document in DOCUMENTS:
        text = document.read_text()
        new = MARKED.sub(lambda m: f"<!--m:{m[1]}-->{text_of(m[1], measurements)}<!--/m-->", text)
        if new != text:
            document.write_text(new)
            changed.append(document.name)
    return changed


def save(measurements: dict) -> None:
    MEASUREMENTS.write_text(json.dumps(measurements, indent=1, ensure_ascii=False) + "\n")


def number(text: str):
    """``"41"`` as 41, ``"2.3"`` as 2.3, anything else (a date) as it is."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return float(text) if re.fullmatch(r"-?\d*\.\d+", text) else text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    record = commands.add_parser("record", help="record NAME.FIELD=VALUE ... of one measurement")
    record.add_argument("values", nargs="+")
    record.add_argument("--how", required=True, help="the command that measured it, and where")
    grading = commands.add_parser("grading", help="record python -m benchmarks grading's CSVs from a folder")
    grading.add_argument("folder", type=pathlib.Path)
    grading.add_argument("--how", default="python -m benchmarks grading --autograders dist/autograder "
                                          "--students 2 --jobs 2 (2 cores)")
    commands.add_parser("write", help="write the measurements into README.md and INSTRUCTORS.md")
    args = parser.parse_args(argv)
    measurements = load()
    today = datetime.date.today().isoformat()
    if args.command == "record":
        for assignment in args.values:
            key, _, value = assignment.partition("=")
            name, _, field = key.partition(".")
            if not (name and field and value):
                parser.error(f"record: expected NAME.FIELD=VALUE, got {assignment!r}")
            entry = measurements.setdefault(name, {})
            entry[field], entry["measured"], entry["how"] = number(value), today, args.how
    elif args.command == "grading":
        def rows(name: str) -> list[dict]:
            with open(args.folder / name, newline="") as handle:
                return [{key: number(value) for key, value in row.items()} for row in csv.DictReader(handle)]
        whole = rows("grading-class.csv")[0]
        overhead = {row["sandboxed"]: row for row in rows("grading-overhead.csv")}
        measurements["grading"] = {
            "chapters": rows("grading-chapters.csv"), "notebooks": whole["notebooks"], "jobs": whole["jobs"],
            "minutes": whole["minutes"], "students": whole["students"], "measured": today, "how": args.how}
        measurements["sandbox_start"] = {
            "without_seconds": overhead["False"]["median_s"], "with_seconds": overhead["True"]["median_s"],
            "without_min_seconds": overhead["False"]["min_s"], "with_min_seconds": overhead["True"]["min_s"],
            "repeats": overhead["True"]["repeats"], "measured": today, "how": args.how}
    if args.command in ("record", "grading"):
        save(measurements)
    for name in write(measurements):
        print(f"wrote the measurements into {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
