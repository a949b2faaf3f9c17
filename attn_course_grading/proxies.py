"""The submission's exercise answers as proxies, which the grader's checks call like any function.

The arguments go to the running :class:`~attn_course_grading.remote.Submission` as data, the answer
comes back as data, and the student's exception as one of the same name and message, so a check's
diagnosis reads as it does in the notebook.
"""

from __future__ import annotations

import torch

from attn_course_grading import wire
from attn_course_grading.remote import Submission


def answer_values(submission: Submission) -> dict[str, object]:
    """``{name: proxy or value}`` for each answer the notebook defines (a missing one is left out)."""
    found: dict[str, object] = {}
    for name, kind in submission.kinds.items():
        if kind == "function":
            found[name] = RemoteFunction(submission, name)
        elif kind == "kernel":
            found[name] = RemoteKernel(submission, name)
        elif kind == "value":
            try:
                found[name] = submission.request({"get": name}).get("value")
            except Exception:  # noqa: BLE001 - a value that cannot cross is left out, as if undefined
                pass
    return found


class RemoteFunction:
    """The student's function ``name`` (a kernel's launch grid ``index``), called in their sandbox,
    with the caller's grad mode.

    Changes of its arguments are copied back only where making them is the call's job
    (:func:`~attn_course_grading.wire.update_in_place`: a kernel's outputs, a decoding step's
    caches): an answer that zeroes ``v`` or fills a mask in place cannot change what a check
    computes after the call.
    """

    def __init__(self, submission: Submission, name: str, index: object = None):
        self._submission, self.__name__, self._index = submission, name, index

    def __call__(self, *args, **kwargs):
        return self._call(args, kwargs, [])["value"]

    def call_watching(self, rules: list, *args):
        """Call it watched in the sandbox under the exercise's ``rules``: ``(value, seen)``, as
        :func:`~attn_course.checks.forbidden.watch_calls` records ``(what was called, the rule)``."""
        reply = self._call(args, {}, rules)
        by_name = {rule.name: rule for rule in rules}
        return reply["value"], [(called, by_name[name]) for called, name in reply["forbidden"]]

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

    def __init__(self, submission: Submission, name: str):
        self._submission, self.__name__ = submission, name
        self.fn = None        # JITFunction's attribute that launchers look for

    def __getitem__(self, grid) -> RemoteFunction:
        return RemoteFunction(self._submission, self.__name__, index=grid)

    def __repr__(self) -> str:
        return f"<the submission's kernel {self.__name__}>"
