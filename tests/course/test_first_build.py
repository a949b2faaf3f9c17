"""The first `make lab` on a machine it cannot build on says why, and leaves no half-made .venv.

The Makefile runs in a folder of its own with a stand-in for Python (a shell script), so that nothing is
installed: what is checked is what make does before and around pip.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def fake_python(folder: pathlib.Path, *, version: str, venv_fails: bool) -> pathlib.Path:
    """A "python" that reports ``version`` and, asked for a venv, makes half of one and maybe fails."""
    major, minor = map(int, version.split(".")[:2])
    script = folder / "python"
    script.write_text(f"""#!/bin/sh
case "$1" in
  --version) echo "Python {version}";;
  -c) exit {int((major, minor) < (3, 10))};;
  -m) mkdir -p "$3/bin" && printf '#!/bin/sh\\nexit 1\\n' > "$3/bin/python" && chmod +x "$3/bin/python"
      exit {int(venv_fails)};;
esac
""")
    script.chmod(0o755)
    return script


def first_build(tmp_path: pathlib.Path, python: pathlib.Path) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").touch()
    return subprocess.run(["make", "--no-print-directory", "venv", f"PYTHON={python}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def test_a_python_older_than_3_10_is_named_with_how_to_choose_another(tmp_path):
    built = first_build(tmp_path, fake_python(tmp_path, version="3.9.6", venv_fails=False))
    assert built.returncode != 0
    assert "needs Python 3.10 or newer" in built.stdout and "is Python 3.9.6" in built.stdout
    assert "make lab PYTHON=python3.12" in built.stdout
    assert not (tmp_path / ".venv").exists()


def test_a_venv_that_cannot_be_made_is_removed_and_the_next_build_starts_clean(tmp_path):
    built = first_build(tmp_path, fake_python(tmp_path, version="3.12.1", venv_fails=True))
    assert built.returncode != 0
    assert "could not create .venv" in built.stdout and "nothing was kept" in built.stdout
    assert not (tmp_path / ".venv").exists()          # the half-made one is gone


def test_a_venv_whose_pip_fails_is_removed_too(tmp_path):
    # The venv is made, but its pip cannot run (the fake's python exits 1): nothing is kept either.
    built = first_build(tmp_path, fake_python(tmp_path, version="3.12.1", venv_fails=False))
    assert built.returncode != 0 and "could not create .venv" in built.stdout
    assert not (tmp_path / ".venv").exists()
