"""What every exercise check shares: calling the student's function safely, and naming the mistake.

A check calls the answer with :func:`call_answer` (copies of its inputs, a crash or a forbidden call
turned into a diagnosis), then :func:`diagnose` compares it with the reference: the first known
mistake that reproduces it is named, else the first entry that differs.
"""

from __future__ import annotations

import numbers
import operator
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

import torch

from attn_course.checks.answer_source import source_violations
from attn_course.checks.compare import FLOATING, INTEGER, matches, mismatch
from attn_course.checks.forbidden import CHECKS_CODE, Forbidden, violation, watch_calls
from attn_course.flash.triton_mode import triton_installed

__all__ = [
    "ATOL", "NOTHING_YET", "CheckFailed", "call_answer", "call_student", "output_of", "watched", "same",
    "first_difference", "check_shape", "name_mistake", "diagnose", "check_close", "show_diagnosis_only",
    "returned_tensors", "number", "crash_message", "sentence_list", "same_kind", "fresh_arguments",
    "triton_missing",
]

ATOL = 1e-5
NOTHING_YET = "Your function returns nothing yet: replace the `...` with your code."


class CheckFailed(AssertionError):
    """An exercise's answer is wrong; the message says how."""


def triton_missing(where: str) -> bool:
    """Whether Triton is missing here, so that a check of a Triton kernel cannot run; if so it says so.

    Triton ships for Linux only. A check of a student's kernel then skips with this sentence rather
    than crash the chapter (the grader refuses to grade such a chapter where Triton is missing).
    """
    if triton_installed():
        return False
    print(f"{where}: this exercise is a Triton kernel, and Triton is not installed here (it ships for Linux "
          "only): nothing was checked. Run the chapter on Linux or Google Colab to check your kernel.")
    return True


