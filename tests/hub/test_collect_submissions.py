"""Collection: tools/collect_submissions.py gathers a class's notebooks from the hub's homes.

A made-up class of homes, each with one thing an instructor meets (a student who never opened the
link, a notebook that is not JSON, links out of the home and within it, a FIFO), collected the way
the instructor runs it (the script, its exit status, its report), then read by the grader's own
reader (attn_course_grading.collect.find_submissions), which must find exactly the good notebooks.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc

import nbformat
import pytest

from attn_course_grading.collect import find_submissions
from tools import collect_submissions

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHAPTERS = ["01_intuition", "02_formula"]


def notebook_bytes(answer: str) -> bytes:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(answer)]
    return nbformat.writes(notebook).encode()


def run(homes: pathlib.Path, out: pathlib.Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "tools/collect_submissions.py", str(homes), "--out", str(out),
                           "--chapters", ",".join(CHAPTERS), *extra], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture
def homes(tmp_path):
    homes = tmp_path / "homes"
    secret = tmp_path / "secret.ipynb"                       # outside every home
    secret.write_bytes(notebook_bytes("the solution"))

    def home(user: str) -> pathlib.Path:
        folder = homes / user / "attn-course"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    home("ada").joinpath("01_intuition.ipynb").write_bytes(notebook_bytes("ada 01"))
    home("ada").joinpath("02_formula.ipynb").write_bytes(notebook_bytes("ada 02"))
    (homes / "bob").mkdir()                                  # never opened the link
    home("carol").joinpath("02_formula.ipynb").write_bytes(b'{"cells": [')            # not JSON
    home("carol").joinpath("01_intuition.ipynb").write_bytes(notebook_bytes("carol 01"))
    home("mallory").joinpath("02_formula.ipynb").symlink_to(secret)                    # out of the home
    eve = home("eve")
    (eve.parent / "draft.ipynb").write_bytes(notebook_bytes("eve's draft"))
    (eve / "02_formula.ipynb").symlink_to("../draft.ipynb")                            # inside the home
    os.mkfifo(home("frank") / "02_formula.ipynb")                                      # never ends
    (homes / "gina").symlink_to(homes / "ada")                                         # a home that is a link
    (homes / "hal").mkdir()
    (homes / "hal" / "attn-course").symlink_to(homes / "ada" / "attn-course")
    (homes / ".snapshots").mkdir()
    (homes / "README").write_text("not a home")
    return homes


def test_the_good_notebooks_are_collected_and_everything_else_is_reported(homes, tmp_path):
    out = tmp_path / "submissions"
    completed = run(homes, out)
    assert completed.returncode == 1, completed.stderr                 # something was refused
    lines = completed.stdout.splitlines()

    def about(user: str) -> list[str]:
        return [line for line in lines if line.startswith(f"{user}: ")]

    assert about("ada") == ["ada: collected 01_intuition, 02_formula"]
    assert about("bob") == ["bob: missing 01_intuition, 02_formula (no hand-out folder: the link was never opened)"]
    carol = about("carol")
    assert carol[0] == "carol: collected 01_intuition" and "not valid JSON" in carol[1] and "02_formula" in carol[1]
    mallory = about("mallory")[0]
    assert about("mallory")[1] == "mallory: missing 01_intuition"
    assert "REFUSED 02_formula" in mallory and "symbolic link" in mallory and str(tmp_path / "secret.ipynb") in mallory
    assert "outside mallory/" in mallory
    assert "inside eve/" in about("eve")[0] and "symbolic link" in about("eve")[0]
    assert "REFUSED 02_formula" in about("frank")[0] and "FIFO" in about("frank")[0]
    assert "REFUSED the whole home" in about("gina")[0] and "symbolic link" in about("gina")[0]
    assert "REFUSED the whole home" in about("hal")[0] and "attn-course/ folder is a symbolic link" in about("hal")[0]
    assert not about(".snapshots") and not about("README")
    assert (out / "collection.txt").read_text().splitlines() == lines[:-1]

    # Only what was read and checked was written, byte for byte; the grader's reader finds just that.
    found = find_submissions(out, set(CHAPTERS))
    assert {user: sorted(chapters) for user, chapters in found.notebooks.items()} == {
        "ada": CHAPTERS, "carol": ["01_intuition"]}
    assert found.refused == []
    original = homes / "ada" / "attn-course" / "02_formula.ipynb"
    assert (out / "ada" / "02_formula.ipynb").read_bytes() == original.read_bytes()


def test_a_class_with_nothing_refused_exits_0_and_a_second_collection_replaces_the_first(tmp_path):
    homes = tmp_path / "homes"
    (homes / "ada" / "attn-course").mkdir(parents=True)
    (homes / "ada" / "attn-course" / "02_formula.ipynb").write_bytes(notebook_bytes("ada"))
    (homes / "bob").mkdir()
    out = tmp_path / "submissions"
    assert run(homes, out).returncode == 0                             # a missing chapter is reported, not refused
    (homes / "ada" / "attn-course" / "02_formula.ipynb").unlink()
    completed = run(homes, out)
    assert completed.returncode == 0
    assert not (out / "ada").exists()                                 # last week's copy does not stand in


def test_an_out_folder_that_no_collection_wrote_is_left_alone(tmp_path):
    homes = tmp_path / "homes"
    (homes / "ada").mkdir(parents=True)
    out = tmp_path / "grades-of-last-year"
    out.mkdir()
    (out / "precious.csv").write_text("keep me")
    completed = run(homes, out)
    assert completed.returncode == 2 and "no collection wrote" in completed.stderr
    assert (out / "precious.csv").read_text() == "keep me"


def test_collect_homes_checks_its_arguments(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="homes must be a folder of user folders"):
        collect_submissions.collect_homes(tmp_path / "none", out, CHAPTERS)
    with pytest.raises(TypeError, match="chapters must be a list of chapter names, got '02_formula'"):
        collect_submissions.collect_homes(tmp_path, out, "02_formula")
    with pytest.raises(ValueError, match="chapters must be names like '02_formula'"):
        collect_submissions.collect_homes(tmp_path, out, ["02_formula.ipynb"])
    with pytest.raises(ValueError, match="inside must be a folder inside each home"):
        collect_submissions.collect_homes(tmp_path, out, CHAPTERS, inside="../elsewhere")
    with pytest.raises(TypeError, match="homes must be a path, got int"):
        collect_submissions.collect_homes(3, out, CHAPTERS)
    with pytest.raises(TypeError, match="out must be a path, got NoneType"):
        collect_submissions.collect_homes(tmp_path, None, CHAPTERS)
    assert not out.exists()


def test_a_folder_export_with_the_notebooks_in_each_home_itself(tmp_path):
    export = tmp_path / "export"
    (export / "ada").mkdir(parents=True)
    (export / "ada" / "02_formula.ipynb").write_bytes(notebook_bytes("ada"))
    report = collect_submissions.collect_homes(export, tmp_path / "out", ["02_formula"], inside="")
    assert report.collected == {"ada": ["02_formula"]}
    assert [path.name for path in (tmp_path / "out" / "ada").iterdir()] == ["02_formula.ipynb"]


# --- a home that changes or cannot be read while it is collected (issue 45) -----------------------

SWAPPER = """
import os, sys
home, elsewhere = sys.argv[1], sys.argv[2]
folder, kept = os.path.join(home, "attn-course"), os.path.join(home, "kept")
print("swapping", flush=True)
while True:                   # the hand-out folder, then nothing, then a link to elsewhere, then nothing
    os.rename(folder, kept)
    os.symlink(elsewhere, folder)
    os.unlink(folder)
    os.rename(kept, folder)
