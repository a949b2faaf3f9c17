"""Comparing an answer with a reference, entry by entry, without being fooled by its form.

``torch.allclose`` broadcasts (an answer ``[1]`` against every entry, an empty one "all of nothing", a huge
one allocating), and a tensor subclass can answer ``True`` to anything. :func:`matches` first requires a
plain tensor of the reference's device, shape and dtype (:func:`mismatch` says which is wrong), and only
then compares values. The checks and every chapter's hidden tests compare with these two.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

__all__ = ["FLOATING", "INTEGER", "matches", "mismatch"]

#: The floating-point dtypes: pass ``dtype=FLOATING`` where an answer may keep any precision.
FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: The integer dtypes: pass ``dtype=INTEGER`` where an answer may count in any of them.
INTEGER = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)

# Tensors a comparison may trust: a subclass (other than a Parameter, which only marks a weight)
# can override __torch_function__ and so report any shape, or make torch.allclose return True.
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _dtypes(where: str, dtype: object, reference: torch.Tensor) -> tuple[torch.dtype, ...]:
    if dtype is None:
        return (reference.dtype,)
    if isinstance(dtype, torch.dtype):
        return (dtype,)
    if isinstance(dtype, Sequence) and dtype and all(isinstance(d, torch.dtype) for d in dtype):
        return tuple(dtype)
    raise TypeError(f"{where}: dtype must be None, a torch.dtype or a sequence of them, got {dtype!r}")


def _reference(where: str, reference: object) -> torch.Tensor:
    if type(reference) not in _PLAIN:
        raise TypeError(f"{where}: reference must be a torch.Tensor, got {type(reference).__name__}")
    return reference


def _tolerance(where: str, name: str, value: object) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _dtype_text(dtypes: tuple[torch.dtype, ...]) -> str:
    return " or ".join(str(d) for d in dtypes)


def mismatch(answer: object, reference: torch.Tensor, *, name: str = "Your answer",
             dtype: torch.dtype | Sequence[torch.dtype] | None = None) -> str | None:
    r"""Why ``answer`` cannot be compared with ``reference`` entry by entry, or ``None`` if it can: it must be
    a plain ``torch.Tensor`` (or ``Parameter``), strided, of the reference's device, shape and an allowed dtype.

    Args:
        answer: what the student's function returned (anything).
        reference: the right answer, a tensor.
        name: how the sentence names the answer, capitalised (``"Your softmax's output"``).
        dtype: the dtypes the answer may have: ``None`` (default) for the reference's own, one
            dtype, or a sequence such as :data:`FLOATING`.

    Returns:
        A sentence naming the first difference (type, device, layout, shape, then dtype), or ``None``.

    Raises:
        TypeError: ``reference`` not a tensor, ``name`` not a string, or a ``dtype`` that is not one.

    Example:
        >>> mismatch(torch.ones(4, 1), torch.zeros(4))
        'Your answer has shape [4, 1] but should have shape [4].'
    """
    where = "mismatch"
    reference = _reference(where, reference)
    if not isinstance(name, str):
        raise TypeError(f"{where}: name must be a str, got {type(name).__name__}")
    allowed = _dtypes(where, dtype, reference)
    if not isinstance(answer, torch.Tensor):
        return f"{name} should be a torch.Tensor, but it is a {type(answer).__name__}."
    if type(answer) not in _PLAIN:
        return (f"{name} is a {type(answer).__name__}, a subclass of torch.Tensor; return a plain "
                f"torch.Tensor.")
    if answer.layout != torch.strided or answer.is_meta:
        return f"{name} is not an ordinary tensor (layout {answer.layout}, device {answer.device}); return a dense one."
    if answer.device != reference.device:
        return f"{name} is on {answer.device} but should be on {reference.device}."
    if answer.shape != reference.shape:
        if answer.numel() == 0 and reference.numel() != 0:
            return (f"{name} is empty (shape {list(answer.shape)}) but should have shape "
                    f"{list(reference.shape)}.")
        return f"{name} has shape {list(answer.shape)} but should have shape {list(reference.shape)}."
    if answer.dtype not in allowed:
        return f"{name} has dtype {answer.dtype} but should have dtype {_dtype_text(allowed)}."
    return None


def matches(answer: object, reference: torch.Tensor, *, atol: float, rtol: float = 0.0,
            equal_nan: bool = False, dtype: torch.dtype | Sequence[torch.dtype] | None = None) -> bool:
    r"""``True`` when ``answer`` is a tensor like ``reference`` whose every entry is close to it.

    :math:`|\text{answer} - \text{reference}| \le \text{atol} + \text{rtol} \cdot |\text{reference}|`, as
    ``torch.allclose``, but only after :func:`mismatch` finds nothing: it never broadcasts. The comparison
    runs in the reference's dtype; integer and boolean references are compared exactly; NaN is ``False``
    unless ``equal_nan`` and the reference has NaN there.

    Args:
        answer: what the student's function returned (anything: a tuple, a float, is ``False``).
        reference: the right answer, computed before the answer was called.
        atol: absolute tolerance (keyword, required: each test says how close is close).
        rtol: relative tolerance; default 0.
        equal_nan: count NaN in both as equal.
        dtype: the dtypes the answer may have (see :func:`mismatch`); default the reference's.

    Returns:
        ``True`` or ``False`` (a plain ``bool``, as an otter test needs).

    Raises:
        TypeError: ``reference`` not a tensor, or ``dtype`` not a dtype.
        ValueError: a tolerance that is negative, NaN or infinite.

    Example:
        >>> matches(torch.ones(2**18, 1, 1, 1, 1), torch.ones(4, 4), atol=1e-6)     # no broadcasting
        False
        >>> matches(torch.empty(0), torch.ones(3), atol=1e-6)
        False
    """
    where = "matches"
    atol, rtol = _tolerance(where, "atol", atol), _tolerance(where, "rtol", rtol)
    if mismatch(answer, reference, dtype=dtype) is not None:
        return False
    answer, reference = answer.detach(), reference.detach()
    if answer.dtype != reference.dtype:
        answer = answer.to(reference.dtype)
    if reference.dtype == torch.bool or not (reference.is_floating_point() or reference.is_complex()):
        return bool(torch.equal(answer, reference))
    return bool(torch.allclose(answer, reference, rtol=rtol, atol=atol, equal_nan=equal_nan))