def show_diagnosis_only(shell: object = None) -> bool:
    """In a notebook, show a failing check as its diagnosis alone, without the traceback.

    A chapter's exercise cell calls it: from then on a :class:`CheckFailed` is displayed as IPython's
    one-line error, ``CheckFailed: <what is wrong>`` (the traceback would only show the checks' insides);
    every other exception keeps its traceback. It uses ``InteractiveShell.set_custom_exc``.

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


#: The rule every answer keeps, whatever its exercise forbids: it runs none of the checks' code.
CHECKS_RULE = Forbidden(CHECKS_CODE, "the checks' and measurements' code holds the references your answer is "
                                     "compared with; write the answer yourself")


def _checks_function(fn: object) -> str | None:
    """The dotted name of ``fn`` (or of the function a ``functools.partial`` or method wraps) when it is one of
    the checks' or measurements' own functions or classes."""
    target = getattr(fn, "func", fn)
    target = getattr(target, "__func__", target)
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(name, str)) or \
            not module.startswith(("attn_course.checks.", "attn_course.measure.")):
        return None
    owner = sys.modules.get(module)
    for part in name.split("."):
        owner = getattr(owner, part, None)
    return f"{module}.{name}" if owner is target else None


def call_answer(where: str, fn: Callable, *args, described: str | None = None,
                forbidden: Sequence[Forbidden] = ()) -> object:
    """Call the student's function with copies of ``args`` and return what it returns, never crashing the check.

    A crash becomes a :class:`CheckFailed` naming the exception and how the function was called
    (``described``, or the shapes of the arguments); ``...`` or None becomes "returns nothing yet"; a
    call of what ``forbidden`` forbids fails the check, named. An answer that runs elsewhere (the
    grader's proxy, which has ``call_watching``) is watched where it runs, under the same rules.

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
    own = _checks_function(fn)
    if own:                                    # handed in as it is: the profile hook sees no call into it
        raise CheckFailed(f"{where}: your answer is {own}, {CHECKS_RULE.name}: {CHECKS_RULE.why}")
    forbidden = (*forbidden, CHECKS_RULE)
    args = fresh_arguments(args)
    seen: list = []
    try:
        watched_elsewhere = getattr(fn, "call_watching", None)
        if forbidden and watched_elsewhere is not None:
            result, seen = watched_elsewhere(list(forbidden), *args)
        else:
            with watch_calls(forbidden) as seen:
                result = fn(*args)
            # In a notebook, then the answer's source (IPython's input history): what a thread or a
            # switched-off watch hid while it ran is written there.
            namespace = getattr(fn, "__globals__", {})
            history = namespace.get("In") if not seen else None
            if isinstance(history, list):
                modules = {name: value.__name__ for name, value in namespace.items() if isinstance(value, ModuleType)}
                seen = source_violations([cell for cell in history if isinstance(cell, str)],
                                         getattr(fn, "__name__", ""), forbidden, modules)
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
        raise CheckFailed(NOTHING_YET)
    return result


class _Watched:
    """An answer and the rules it is called under (what :func:`watched` returns)."""

    def __init__(self, where: str, fn: Callable, forbidden: Sequence[Forbidden]):
        self.where, self.fn, self.forbidden = where, fn, tuple(forbidden)

    def __call__(self, *args):
        return call_answer(self.where, self.fn, *args, forbidden=self.forbidden)


def watched(where: str, fn: Callable, forbidden: Sequence[Forbidden]) -> Callable:
    """``fn`` called under an exercise's rules: every call goes through :func:`call_answer` with
    ``forbidden`` (passed to :func:`call_answer` itself, with that call's ``described``).

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"{where}: expected your function, got {type(fn).__name__}")
    return _Watched(where, fn, forbidden)


def output_of(result: object) -> torch.Tensor:
    """What a function returned, ``(output, weights)`` unwrapped to the output, insisting on a tensor."""
    if isinstance(result, tuple):
        result = result[0]
    if result is Ellipsis or result is None:
        raise CheckFailed(NOTHING_YET)
    if not isinstance(result, torch.Tensor):
        raise CheckFailed(f"Your function should return a torch.Tensor, but it returned {type(result).__name__}.")
    return result


def call_student(where: str, fn: Callable, *args) -> torch.Tensor:
    """Call the student's function (:func:`call_answer`) and return its :func:`output_of`."""
    return output_of(call_answer(where, fn, *args))


def same_kind(reference: torch.Tensor) -> tuple[torch.dtype, ...]:
    """The dtypes accepted for an answer to ``reference``: any floating one for a floating reference, any
    integer one for an integer one, else the reference's own."""
    if reference.is_floating_point():
        return FLOATING
    if reference.dtype in INTEGER:
        return INTEGER
    return (reference.dtype,)


def fresh_arguments(args: Sequence) -> tuple:
    """``args`` with every plain tensor, also in a list or tuple, copied: what the answer does to them in
    place cannot reach the check's inputs. Other objects (a model, a cache) are passed as they are."""
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
    """Raise :class:`CheckFailed` unless ``got`` is a plain tensor of ``expected``'s shape and device and of
    :func:`same_kind`'s dtypes; the message names what differs."""
    problem = mismatch(got, expected, name=what, dtype=same_kind(expected))
    if problem is not None:
        raise CheckFailed(problem)


def name_mistake(got: object, mistakes: Sequence[tuple[str, object]], close: Callable = operator.eq) -> None:
    """Raise :class:`CheckFailed` with the message of the first ``(message, wrong answer)`` of ``mistakes``
    that ``got`` is ``close`` to (default ``==``); return if none is."""
    for message, wrong in mistakes:
        if close(got, wrong):
            raise CheckFailed(message)


def diagnose(got: object, expected: torch.Tensor, mistakes: Sequence[tuple[str, torch.Tensor]],
             axes: tuple[str, ...], what: str) -> None:
    """Return when ``got`` is :func:`same` as ``expected``; else raise naming what is wrong.

    Args:
        got: the answer; its type, shape and dtype are judged first (:func:`check_shape`).
        expected: the reference.
        mistakes: ``(message, what that mistake gives)`` pairs; the first that matches is named (NaN in
            the answer counting as 0).
        axes: names of ``expected``'s dimensions, for the first entry that differs.
        what: how to name the answer (``"Your output"``).

    Raises:
        CheckFailed: with the shape, the matching mistake, NaN, or the first entry that differs.
    """
    check_shape(got, expected, what)             # before any arithmetic on the answer
    if same(got, expected):
        return
    # A mistake can also show up as NaN (e.g. a row with nothing to attend to): compare as 0.
    name_mistake(torch.nan_to_num(got, nan=0.0), mistakes, same)
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
        mistakes: ``(message, answer)`` pairs, what each known wrong version would give; the first that
            matches is reported instead of the hint.

    Returns:
        ``True`` when close.

    Raises:
        CheckFailed: with the matching mistake, the shape mismatch, or the first differing entry and the hint.

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
        name_mistake(got, mistakes, lambda got, wrong: matches(got, wrong, rtol=rtol, atol=atol,
                                                               dtype=same_kind(wrong)))
        axes = ("",) * expected.dim()
        message = f"{what} is not right. " + (
            first_difference(got, expected, axes) if expected.dim() else
            f"Expected about {expected.item():.4g}, got {got.item():.4g}."
        )
        raise CheckFailed(message + (f" Hint: {hint}" if hint else ""))
    return True


# --- reading what a student's function returned -------------------------------------------------------


def returned_tensors(result: object, count: int, names: str) -> tuple[torch.Tensor, ...]:
    """Insist on a tuple of ``count`` tensors (``names``, comma-separated); say what came back otherwise."""
    if not isinstance(result, (tuple, list)) or len(result) != count:
        raise CheckFailed(f"Your function should return {count} tensors, ({names}), but it returned "
                          f"{type(result).__name__}" + (f" of length {len(result)}" if isinstance(result, (tuple, list))
                                                        else "") + ".")
    for name, item in zip(names.split(", "), result):
        if not isinstance(item, torch.Tensor):
            raise CheckFailed(f"Your {name} should be a torch.Tensor, but it is a {type(item).__name__}.")
    return tuple(result)


def number(value: object, not_a_number: str) -> numbers.Real:
    """``value`` as a plain number (a one-element tensor's too), else :class:`CheckFailed` with
    ``not_a_number``, its ``{type}`` the type that came instead."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise CheckFailed(not_a_number.format(type=type(value).__name__))
    return value


def crash_message(failed: CheckFailed) -> str | None:
    """What a crash in the student's function raised ("raised TypeError: ..."), or None if it did not crash."""
    text = str(failed)
    if not text.startswith("Your function raised"):
        return None
    return text[len("Your function "):].split(". It was called")[0]


def sentence_list(messages: list[str]) -> str:
    """One message, or "N mistakes: (1) ... (2) ..."."""
    if len(messages) == 1:
        return messages[0]
    return f"{len(messages)} mistakes: " + " ".join(f"({i}) {m}" for i, m in enumerate(messages, start=1))
