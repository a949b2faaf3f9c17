"""Checks for the exercises that say *what* is wrong, in plain words.

Each check runs a student's function on fresh random inputs, compares the result with
the package's reference implementation and, when they differ, tries the mistakes
students really make (softmax over the wrong axis, no scaling, the wrong scaling, an
inverted mask, a mask applied after the softmax, heads split without a transpose, a
softmax that overflows, a causal mask that shows the future or hides the diagonal).
The first mistake that reproduces the student's result is named in the error;
otherwise the error points at the first entry that differs.

A check returns ``True`` when the function is right and raises :class:`CheckFailed`
(an ``AssertionError``) with the diagnosis otherwise, so an exercise's test cell is a
single line such as ``check_softmax(stable_softmax)``.

Every comparison of an answer with its reference, in the checks and in the chapters' hidden tests,
goes through :func:`matches` (:mod:`attn_course.checks.compare`): a plain tensor of the reference's
device, shape and dtype first, values second, never broadcast. The answer is called with copies of
its inputs, after its reference is computed.

:func:`report_difference` is the chapters' one way of saying how close a result is to an
independent reference ("max difference 4.5e-08, within the tolerance 1e-05").

Importing the checks installs nothing. A chapter's exercise cell switches on the short display
of a failing check itself, with :func:`show_diagnosis_only` (IPython's ``set_custom_exc``).
"""

from attn_course.checks.attention import check_attention, check_attention_weights
from attn_course.checks.causal import check_causal_attention
from attn_course.checks.compare import matches, mismatch
from attn_course.checks.diagnosis import CheckFailed, check_close, show_diagnosis_only
from attn_course.checks.heads import check_split_heads
from attn_course.checks.reporting import report_difference
from attn_course.checks.softmax import check_softmax

__all__ = [
    "CheckFailed",
    "check_softmax",
    "check_attention",
    "check_attention_weights",
    "check_split_heads",
    "check_causal_attention",
    "check_close",
    "matches",
    "mismatch",
    "report_difference",
    "show_diagnosis_only",
]
