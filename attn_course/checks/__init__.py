"""Checks for the exercises that say *what* is wrong, in plain words.

Each check runs a student's function on fresh inputs (copies: what the answer does to them in place is
not seen), compares the result with a reference computed first and, when they differ, with what the
mistakes students really make would give; the first that reproduces the answer is named, else the first
entry that differs. A check returns ``True`` or raises :class:`CheckFailed` (an ``AssertionError``), so an
exercise's test cell is one line, ``check_softmax(stable_softmax)``. One module per chapter's exercises;
the chapter imports them from it.

Every comparison with a reference, in the checks and the hidden tests, goes through :func:`matches`
(:mod:`attn_course.checks.compare`): type, device, shape and dtype first, values second, never broadcast.
:func:`report_difference` is the chapters' one way of saying how close a result is to a reference.
Importing the checks installs nothing: an exercise cell calls :func:`show_diagnosis_only` itself.
"""

from attn_course.checks.compare import matches, mismatch
from attn_course.checks.diagnosis import CheckFailed, check_close, show_diagnosis_only
from attn_course.checks.reporting import report_difference
from attn_course.checks.softmax import check_softmax

__all__ = ["CheckFailed", "check_softmax", "check_close", "matches", "mismatch", "report_difference",
           "show_diagnosis_only"]
