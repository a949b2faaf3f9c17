"""Show a function's source in a notebook, where reading the code is the lesson."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import pathlib
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
    """``code`` without the docstring of any function or class in it (the other lines as written)."""
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


def _source_by_name(name: str) -> tuple[str, str, str]:
    """``(code, module, qualified name)`` of the function or class called ``name`` (dotted, from the
    package down), read from its module's file without importing the module."""
    parts = name.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module, path = ".".join(parts[:split]), parts[split:]
        try:
            spec = importlib.util.find_spec(module)     # imports the module's packages, not the module
        except (ImportError, ValueError):
            continue
        if spec is None or not str(spec.origin).endswith(".py"):
            continue
        text = pathlib.Path(spec.origin).read_text(encoding="utf-8")
        body = ast.parse(text).body
        for part in path:
            definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            node = next((node for node in body if isinstance(node, definitions) and node.name == part), None)
            if node is None:
                break
            body = node.body
        else:
            first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
            code = "".join(text.splitlines(keepends=True)[first - 1:node.end_lineno])
            return code, module, ".".join(path)
    raise ValueError(f"show_source: obj={name!r} names no function or class of a Python module")


def _excerpt(code: str, start: str | None, stop: str | None, title: str) -> str:
    """The lines of ``code`` from the first holding ``start`` to before the next holding ``stop``, dedented."""
    lines = code.splitlines(keepends=True)
    first = 0
    if start is not None:
        found = [i for i, line in enumerate(lines) if start in line]
        if not found:
            raise ValueError(f"show_source: start={start!r} is on no line of {title}")
        first = found[0]
    last = len(lines)
    if stop is not None:
        found = [i for i, line in enumerate(lines) if i > first and stop in line]
        if not found:
            raise ValueError(f"show_source: stop={stop!r} is on no line of {title} after start")
        last = found[0]
    return textwrap.dedent("".join(lines[first:last]))


def show_source(obj: object, *, docstring: bool = True, start: str | None = None,
                stop: str | None = None) -> _Source:
    """Return the source of a function, class or module for display in a notebook.

    With ``start`` and/or ``stop`` only an excerpt is shown, dedented: from the first line that contains
    ``start`` up to, not including, the first later line that contains ``stop`` (or to the end): a function's
    algorithm without its signature and input checks.

    Args:
        obj: a function, class, method or module, or a Triton kernel (``@triton.jit``, compiled or
            interpreted); or the dotted name of a function or class, read from its module's file
            without importing it (a Triton kernel where Triton is not installed).
        docstring: ``False`` leaves out the docstrings (of ``obj`` and of anything defined in it).
        start, stop: text on the excerpt's first line, and on the line after its last; ``None``: the top, the end.

    Returns:
        An object that Jupyter shows as highlighted code; ``repr`` gives plain text. An excerpt's title ends
        with ``(excerpt)``.

    Raises:
        TypeError: ``obj`` has no Python source (a builtin, a number, ...), or ``start`` or ``stop`` is not a str.
        ValueError: ``start`` or ``stop`` is on no line of the source, or a name that names no function or class.

    Example:
        >>> from attn_course import self_attention
        >>> print(repr(show_source(self_attention)).splitlines()[1].split("(")[0])
        def self_attention
        >>> from attn_course.core.attention import scaled_dot_product
        >>> len(repr(show_source(scaled_dot_product, docstring=False)).splitlines()) < 30
        True
        >>> from attn_course.flash import online_softmax
        >>> print(repr(show_source(online_softmax, start="for ", stop="return")).splitlines()[:2])
        ['# attn_course.flash.tiled.online_softmax (excerpt)', 'for start in range(0, scores.shape[-1], block_size):']
        >>> repr(show_source("attn_course.flash.tiled.online_softmax")) == repr(show_source(online_softmax))
        True
    """
    for argument, value in (("start", start), ("stop", stop)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"show_source: {argument} must be a string or None, got {type(value).__name__}")
    if not isinstance(docstring, bool):
        raise TypeError(f"show_source: docstring must be True or False, got {docstring!r}")
    if isinstance(obj, str):
        code, module, name = _source_by_name(obj)
    else:
        if type(obj).__module__.startswith("triton.") and inspect.isfunction(getattr(obj, "fn", None)):
            obj = obj.fn   # a Triton kernel wraps the Python function it was defined from
        try:
            code = inspect.getsource(obj)
        except (TypeError, OSError):
            raise TypeError(
                f"show_source: obj must be a Python function, class or module with source "
                f"code, or a dotted name, got {type(obj).__name__}"
            ) from None
        module = getattr(inspect.getmodule(obj), "__name__", "?")
        name = getattr(obj, "__qualname__", getattr(obj, "__name__", ""))
    if not docstring:
        code = _without_docstrings(code)
    title = f"{module}.{name}" if name and name != module else module
    if start is not None or stop is not None:
        return _Source(_excerpt(code, start, stop, title), f"{title} (excerpt)")
    return _Source(code, title)
