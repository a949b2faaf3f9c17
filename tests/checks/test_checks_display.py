"""A failing check in a notebook shows its diagnosis alone (checks.diagnosis.show_diagnosis_only),
once the exercise cell switches it on; importing the checks installs nothing.

The cells run in a real IPython shell (``InteractiveShell.run_cell``), as a notebook's kernel runs them.
"""

from __future__ import annotations

import re
import subprocess
import sys

import IPython
import pytest
from IPython.core.interactiveshell import InteractiveShell

from attn_course.checks import show_diagnosis_only

WRONG_SOFTMAX = ("from attn_course.checks import check_softmax\n"
                 "check_softmax(lambda s: s.exp() / s.exp().sum(dim=0, keepdim=True))")


@pytest.fixture
def shell():
    shell = InteractiveShell.instance()
    yield shell
    shell.set_custom_exc((), None)
    InteractiveShell.clear_instance()


def plain(captured) -> str:
    """What the cell showed, without the terminal colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", captured.out + captured.err)


def test_a_failing_check_prints_its_diagnosis_and_no_traceback(shell, capsys):
    assert show_diagnosis_only(shell)
    result = shell.run_cell(WRONG_SOFTMAX)
    lines = [line for line in plain(capsys.readouterr()).splitlines() if line.strip()]
    assert not result.success                                   # a notebook's Run All still stops here
    assert isinstance(result.error_in_exec, AssertionError)     # otter and nbval see a failed cell
    assert lines[0] == "An exception has occurred, use %tb to see the full traceback."
    assert lines[1].startswith("CheckFailed: Your softmax normalises over the wrong dimension")
    assert len(lines) == 2, lines                               # no frame of attn_course/checks


def test_without_it_a_failing_check_keeps_its_traceback(shell, capsys):
    result = shell.run_cell(WRONG_SOFTMAX)
    text = plain(capsys.readouterr())
    assert not result.success
    assert "Traceback" in text and "attn_course/checks" in text and "CheckFailed" in text


def test_other_errors_keep_their_traceback(shell, capsys):
    show_diagnosis_only(shell)
    shell.run_cell("def broken():\n    return 1 / 0\nbroken()")
    text = plain(capsys.readouterr())
    assert "ZeroDivisionError" in text and "return 1 / 0" in text and "Traceback" in text


def test_importing_the_checks_installs_nothing():
    # A fresh process (this one imported the checks long ago): a running shell, then the import.
    code = ("from IPython.core.interactiveshell import InteractiveShell\n"
            "shell = InteractiveShell.instance()\n"
            "import attn_course.checks, attn_course.checks.softmax\n"
            "print(shell.custom_exceptions)")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "()"


def test_outside_ipython_nothing_is_installed(monkeypatch):
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    assert show_diagnosis_only() is False
