"""The submission's exercise answers as proxies, which the grader's checks call like any function.

A check calls a :class:`RemoteFunction` as it would the student's own function: the arguments go
to the running :class:`~attn_course_grading.remote.Submission` as data, the answer comes back as
data, and an exception in the student's code comes back as an exception of the same name and
message, so a check's diagnosis reads as it does in the notebook.
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
    """The student's function ``name``, called in their sandbox: data in, data out.

    Grad mode is the caller's. What the call changes in its arguments is copied back only where
    changing them is the call's job: the tensors a kernel launch (``index``, the grid) writes,
    and the caches (:class:`~attn_course.core.kv_cache.KVCache`) a decoding step appends to
    (:func:`~attn_course_grading.wire.update_in_place`). An ordinary function's change of a tensor
    argument stays in the sandbox, so that an answer that zeroes ``v`` or fills a mask in place
    cannot change what a check computes after the call.

    Args:
        submission: the running :class:`~attn_course_grading.remote.Submission`.
        name: the answer's name in the notebook.
        index: a kernel's launch grid (``kernel[grid]``), or None for a function.

    Raises:
        TypeError: ``submission`` is not a Submission, or ``name`` not an identifier.
    """

    def __init__(self, submission: Submission, name: str, index: object = None):
        if not isinstance(submission, Submission):
            raise TypeError(f"RemoteFunction: submission must be a Submission, got {type(submission).__name__}")
        if type(name) is not str or not name.isidentifier():
            raise TypeError(f"RemoteFunction: name must be an identifier, got {name!r}")
        self._submission, self.__name__, self._index = submission, name, index

    def __call__(self, *args, **kwargs):
        return self._call(args, kwargs, [])["value"]

    def call_watching(self, rules: list, *args):
        """Call it under the exercise's rules of what it may not call, watched in the sandbox
        (:func:`attn_course.checks.forbidden.watch_calls`, where the answer runs).

        Returns:
            ``(value, seen)``: what it returned, and ``(what was called, the rule)`` for each
            forbidden call, as :func:`~attn_course.checks.forbidden.watch_calls` records them.
        """
        reply = self._call(args, {}, rules)
        by_name = {rule.name: rule for rule in rules}
        return reply["value"], [(called, by_name[name]) for called, name in reply["forbidden"]]

    def _call(self, args: tuple, kwargs: dict, rules: list) -> dict:
        """One call in the sandbox; the changes of the arguments this kind of call is meant to make
        are copied back (the class's rule)."""
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
