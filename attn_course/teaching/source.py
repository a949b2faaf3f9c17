"""Show a function's source in a notebook, where reading the code is the lesson."""

from __future__ import annotations

import inspect

__all__ = ["show_source"]


class _Source:
    """Source code that renders highlighted in Jupyter and as plain text elsewhere."""

    def __init__(self, code: str, title: str):
        self.code = code
        self.title = title

    def __repr__(self) -> str:
        return f"# {self.title}\n{self.code}"

    def _repr_markdown_(self) -> str:
        return f"`{self.title}`\n\n```python\n{self.code}```"


def show_source(obj: object) -> _Source:
    """Return the source of a function, class or module for display in a notebook.

    Args:
        obj: a function, class, method or module from any importable module, or a Triton
            kernel (``@triton.jit``, compiled or interpreted).

    Returns:
        An object that Jupyter shows as highlighted code; ``repr`` gives plain text.

    Raises:
        TypeError: ``obj`` has no Python source (a builtin, a number, ...).

    Example:
        >>> from attn_course import self_attention
        >>> print(repr(show_source(self_attention)).splitlines()[1])
        def self_attention(
    """
    if type(obj).__module__.startswith("triton.") and inspect.isfunction(getattr(obj, "fn", None)):
        obj = obj.fn   # a Triton kernel wraps the Python function it was defined from
    try:
        code = inspect.getsource(obj)
    except (TypeError, OSError):
        raise TypeError(
            f"show_source: obj must be a Python function, class or module with source "
            f"code, got {type(obj).__name__}"
        ) from None
    module = getattr(inspect.getmodule(obj), "__name__", "?")
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", ""))
    title = f"{module}.{name}" if name and name != module else module
    return _Source(code, title)
