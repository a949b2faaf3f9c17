"""A failing check in a notebook shows its diagnosis alone (checks.diagnosis.show_diagnosis_only)."""

from __future__ import annotations

import re

import IPython
import pytest
from IPython.core.interactiveshell import InteractiveShell

from attn_course.checks.diagnosis import show_diagnosis_only


@pytest.fixture
def shell():
    shell = InteractiveShell.instance()
    yield shell
    shell.set_custom_exc((), None)
    InteractiveShell.clear_instance()


def plain(captured) -> str:
    """What the cell showed, without the terminal colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", captured.out + captured.err)


def test_a_failing_check_prints_one_line_and_no_traceback(shell, capsys):
    assert show_diagnosis_only(shell)
    result = shell.run_cell(
        "from attn_course.checks import check_softmax\n"
        "check_softmax(lambda s: s.exp() / s.exp().sum(dim=0, keepdim=True))"
    )
    text = plain(capsys.readouterr())
    assert not result.success                                   # a notebook's Run All still stops here
    assert "CheckFailed: Your softmax normalises over the wrong dimension" in text
    assert "Traceback" not in text and "attn_course/checks" not in text


def test_other_errors_keep_their_traceback(shell, capsys):
    show_diagnosis_only(shell)
    shell.run_cell("def broken():\n    return 1 / 0\nbroken()")
    text = plain(capsys.readouterr())
    assert "ZeroDivisionError" in text and "return 1 / 0" in text


def test_outside_ipython_nothing_is_installed(monkeypatch):
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    assert show_diagnosis_only() is False
