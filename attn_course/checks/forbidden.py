"""What an exercise's answer may not call, and the guard that sees it call it anyway.

Each rule is a :class:`Forbidden`: a name the student reads in the statement, and why. :func:`watch_calls`
runs the answer under a ``TorchFunctionMode`` (every PyTorch function and tensor method) and a profile hook
(the course's Python functions, Python's and NumPy's random generators). The rules are names, not function
objects, so that the grader can send them into the sandbox where a submission runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import random
import sys
from collections.abc import Iterator, Sequence

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["AUTOGRAD", "CHECKS_CODE", "RANDOM", "Forbidden", "forbid", "resolve_name", "violation", "watch_calls"]

#: The special name of a rule against deriving a gradient with autograd.
AUTOGRAD = "autograd"
#: The special name of a rule against random numbers, from any generator.
RANDOM = "random numbers"
#: The special name of the rule every answer keeps: it runs none of the checks' or measurements' code
#: (which holds the references the checks compare with).
CHECKS_CODE = "the checks' own code"
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHECKS_CODE_FOLDERS = tuple(os.path.join(_PACKAGE, folder) + os.sep for folder in ("checks", "measure"))
# The checks' side: their code, and the grader's (installed beside the package), which reads answers with it.
_CHECKS_SIDE = (*_CHECKS_CODE_FOLDERS, os.path.join(os.path.dirname(_PACKAGE), "attn_course_grading") + os.sep)

# What one rule stands for: the same operation under its other spellings.
_SPELLINGS = {
    "torch.softmax": ("torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax",
                      "torch.special.softmax", "torch.nn.functional.log_softmax", "torch.log_softmax",
                      "torch.Tensor.log_softmax"),
    "torch.nn.functional.scaled_dot_product_attention": ("torch.nn.functional.scaled_dot_product_attention",),
    "torch.nn.functional.rms_norm": ("torch.nn.functional.rms_norm",),
    "torch.nn.functional.layer_norm": ("torch.nn.functional.layer_norm",),
}
_AUTOGRAD_CALLS = ("torch.autograd.grad", "torch.autograd.backward", "torch.Tensor.backward",
                   "torch.Tensor.requires_grad_", "torch.autograd.functional.jacobian",
                   "torch.autograd.functional.vjp")
_AUTOGRAD_PYTHON = ("torch.func.grad", "torch.func.vjp", "torch.func.jacrev", "torch.func.jacfwd",
                    "torch.autograd.grad_mode.enable_grad.__enter__",
                    "torch.autograd.grad_mode.set_grad_enabled.__init__")
_RANDOM_CALLS = ("torch.rand", "torch.randn", "torch.randint", "torch.randperm", "torch.rand_like",
                 "torch.randn_like", "torch.randint_like", "torch.normal", "torch.bernoulli", "torch.multinomial",
                 "torch.poisson", "torch.Tensor.uniform_", "torch.Tensor.normal_", "torch.Tensor.random_",
                 "torch.Tensor.bernoulli_", "torch.Tensor.exponential_", "torch.Tensor.geometric_",
                 "torch.Tensor.cauchy_", "torch.Tensor.log_normal_", "torch.nn.functional.dropout")


@dataclasses.dataclass(frozen=True)
class Forbidden:
    """One thing an answer may not call.

    Attributes:
        name: a dotted name, or :data:`AUTOGRAD`, or :data:`RANDOM`. A PyTorch function stands for its other
            spellings too (``torch.softmax`` for ``F.softmax``); a class for every method it defines.
        why: why the exercise forbids it, in the words of its statement.
    """

    name: str
    why: str

    def __post_init__(self) -> None:
        for field in ("name", "why"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise TypeError(f"Forbidden: {field} must be a non-empty str, got {value!r}")


def forbid(why: str, *names: str) -> tuple[Forbidden, ...]:
    """One :class:`Forbidden` per name, all for the same reason.

    Example:
        >>> [rule.name for rule in forbid("write it yourself", "torch.softmax", "torch.nn.functional.rms_norm")]
        ['torch.softmax', 'torch.nn.functional.rms_norm']
    """
    return tuple(Forbidden(name, why) for name in names)


def resolve_name(dotted: str) -> object | None:
    """The object a dotted name names (None where it does not exist in this PyTorch)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:
                value = getattr(value, attribute)
        except AttributeError:
            return None
        return value
    return None


