"""The submission's exercise answers as proxies, which the grader's checks call like any function.

The arguments go to the running :class:`~attn_course_grading.remote.Submission` as data, the answer
comes back as data, and the student's exception as one of the same name and message, so a check's
diagnosis reads as it does in the notebook.
"""

from __future__ import annotations

import torch

from attn_course.checks.answer_source import definition_source, source_violations
from attn_course.checks.forbidden import Forbidden, violation
from attn_course_grading import wire
from attn_course_grading.remote import Submission


def answer_values(submission: Submission, verdicts: SourceVerdicts | None = None) -> dict[str, object]:
    """``{name: proxy or value}`` for each answer the notebook defines (a missing one is left out);
    each proxy's source is checked by ``verdicts`` (a fresh :class:`SourceVerdicts` when None)."""
    verdicts = SourceVerdicts(submission.cells) if verdicts is None else verdicts
    found: dict[str, object] = {}
    for name, kind in submission.kinds.items():
        if kind == "function":
            found[name] = RemoteFunction(submission, name, verdicts=verdicts)
        elif kind == "kernel":
            found[name] = RemoteKernel(submission, name, verdicts)
        elif kind == "value":
            try:
                found[name] = submission.request({"get": name}).get("value")
            except Exception:  # noqa: BLE001 - a value that cannot cross is left out, as if undefined
                pass
    return found


class SourceVerdicts:
    """What the submitted source of each answer calls, against the rules its exercise's checks gave
    (read in the grading process, out of the student's reach): the rules an answer was first checked
    under hold for every later call of it, a hidden test's included, and each broken rule is kept
    for the question being graded (:meth:`take`)."""

    def __init__(self, cells: list[str]):
        self.cells, self.rules, self.broken = cells, {}, {}

    def check(self, name: str, rules: list[Forbidden]) -> list[tuple[str, Forbidden]]:
        """The violations of ``name``'s source under ``rules``, those it was checked under before and
        :data:`~attn_course.checks.answer_source.ESCAPE` (the ways around a check, forbidden to all)."""
        known = self.rules.setdefault(name, [])
        known += [rule for rule in rules if rule not in known]
        return source_violations(self.cells, name, known)      # remembered there: cheap at every call

    def record(self, name: str, seen: list[tuple[str, Forbidden]]) -> None:
        """Keep the first broken rule of ``name`` (``seen`` from the watch or the source) for its question."""
        if seen:
            self.broken.setdefault(name, violation(name, seen))

    def take(self) -> dict[str, str]:
        """``{answer: diagnosis}`` of the rules broken since the last call."""
        broken, self.broken = self.broken, {}
        return broken


class RemoteFunction:
    """The student's function ``name`` (a kernel's launch grid ``index``), called in their sandbox,
    with the caller's grad mode.

    Changes of its arguments are copied back only where making them is the call's job
    (:func:`~attn_course_grading.wire.update_in_place`: a kernel's outputs, a decoding step's
    caches): an answer that zeroes ``v`` or fills a mask in place cannot change what a check
    computes after the call.
    """

    def __init__(self, submission: Submission, name: str, index: object = None, *,
                 verdicts: SourceVerdicts | None = None):
        self._submission, self.__name__, self._index = submission, name, index
        self._verdicts = SourceVerdicts(submission.cells) if verdicts is None else verdicts

    def __call__(self, *args, **kwargs):
        # A hidden test's call: the rules the answer was checked under hold for it too.
        self._verdicts.record(self.__name__, self._verdicts.check(self.__name__, []))
        return self._call(args, kwargs, [])["value"]

    def call_watching(self, rules: list, *args):
        """Call it under the exercise's ``rules``: ``(value, seen)``, as
        :func:`~attn_course.checks.forbidden.watch_calls` records ``(what was called, the rule)``. It
        runs watched in the sandbox (what the notebook's own check sees, named as there, is this
        call's verdict); its submitted source is read here too, out of the student's reach, and what
        the watch could not see there costs the whole question (:meth:`SourceVerdicts.take`)."""
        written = self._verdicts.check(self.__name__, rules)
        reply = self._call(args, {}, rules)
        by_name = {rule.name: rule for rule in rules}
        seen = [(called, by_name[name]) for called, name in reply["forbidden"]]
        self._verdicts.record(self.__name__, seen or written)
        return reply["value"], seen

    def _call(self, args: tuple, kwargs: dict, rules: list) -> dict:
        reply = self._submission.request({"call": self.__name__, "index": self._index, "args": list(args),
                                          "kwargs": kwargs, "grad": torch.is_grad_enabled(),
                                          "forbid": [[rule.name, rule.why] for rule in rules]})
        for original, changed in zip(args, reply["after"]):
            wire.update_in_place(original, changed, tensors=self._index is not None)
        return reply

    def __repr__(self) -> str:
        return f"<the submission's {self.__name__}>"


class RemoteKernel:
    """The student's ``@triton.jit`` kernel: ``kernel[grid](...)`` launches it in their sandbox
    (in Triton's interpreter) and copies the tensors it wrote back into the caller's."""

    def __init__(self, submission: Submission, name: str, verdicts: SourceVerdicts | None = None):
        self._submission, self.__name__ = submission, name
        self._verdicts = SourceVerdicts(submission.cells) if verdicts is None else verdicts
        self.fn = None        # JITFunction's attribute that launchers look for

    def __getitem__(self, grid) -> RemoteFunction:
        return RemoteFunction(self._submission, self.__name__, index=grid, verdicts=self._verdicts)

    @property
    def source(self) -> str | None:
        """The kernel's definition as handed in, read here, out of the student's reach (a check that reads
        a kernel's code reads this where ``fn`` is None)."""
        return definition_source(self._submission.cells, self.__name__)

    def __repr__(self) -> str:
        return f"<the submission's kernel {self.__name__}>"
