"""What every exercise check shares: calling the student's function safely, and naming the mistake.

:func:`diagnose` compares a wrong answer with the answers that known mistakes would give and
raises :class:`CheckFailed` with the first one that matches, else with the first entry that
differs. :func:`check_close` does the same for any tensor answer with a fixed hint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attn_course.checks.compare import FLOATING, INTEGER, matches, mismatch
from attn_course.checks.forbidden import Forbidden, violation, watch_calls

__all__ = [
    "ATOL", "CheckFailed", "call_answer", "call_student", "watched", "same",
    "first_difference", "check_shape", "diagnose", "check_close", "show_diagnosis_only", "call_raw",
    "returned_tensors", "crash_message", "sentence_list", "same_kind", "fresh_arguments",
]

ATOL = 1e-5


class CheckFailed(AssertionError):
    """An exercise's answer is wrong; the message says how."""


def show_diagnosis_only(shell: object = None) -> bool:
    """In a notebook, show a failing check as its diagnosis alone, without the traceback.

    Called by a chapter's exercise cell, after it imports the checks (importing them changes
    nothing): from then on a :class:`CheckFailed` that reaches the notebook is displayed as
    IPython's one-line error, ``CheckFailed: <what is wrong>``, after IPython's pointer to
    ``%tb`` for the full traceback, which would only show the inside of the course's checks.
    Every other exception keeps its full traceback. Outside IPython nothing changes. It uses
    IPython's public API: ``InteractiveShell.set_custom_exc`` to catch :class:`CheckFailed`, and
    ``showtraceback(exception_only=True)`` to display it.

    Args:
        shell: an IPython ``InteractiveShell``; default the running one, if any.

    Returns:
        ``True`` when the display was installed, ``False`` outside IPython.
    """
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:   # pragma: no cover - IPython comes with Jupyter
            return False
        shell = get_ipython()
    if shell is None:
        return False

    def diagnosis(shell, etype, value, tb, tb_offset=None):
        # A notebook's error output (the cell still fails, so Run All stops here), just the last line.
        shell.showtraceback((etype, value, tb), exception_only=True)

    shell.set_custom_exc((CheckFailed,), diagnosis)
    return True


def call_answer(where: str, fn: Callable, *args, described: str | None = None,
                forbidden: Sequence[Forbidden] = ()) -> object:
    """Call the student's function and return whatever it returns, but never crash the check.

    A crash in the student's code becomes a :class:`CheckFailed` that names the exception and how
    the function was called (``described``, or the shapes of the arguments); ``...`` or None
    becomes "returns nothing yet". With ``forbidden`` (:class:`~attn_course.checks.forbidden.Forbidden`
    rules), a call of what the exercise forbids fails the check, named, whatever the answer
    returned. An answer that runs elsewhere (the grader's proxy of a submission's function,
    which has ``call_watching``) is watched where it runs, under the same rules.

    Example:
        >>> rules = [Forbidden("torch.softmax", "write it from exp and sum")]
        >>> call_answer("check_softmax", lambda x: torch.softmax(x, 0), torch.zeros(2), forbidden=rules)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_softmax: your answer calls torch.softmax, which this ...
    """
    if not callable(fn):
        raise TypeError(f"{where}: expected your function, got {type(fn).__name__}")
    if isinstance(fn, _Watched):               # called by a check that takes its own ``described``
        fn, forbidden = fn.fn, (*forbidden, *fn.forbidden)
    args = fresh_arguments(args)
    seen: list = []
    try:
        watched_elsewhere = getattr(fn, "call_watching", None)
        if forbidden and watched_elsewhere is not None:
            result, seen = watched_elsewhere(list(forbidden), *args)
        else:
            with watch_calls(forbidden) as seen:
                result = fn(*args)
    except CheckFailed:
        raise
    except Exception as error:  # the student's code crashed: say where, keep the cause
        forbidden_call = violation(where, seen)
        if forbidden_call:                     # a forbidden call came first: that is the mistake
            raise CheckFailed(forbidden_call) from error
        if described is None:
            described = ", ".join(f"a tensor of shape {list(a.shape)}" if isinstance(a, torch.Tensor) else repr(a)
                                  for a in args)
        raise CheckFailed(f"Your function raised {type(error).__name__}: {error}. It was called with {described}.") \
            from error
    forbidden_call = violation(where, seen)
    if forbidden_call:
        raise CheckFailed(forbidden_call)
    if result is Ellipsis or result is None:
        raise CheckFailed("Your function returns nothing yet: replace the `...` with your code.")
    return result