"""


def test_a_student_swapping_their_folder_for_a_link_stops_nobody_else(tmp_path):
    # Before, lstat and readlink raised mid-swap (ENOTDIR, EINVAL) and 11 runs of 30 collected nobody.
    homes = tmp_path / "homes"
    for user in ("ada", "mallory"):
        (homes / user / "attn-course").mkdir(parents=True)
        (homes / user / "attn-course" / "02_formula.ipynb").write_bytes(notebook_bytes(f"{user}'s own"))
    (tmp_path / "solution").mkdir()
    (tmp_path / "solution" / "02_formula.ipynb").write_bytes(notebook_bytes("the solution"))
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(homes / "mallory"), str(tmp_path / "solution")],
                               stdout=subprocess.PIPE, text=True)
    outcomes = set()
    try:
        assert swapper.stdout.readline() == "swapping\n"
        # At least 30 collections, and on until both a collected and another outcome were seen (a busy
        # machine may hold the swapper in one state for many of them), for at most 20 s.
        deadline = time.monotonic() + 20
        for run_number in itertools.count():
            if run_number >= 30 and ("collected" in outcomes and len(outcomes) > 1 or time.monotonic() > deadline):
                break
            out = tmp_path / "out"                                     # replaced by each collection
            report = collect_submissions.collect_homes(homes, out, ["02_formula"])
            assert report.collected["ada"] == ["02_formula"]
            taken = out / "mallory" / "02_formula.ipynb"
            assert not taken.exists() or nbformat.reads(taken.read_text(), 4).cells[0].source == "mallory's own"
            outcomes.add("collected" if taken.exists() else "refused" if report.refused else "missing")
    finally:
        swapper.kill()
        swapper.wait()
    assert "collected" in outcomes and len(outcomes) > 1, outcomes      # the race was really run


def without_root_reading() -> None:
    """In the child before exec: root without the two capabilities that let it read any file
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so a mode-000 folder is refused as it is to an instructor."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for capability in (1, 2):                   # linux/capability.h
            if libc.prctl(24, capability, 0, 0, 0) != 0:        # PR_CAPBSET_DROP: gone after exec
                os._exit(100 + ctypes.get_errno())


