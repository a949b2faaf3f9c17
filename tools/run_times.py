"""Each chapter's measured run time, written once and quoted everywhere from one file.

    .venv/bin/python tools/run_times.py           # rewrite README.md and the chapters' headers
    .venv/bin/python tools/run_times.py --check   # exit 1 if any of them disagrees with the file

`tools/run_notebooks.py` (`make execute`) records each chapter's seconds in `notebooks/run_times.json`
and calls this module, which rewrites where a reader meets them: README's chapter table (also the
website's front page), its "in about … for the whole course", and each chapter's "**Run time**" line.
Nobody types these numbers: `--check` fails when one was edited by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys

import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
TIMES = NOTEBOOKS / "run_times.json"
README = ROOT / "README.md"

# The "**Run time**:" line and any lines that continue it, up to the next "**...**" line or a blank one.
HEADER_LINE = re.compile(r"^\*\*Run time\*\*:.*(?:\n(?!\*\*)(?!\s*$).*)*", re.MULTILINE)
# A README table row that links a chapter: | [01 Intuition](notebooks/01_intuition.ipynb) | goals | time |
TABLE_ROW = re.compile(r"^(\| \[[^\]]+\]\(notebooks/(\d\d_\w+)\.ipynb\) \|.*\| )([^|]*)( \|)$", re.MULTILINE)
WHOLE_COURSE = re.compile(r"in about [^,.;]+? for the whole course")


def describe(seconds: float) -> str:
    """A run time as a reader wants it: "about 25 s", "about 1 min 50 s", to the nearest 5 s under a
    minute and 10 s above it (about the run-to-run spread on a loaded 2-core machine)."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    if seconds < 57.5:
        return f"about {max(5, 5 * round(seconds / 5))} s"
    rounded = 10 * round(seconds / 10)
    minutes, rest = divmod(rounded, 60)
    return f"about {minutes} min" + (f" {rest} s" if rest else "")


def load() -> dict:
    """``{"cpus": int, "chapters": {"01_intuition": seconds, ...}}`` from notebooks/run_times.json."""
    if not TIMES.exists():
        return {"cpus": os.cpu_count(), "chapters": {}}
    return json.loads(TIMES.read_text(encoding="utf-8"))


def record(chapter: str, seconds: float) -> None:
    """Store one chapter's measured run time (``chapter`` is the file's stem, e.g. ``04_causal``)."""
    times = load()
    times["cpus"] = os.cpu_count()
    times["chapters"][chapter] = round(float(seconds), 1)
    times["chapters"] = dict(sorted(times["chapters"].items()))
    TIMES.write_text(json.dumps(times, indent=1) + "\n", encoding="utf-8")


def render_readme(text: str, times: dict) -> str:
    chapters = times["chapters"]

    def row(match: re.Match) -> str:
        stem = match.group(2)
        if stem not in chapters:
            raise SystemExit(f"README.md's table links {stem}, which notebooks/run_times.json does not time: "
                             f"run `make execute`")
        return f"{match.group(1)}{describe(chapters[stem]).replace('about ', '~')}{match.group(4)}"

    text = TABLE_ROW.sub(row, text)
    total_minutes = max(1, round(sum(chapters.values()) / 60))
    return WHOLE_COURSE.sub(f"in about {total_minutes} minutes for the whole course", text)


def stale_files(write: bool) -> list[str]:
    """The files whose run times disagree with run_times.json (rewritten when ``write``)."""
    times = load()
    stale = []
    readme = README.read_text(encoding="utf-8")
    rendered = render_readme(readme, times)
    if rendered != readme:
        stale.append("README.md")
        if write:
            README.write_text(rendered, encoding="utf-8")
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        if path.stem not in times["chapters"]:
            stale.append(f"{path.name} (not timed: run `make execute`)")
            continue
        notebook = nbformat.read(path, as_version=4)
        first = notebook.cells[0]
        if not HEADER_LINE.search(first.source):
            raise SystemExit(f"{path.name}'s first cell has no '**Run time**:' line to rewrite")
        line = (f"**Run time**: {describe(times['chapters'][path.stem])} on a {times['cpus']}-core CPU, "
                "top to bottom in a fresh kernel.")
        source = HEADER_LINE.sub(lambda _, line=line: line, first.source)
        if source != first.source:
            stale.append(path.name)
            if write:
                first.source = source
                nbformat.write(notebook, path)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report what disagrees; exit 1 if anything does")
    args = parser.parse_args(argv)
    stale = stale_files(write=not args.check)
    if args.check and stale:
        print("run times disagree with notebooks/run_times.json in: " + ", ".join(stale)
              + " (tools/run_times.py rewrites them)")
        return 1
    for name in stale:
        print(name if "not timed" in name else f"rewrote the run time in {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
