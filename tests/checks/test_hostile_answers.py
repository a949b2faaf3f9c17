"""Issue 31: answers that compute nothing (empty, broadcast, measured, or that change their inputs in place)
fail every test of their question, the public check and the hidden tests alike, so that they score 0.

Each is a planted student of tests/support/planted/ (support.planted.HOSTILE), run here as otter runs the
notebook's tests, without otter: the answer's cell, then each test cell, in a namespace of the chapter's
imports. The same students are graded through make grade by the hostile class (tests/grading/hostile/checks.py).
"""

import pytest

from support.exercises import ROOT, chapter_namespace, failures, question_tests
from support.planted import HOSTILE, PLANTED_BY_CHAPTER

CASES = [pytest.param(chapter, student, name, id=f"{chapter[:2]}-{student}-{name}")
         for chapter, students in sorted(PLANTED_BY_CHAPTER.items()) for student in HOSTILE
         for name in students.get(student, {})]


def test_every_attack_has_a_hostile_student():
    assert {student for _, student, _ in (case.values for case in CASES)} == set(HOSTILE)


@pytest.mark.parametrize("chapter, student, name", CASES)
def test_a_hostile_answer_fails_every_test_of_its_question(chapter, student, name):
    code, question, hint = PLANTED_BY_CHAPTER[chapter][student][name]
    master = ROOT / "notebooks" / f"{chapter}.ipynb"
    tests = question_tests(master, hidden=True)[question]
    namespace = chapter_namespace(master)
    exec(compile(code, f"<{student}'s {name}>", "exec"), namespace)
    messages = failures(tests, namespace, question)
    assert len(messages) == len(tests), f"{student}'s {name} passes {len(tests) - len(messages)} of the tests"
    assert hint in messages[0], messages