def is_checks_code(filename: str) -> bool:
    """Whether a code object's file is the checks' or the measurements' (the watch's own file aside)."""
    return filename.startswith(_CHECKS_CODE_FOLDERS) and filename != __file__


def _targets(rules: Sequence[Forbidden]) -> tuple[dict, dict, dict, bool]:
    """(torch functions -> rule, code objects -> (name shown, rule), a core's code -> its public function's
    (a call from there is seen already), whether random generators are watched)."""
    torch_functions: dict[object, Forbidden] = {}
    python_code: dict[object, tuple[str, Forbidden]] = {}
    cores: dict[object, object] = {}
    watch_random = False
    for rule in rules:
        if rule.name == CHECKS_CODE:
            continue
        if rule.name == AUTOGRAD:
            torch_names, python_names = _AUTOGRAD_CALLS, _AUTOGRAD_PYTHON
        elif rule.name == RANDOM:
            torch_names, python_names, watch_random = _RANDOM_CALLS, (), True
        elif rule.name.startswith("torch."):
            torch_names, python_names = _SPELLINGS.get(rule.name, (rule.name,)), ()
        else:
            # A course function's unchecked core (the same name with an underscore, beside it) does its work too.
            module, _, function = rule.name.rpartition(".")
            core = f"{module}._{function}"
            torch_names, python_names = (), (rule.name, core) if resolve_name(core) is not None else (rule.name,)
        for name in torch_names:
            found = resolve_name(name)
            if found is not None:
                torch_functions.setdefault(found, rule)
        for name in python_names:
            found = resolve_name(name)
            if found is None and not name.startswith("torch."):
                raise ValueError(f"Forbidden: no function {name!r} to watch")
            for shown, code in _code_of(found):
                python_code.setdefault(code, (shown, rule))
        if len(python_names) == 2:
            (_, public), (_, core) = (_code_of(resolve_name(python_names[0]))[0],
                                      _code_of(resolve_name(python_names[1]))[0])
            cores[core] = public
    return torch_functions, python_code, cores, watch_random


def _code_of(found: object) -> list[tuple[str, object]]:
    """(the name a message shows, code object) of what a rule watches: a function, or every method a class
    defines itself."""
    if isinstance(found, type):
        members = [(name, getattr(member, "fget", member)) for name, member in vars(found).items()
                   if not isinstance(member, type)]
        return [(f"{found.__name__}.{name}", code) for name, member in members for _, code in _code_of(member)]
    function = getattr(found, "__func__", found)
    code = getattr(function, "__code__", None)
    if code is not None and code.co_filename == contextlib.__file__ and hasattr(function, "__wrapped__"):
        # A @contextlib.contextmanager function's code is a helper that every such function shares (PyTorch's
        # own dispatch calls one): watch its generator instead, which runs when the block is entered.
        code = function.__wrapped__.__code__
    return [(getattr(found, "__qualname__", code.co_name), code)] if code is not None else []


class _TorchCalls(TorchFunctionMode):
    """Records the forbidden PyTorch functions and tensor methods called inside it."""

    def __init__(self, targets: dict[object, Forbidden], seen: list[tuple[str, Forbidden]]):
        super().__init__()
        self.targets, self.seen = targets, seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        rule = self.targets.get(func)
        if rule is not None:
            self.seen.append((_display_name(func), rule))
        return func(*args, **(kwargs or {}))


def _display_name(func: object) -> str:
    owner = getattr(func, "__objclass__", None)       # a tensor method's class (Tensor or its C base)
    if (isinstance(owner, type) and issubclass(torch.Tensor, owner)) or \
            getattr(func, "__qualname__", "").startswith("Tensor."):
        return f"Tensor.{func.__name__}"
    module = getattr(func, "__module__", None) or "torch"
    module = {"torch.nn.functional": "F", "torch._C._nn": "F", "torch._C._special": "torch.special"}.get(module, module)
    return f"{module}.{getattr(func, '__name__', func)}"