class _Watched:
    """An answer and the rules it is called under (what :func:`watched` returns)."""

    def __init__(self, where: str, fn: Callable, forbidden: Sequence[Forbidden]):
        self.where, self.fn, self.forbidden = where, fn, tuple(forbidden)

    def __call__(self, *args):
        return call_answer(self.where, self.fn, *args, forbidden=self.forbidden)


def watched(where: str, fn: Callable, forbidden: Sequence[Forbidden]) -> Callable:
    """``fn`` as a check calls it under an exercise's rules: every call goes through
    :func:`call_answer` with ``forbidden``, so a forbidden call fails the check, named, at the
    first call that makes it. Passed to :func:`call_answer` itself, it is called there, under
    those rules and with the ``described`` of that call.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"{where}: expected your function, got {type(fn).__name__}")
    return _Watched(where, fn, forbidden)


def call_student(where: str, fn: Callable, *args) -> torch.Tensor:
    """Call the student's function (:func:`call_answer`), unwrap ``(output, weights)``, insist on a tensor."""
    result = call_answer(where, fn, *args)
    if isinstance(result, tuple):
        result = result[0]
    if result is Ellipsis or result is None:
        raise CheckFailed("Your function returns nothing yet: replace the `...` with your code.")
    if not isinstance(result, torch.Tensor):
        raise CheckFailed(
            f"Your function should return a torch.Tensor, but it returned {type(result).__name__}."
        )
    return result


def same_kind(reference: torch.Tensor) -> tuple[torch.dtype, ...]:
    """The dtypes a check accepts for an answer to ``reference``: any floating dtype for a floating
    reference (a check's reference may be computed in another precision than the answer), any
    integer dtype for an integer one, else the reference's own (bool, complex)."""
    if reference.is_floating_point():
        return FLOATING
    if reference.dtype in INTEGER:
        return INTEGER
    return (reference.dtype,)


def fresh_arguments(args: Sequence) -> tuple:
    """``args`` with every plain tensor, and every plain tensor in a list or tuple, replaced by a copy.

    What the student's function does to its arguments in place (zero ``v``, fill the mask with
    ``True``) then cannot reach the inputs the check computes its reference from. Other objects (a
    model, a cache the answer must append to) are passed as they are.
    """
    def fresh(value):
        if type(value) is torch.Tensor:
            return value.detach().clone().requires_grad_(value.requires_grad)
        if type(value) in (list, tuple) and any(type(item) is torch.Tensor for item in value):
            return type(value)(fresh(item) if type(item) is torch.Tensor else item for item in value)
        return value

    return tuple(fresh(arg) for arg in args)