def test_an_unreadable_home_or_notebook_refuses_that_student_alone(tmp_path):
    # An exported copy collected by an instructor who is not root: a mode-000 folder stopped everyone.
    shared = pathlib.Path(tempfile.mkdtemp(prefix="collect-", dir="/tmp"))
    try:
        shared.chmod(0o755)
        homes = shared / "homes"
        for user in ("ada", "bob", "carol"):
            (homes / user).mkdir(parents=True)
            (homes / user / "02_formula.ipynb").write_bytes(notebook_bytes(f"{user}'s own"))
        (homes / "carol" / "01_intuition.ipynb").write_bytes(notebook_bytes("carol's 01"))
        (homes / "bob").chmod(0)
        (homes / "carol" / "02_formula.ipynb").chmod(0)
        (shared / "out").mkdir(mode=0o777)
        (shared / "out").chmod(0o777)
        completed = subprocess.run([sys.executable, "tools/collect_submissions.py", str(homes), "--out",
                                    str(shared / "out"), "--chapters", ",".join(CHAPTERS), "--inside", ""],
                                   cwd=ROOT, capture_output=True, text=True, preexec_fn=without_root_reading)
        assert completed.returncode == 1, completed.stderr
        lines = completed.stdout.splitlines()
        assert "ada: collected 02_formula" in lines
        assert "bob: REFUSED the whole home: the home folder cannot be read (Permission denied)" in lines
        assert "carol: collected 01_intuition" in lines
        assert "carol: REFUSED 02_formula: it cannot be opened (Permission denied)" in lines
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(shared)], check=False)
        shutil.rmtree(shared)


def test_notebooks_are_written_as_they_are_read_not_held_until_the_end(tmp_path):
    # Before, twelve notebooks of 15.7 MiB held 246 MB until the collection was written.
    homes = tmp_path / "homes"
    chapters = [f"{number:02d}_chapter" for number in range(1, 7)]
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("x = '" + "a" * 200_000 + "'") for _ in range(20)]
    big = nbformat.writes(notebook).encode()
    for chapter in chapters:
        (homes / "ada").mkdir(parents=True, exist_ok=True)
        (homes / "ada" / f"{chapter}.ipynb").write_bytes(big)
    tracemalloc.start()
    try:
        report = collect_submissions.collect_homes(homes, tmp_path / "out", chapters, inside="")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.collected["ada"] == chapters
    assert peak < 4 * len(big), f"{peak / 2**20:.1f} MiB held for notebooks of {len(big) / 2**20:.1f} MiB"
