"""Show a function's source in a notebook, where reading the code is the lesson."""

from __future__ import annotations

import ast
import inspect
import textwrap

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


def _without_docstrings(code: str) -> str:
    """``code`` with the docstring of every function and class in it removed (lines kept as written)."""
    tree = ast.parse(textwrap.dedent(code))
    drop: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                drop.update(range(first.lineno, first.end_lineno + 1))   # 1-based, inclusive
    lines = code.splitlines(keepends=True)
    return "".join(line for number, line in enumerate(lines, start=1) if number not in drop)


def show_source(obj: object, *, docstring: bool = True) -> _Source:
    """Return the source of a function, class or module for display in a notebook.

    Args:
        obj: a function, class, method or module from any importable module, or a Triton
            kernel (``@triton.jit``, compiled or interpreted).
        docstring: ``False`` leaves out the docstrings (of ``obj`` and of anything defined in
            it), so that a listing shows the code alone.

    Returns:
        An object that Jupyter shows as highlighted code; ``repr`` gives plain text.

    Raises:
        TypeError: ``obj`` has no Python source (a builtin, a number, ...).

    Example:
        >>> from attn_course import self_attention
        >>> print(repr(show_source(self_attention)).splitlines()[1])
        def self_attention(
        >>> from attn_course.core.attention import scaled_dot_product
        >>> len(repr(show_source(scaled_dot_product, docstring=False)).splitlines()) < 30
        True
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
    if not isinstance(docstring, bool):
        raise TypeError(f"show_source: docstring must be True or False, got {docstring!r}")
    if not docstring:
        code = _without_docstrings(code)
    module = getattr(inspect.getmodule(obj), "__name__", "?")
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", ""))
    title = f"{module}.{name}" if name and name != module else module
    return _Source(code, title)
