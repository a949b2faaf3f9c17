"""Every time, size and count in README.md and INSTRUCTORS.md is a measurement's (tools/measurements.py)."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from tools import measurements

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("document", measurements.DOCUMENTS, ids=lambda path: path.name)
def test_every_marked_number_is_its_measurement(document):
    text = document.read_text()
    assert measurements.MARKED.search(text), f"{document.name} marks no measurement"
    assert measurements.disagreements(text) == [], (
        f"{document.name} disagrees with measurements.json: run `.venv/bin/python tools/measurements.py write`")


def test_markers_are_whole_and_every_measurement_is_dated_and_said_how():
    for document in measurements.DOCUMENTS:
        text = measurements.MARKED.sub("", document.read_text())
        assert "<!--m:" not in text and "<!--/m-->" not in text, f"{document.name}: a marker without its pair"
    for name, entry in json.loads(measurements.MEASUREMENTS.read_text()).items():
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["measured"]) and entry["how"], name


def test_a_document_that_drifts_from_its_measurement_is_caught():
    recorded = json.loads(measurements.MEASUREMENTS.read_text())
    key = next(f"{name}.{field}" for name, entry in recorded.items() for field, value in entry.items()
               if isinstance(value, (int, float)))
    right = f"<!--m:{key}-->{measurements.text_of(key, recorded)}<!--/m-->"
    assert measurements.disagreements(right, recorded) == []
    wrong = right.replace(measurements.text_of(key, recorded), "7 min")
    assert measurements.disagreements(wrong, recorded) == [(key, "7 min", measurements.text_of(key, recorded))]


@pytest.mark.parametrize(("name", "value", "text"), [
    ("seconds", 41, "41 s"), ("seconds", 727.4, "12 min 7 s"), ("seconds", 360, "6 min"), ("seconds", 2.87, "2.87 s"),
    ("class_of_40_minutes", 66.8, "67 min"),
    ("size_gb", 2.364, "2.4 GB"), ("peak_mib", 767.9, "767.9 MiB"), ("tests", 5511, "5,511"),
    ("forward_x", 166.9, "167×"),
    ("lowest_pct", 84.6, "84.6 %"), ("date", "2026-12-06", "2026-12-06"), ("per_minute", 4.25, "4.25")])
def test_values_are_shown_by_their_names(name, value, text):
    assert measurements.shown(name, value) == text
