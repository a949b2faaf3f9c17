"""tools/run_times.py: every chapter's run time is measured once and quoted from one file."""

from __future__ import annotations

import json
import pathlib
import re

import nbformat
import pytest

from tools import run_times

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TIMES = json.loads((ROOT / "notebooks" / "run_times.json").read_text())


@pytest.mark.parametrize(("seconds", "text"), [
    (3.0, "about 5 s"), (24.9, "about 25 s"), (27.6, "about 30 s"), (57.4, "about 55 s"),
    (58.0, "about 1 min"), (112.0, "about 1 min 50 s"), (176.0, "about 3 min"),
])
def test_describe_rounds_to_what_a_rerun_can_confirm(seconds, text):
    assert run_times.describe(seconds) == text


@pytest.mark.parametrize("seconds", [0, -1.0, "30", True, None])
def test_describe_rejects_what_is_not_a_positive_number(seconds):
    with pytest.raises(ValueError, match="seconds must be a positive number"):
        run_times.describe(seconds)


def test_every_chapter_was_timed_on_the_course_machine():
    assert sorted(TIMES["chapters"]) == [path.stem for path in CHAPTERS]
    assert TIMES["cpus"] == 2                      # the course's promise: a 2-core CPU
    assert all(0 < seconds < 600 for seconds in TIMES["chapters"].values())


def test_readme_headers_and_website_quote_the_measured_numbers():
    # Read here from the files themselves, not from the tool's own rendering.
    readme = (ROOT / "README.md").read_text()
    for path in CHAPTERS:
        seconds = TIMES["chapters"][path.stem]
        (row,) = [line for line in readme.splitlines() if f"](notebooks/{path.name})" in line]
        quoted = row.rsplit("|", 2)[1].strip()
        minutes = re.fullmatch(r"~(\d+) min(?: (\d+) s)?", quoted)
        value = int(minutes[1]) * 60 + int(minutes[2] or 0) if minutes else int(re.fullmatch(r"~(\d+) s", quoted)[1])
        assert abs(value - seconds) <= 5, (path.name, quoted, seconds)
        first_cell = nbformat.read(path, as_version=4).cells[0].source
        assert f"**Run time**: {run_times.describe(seconds)} on a 2-core CPU" in first_cell, path.name
    total = round(sum(TIMES["chapters"].values()) / 60)
    assert f"in about {total} minutes for the whole course" in readme
    # The website's front page is README's chapter map (tools/site.py), so it says the same.


def test_nothing_disagrees_with_the_file():
    assert run_times.stale_files(write=False) == []
