"""Planted mistakes, one file per chapter (planted_NN.py): student -> function -> (code, question, hint)."""

import importlib
import pathlib

#: {chapter: {student: {function: (planted code, question, a phrase of the hint)}}}
PLANTED_BY_CHAPTER = {
    module.CHAPTER: module.PLANTED
    for module in (importlib.import_module(f"{__name__}.{path.stem}")
                   for path in sorted(pathlib.Path(__file__).parent.glob("planted_[0-9][0-9].py")))
}

#: The planted students who attack the tests rather than make a mistake (issue 31): empty answers (eve), inputs
#: changed in place (mallory), answers that broadcast (bob), measurements the watch does not see (carlo, nancy).
#: Each fails every test of its question, hidden ones included (tests/checks/test_hostile_answers.py).
HOSTILE = ("eve", "mallory", "bob", "carlo", "nancy")