def same(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """A tensor of ``expected``'s shape and device, of :func:`same_kind`'s dtypes, close to ``ATOL``
    (absolute) and 1e-4 (relative); never broadcast (:func:`~attn_course.checks.compare.matches`)."""
    return matches(got, expected, atol=ATOL, rtol=1e-4, dtype=same_kind(expected))


def first_difference(got: torch.Tensor, expected: torch.Tensor, axes: tuple[str, ...]) -> str:
    """Describe the first entry where two same-shape tensors differ."""
    bad = ~torch.isclose(got.double(), expected.double(), atol=ATOL, rtol=1e-4)
    index = tuple(int(i) for i in bad.nonzero()[0])
    names = axes[-len(index):] if len(axes) >= len(index) else ("",) * len(index)
    where = ", ".join(f"{name} {i}" if name else str(i) for name, i in zip(names, index))
    return (
        f"The first entry that differs is at [{where}]: expected {expected[index].item():.4f}, "
        f"got {got[index].item():.4f}."
    )


def check_shape(got: object, expected: torch.Tensor, what: str) -> None:
    """Raise :class:`CheckFailed` unless ``got`` is a plain tensor of ``expected``'s shape and device
    and of :func:`same_kind`'s dtypes; the message names what differs (both shapes, for a shape)."""
    problem = mismatch(got, expected, name=what, dtype=same_kind(expected))
    if problem is not None:
        raise CheckFailed(problem)


def diagnose(got: torch.Tensor, expected: torch.Tensor, mistakes: list[tuple[str, torch.Tensor]],
              axes: tuple[str, ...], what: str) -> None:
    """Raise with the first known mistake that reproduces ``got``, else the first difference."""
    check_shape(got, expected, what)             # before any arithmetic on the answer
    # A mistake can also show up as NaN (e.g. a row with nothing to attend to): compare as 0.
    finite_got = torch.nan_to_num(got, nan=0.0)
    for hint, mistaken in mistakes:
        if same(finite_got, mistaken):
            raise CheckFailed(hint)
    if torch.isnan(got).any() and not torch.isnan(expected).any():
        raise CheckFailed(f"{what} contains NaN where the reference has numbers. "
                          + first_difference(torch.nan_to_num(got, nan=float("inf")), expected, axes))
    raise CheckFailed(f"{what} differs from the reference. " + first_difference(got, expected, axes))



def check_close(got: object, expected: torch.Tensor, *, what: str = "Your answer", hint: str = "",
                rtol: float = 1e-4, atol: float = ATOL,
                mistakes: Sequence[tuple[str, torch.Tensor]] = ()) -> bool:
    """Compare an answer with an expected tensor; on failure name the mistake it matches, else say where.

    Args:
        got: the student's answer (a tensor, or something convertible such as a float).
        expected: the reference, computed independently of the answer.
        what: how to name the answer in the message.
        hint: a sentence that nudges towards the idea, shown when no known mistake matches.
        rtol, atol: tolerances as in ``torch.allclose``.
        mistakes: ``(message, answer)`` pairs: what each known wrong version would give. The
            first that matches ``got`` is reported instead of the generic hint, so a student who
            fixed one bug and has another is told about the one that remains.

    Returns:
        ``True`` when close.

    Raises:
        CheckFailed: with the matching mistake, the shape mismatch, or the first differing
            entry followed by the hint.

    Example:
        >>> expected = torch.tensor([0.5, 0.5])
        >>> check_close(torch.tensor([1.0, 1.0]), expected, mistakes=[("You forgot to normalise.", torch.ones(2))])
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You forgot to normalise.
    """
    if got is Ellipsis or got is None:
        raise CheckFailed(f"{what} is not there yet: replace the `...` with your code.")
    if not isinstance(got, torch.Tensor):
        try:
            got = torch.as_tensor(got, dtype=expected.dtype)
        except (TypeError, ValueError, RuntimeError):
            raise CheckFailed(f"{what} should be a tensor, got {type(got).__name__}.") from None
    if type(got) is torch.Tensor and got.numel() == expected.numel() == 1:
        got = got.reshape(expected.shape)       # a number is a number, whatever its brackets
    check_shape(got, expected, what)
    if not matches(got, expected, rtol=rtol, atol=atol, dtype=same_kind(expected)):
        for message, wrong in mistakes:
            if matches(got, wrong, rtol=rtol, atol=atol, dtype=same_kind(wrong)):
                raise CheckFailed(message)
        axes = ("",) * expected.dim()
        message = f"{what} is not right. " + (
            first_difference(got, expected, axes) if expected.dim() else
            f"Expected about {expected.item():.4g}, got {got.item():.4g}."
        )
        raise CheckFailed(message + (f" Hint: {hint}" if hint else ""))
    return True


# --- reading what a student's function returned (the multi-head checks) -----------------------------


def call_raw(where: str, fn: Callable, *args) -> object:
    """Call the student's function with :func:`call_student`'s crash handling, keep the raw result."""
    results = []

    def keep(*inner):
        results.append(fn(*inner))
        return torch.zeros(())

    call_student(where, keep, *args)
    return results[0]


def returned_tensors(result: object, count: int, names: str) -> tuple[torch.Tensor, ...]:
    """Insist on a tuple of ``count`` tensors; say what came back otherwise."""
    if result is Ellipsis or result is None:
        raise CheckFailed("Your function returns nothing yet: replace the `...` with your code.")
    if not isinstance(result, (tuple, list)) or len(result) != count:
        raise CheckFailed(f"Your function should return {count} tensors, ({names}), but it returned "
                          f"{type(result).__name__}" + (f" of length {len(result)}" if isinstance(result, (tuple, list))
                                                        else "") + ".")
    for name, item in zip(names.split(", "), result):
        if not isinstance(item, torch.Tensor):
            raise CheckFailed(f"Your {name} should be a torch.Tensor, but it is a {type(item).__name__}.")
    return tuple(result)


def crash_message(failed: CheckFailed) -> str | None:
    """What a crash in the student's function raised ("raised TypeError: ..."), or None if it did not crash."""
    text = str(failed)
    if not text.startswith("Your function raised"):
        return None
    return text[len("Your function "):].split(". It was called")[0]


def sentence_list(messages: list[str]) -> str:
    if len(messages) == 1:
        return messages[0]
    return f"{len(messages)} mistakes: " + " ".join(f"({i}) {m}" for i, m in enumerate(messages, start=1))