def _is_random_generator_call(function: object) -> bool:
    owner = getattr(function, "__self__", None)
    if isinstance(owner, random.Random) or owner is random:
        return True
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(owner, (numpy.random.Generator, numpy.random.RandomState)):
        return True
    return False


@contextlib.contextmanager
def watch_calls(rules: Sequence[Forbidden]) -> Iterator[list[tuple[str, Forbidden]]]:
    """Record every call of what ``rules`` forbid, made inside the block.

    Yields:
        A list that fills with ``(what was called, the rule)`` pairs, in the order of the calls.

    Raises:
        TypeError: ``rules`` not a sequence of :class:`Forbidden`.
        ValueError: a rule names a course function that does not exist.

    Example:
        >>> rules = [Forbidden("torch.softmax", "the exercise is to write softmax")]
        >>> with watch_calls(rules) as seen:
        ...     _ = torch.tensor([1.0, 2.0]).softmax(dim=0)
        >>> [called for called, _ in seen]
        ['Tensor.softmax']
    """
    if isinstance(rules, (str, bytes)) or not all(isinstance(rule, Forbidden) for rule in rules):
        raise TypeError(f"watch_calls: rules must be a sequence of Forbidden, got {rules!r}")
    if not rules:                      # nothing to watch: no mode, no hook, nothing slowed down
        yield []
        return
    torch_functions, python_code, cores, watch_random = _targets(rules)
    random_rule = next((rule for rule in rules if rule.name == RANDOM), None)
    checks_rule = next((rule for rule in rules if rule.name == CHECKS_CODE), None)
    seen: list[tuple[str, Forbidden]] = []

    def profile(frame, event, argument):
        if event == "call":
            found = python_code.get(frame.f_code)
            if found is not None and (frame.f_code not in cores or frame.f_back.f_code is not cores[frame.f_code]):
                seen.append(found)
            elif checks_rule is not None and is_checks_code(frame.f_code.co_filename) and \
                    (frame.f_back is None or not frame.f_back.f_code.co_filename.startswith(_CHECKS_SIDE)):
                # entered from the answer's side: its own call (a check's or the grader's call of it is not)
                name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
                seen.append((f"{frame.f_globals.get('__name__')}.{name}", checks_rule))
        elif event == "c_call" and watch_random and _is_random_generator_call(argument):
            seen.append((f"{type(argument.__self__).__module__}.{argument.__name__}", random_rule))

    # NumPy's generators are compiled (Cython), out of the profile hook's sight: its global one is
    # read before and after instead. A NumPy Generator object of the answer's own is not seen.
    numpy = sys.modules.get("numpy") if watch_random else None
    numpy_state = _numpy_global_state(numpy)
    previous = sys.getprofile()
    sys.setprofile(profile if python_code or watch_random or checks_rule else previous)
    try:
        with _TorchCalls(torch_functions, seen):
            yield seen
    finally:
        sys.setprofile(previous)
        if numpy is not None and _numpy_global_state(numpy) != numpy_state:
            seen.append(("numpy.random (its global generator)", random_rule))


def _numpy_global_state(numpy) -> tuple | None:
    if numpy is None:
        return None
    name, keys, position, *_ = numpy.random.get_state()
    return name, keys.tobytes(), position


def violation(where: str, seen: Sequence[tuple[str, Forbidden]]) -> str | None:
    """The diagnosis of the first forbidden call in ``seen`` (from :func:`watch_calls`), or None.

    Example:
        >>> violation("check_softmax", [("torch.softmax", Forbidden("torch.softmax", "write it from exp and sum"))])
        'check_softmax: your answer calls torch.softmax, which this exercise forbids: write it from exp and sum'
    """
    if not seen:
        return None
    called, rule = seen[0]
    return f"{where}: your answer calls {called}, which this exercise forbids: {rule.why}"
