"""What an answer's source calls: an exercise's rules decided from the code, not from watching it run.

:func:`~attn_course.checks.forbidden.watch_calls` sees what an answer calls while it runs, in the process
it runs in, where the answer can hide from it (a thread, a switched-off profile hook, another spelling
of the same operation). :func:`source_violations` reads the notebook's cells instead: the answer's own
definition, the functions and classes of the notebook it uses, and the statements that bind the
globals it reads (so that a value computed at cell time by a forbidden call counts too). It finds

- every spelling of what a rule forbids: ``torch.softmax`` stands for ``F.softmax``, ``x.softmax``,
  ``torch._softmax``, ``torch.ops.aten._softmax``, ``softmin`` and the ``nn`` modules; autograd for
  ``backward``, ``torch.autograd`` (forward mode included) and ``torch.func``; a course function for
  itself under any import path and its unchecked core;
- the ways around a check that no exercise's answer needs (:data:`ESCAPE`): threads and processes,
  ``sys`` and ``gc``, ``torch._C`` and ``torch.ops``, code built at run time (``eval``, ``exec``,
  ``__import__``, ``importlib``, ``getattr`` with a computed name), frames and dunder internals, and
  the course's checks and measurements, which hold the references.

The grader runs it on the submitted source (outside the student's process); in a notebook a check
runs it on IPython's input history.
"""

from __future__ import annotations

import ast
import builtins
import functools
from collections.abc import Iterable, Sequence

from attn_course.checks.forbidden import AUTOGRAD, CHECKS_CODE, RANDOM, Forbidden, resolve_name

__all__ = ["ESCAPE", "source_violations", "definition_source"]

#: The rule every answer keeps, whatever its exercise forbids.
ESCAPE = Forbidden("a way around the checks", "no exercise's answer needs it, and what runs through it (another "
                                                "thread or process, a switched-off watch, code built at run time, "
                                                "the checks' own references) is out of the check's sight")
_ESCAPE_MODULES = ("threading", "_thread", "multiprocessing", "concurrent", "subprocess", "signal", "gc", "ctypes",
                   "importlib", "inspect", "builtins", "sys", "os", "types", "pickle", "marshal", "runpy", "code",
                   "asyncio", "torch._C", "torch.ops", "torch._dynamo", "torch.library", "attn_course.checks",
                   "attn_course.measure", "attn_course_grading")
_ESCAPE_CALLS = {"eval", "exec", "compile", "__import__", "globals", "locals", "vars", "breakpoint", "setattr",
                 "delattr"}
_ESCAPE_ATTRIBUTES = {"__globals__", "__code__", "__closure__", "__builtins__", "__subclasses__", "__mro__",
                      "__bases__", "__dict__", "__getattribute__", "__getattr__", "__import__", "__loader__",
                      "__self__", "__func__", "__wrapped__", "f_globals", "f_locals", "f_back", "gi_frame", "tb_frame",
                      "cr_frame"}
# The other spellings of a PyTorch operation, by a piece of the name: any part of a dotted name, its
# leading underscores stripped, that contains one of these stands for the rule's operation.
_STEMS = {"softmax": ("softmax", "softmin"), "scaled_dot_product_attention": (
    "scaled_dot_product", "flash_attention", "efficient_attention", "multi_head_attention", "multiheadattention",
    "cudnn_attention"), "rms_norm": ("rms_norm", "rmsnorm"), "layer_norm": ("layer_norm", "layernorm")}
_AUTOGRAD_PARTS = {"autograd", "backward", "grad", "requires_grad", "requires_grad_", "enable_grad",
                   "set_grad_enabled", "forward_ad", "jacobian", "hessian", "vjp", "jvp", "jacrev", "jacfwd"}
_RANDOM_PARTS = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal",
                 "bernoulli", "multinomial", "poisson", "uniform_", "normal_", "random_", "bernoulli_", "exponential_",
                 "geometric_", "cauchy_", "log_normal_", "dropout", "Generator", "manual_seed", "seed"}


def _parse(cell: str) -> ast.Module | None:
    try:
        from IPython.core.inputtransformer2 import TransformerManager  # a cell's magics become Python

        cell = TransformerManager().transform_cell(cell)
    except ImportError:
        pass
    try:
        return ast.parse(cell)
    except SyntaxError:
        return None


def _bound(node: ast.stmt) -> set[str]:
    """The names a top-level statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return {target.id for target in ast.walk(node)
            if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store)}


def _imports(nodes: Iterable[ast.AST]) -> dict[str, str]:
    """``{local name: dotted name}`` for every import in ``nodes`` (at any depth)."""
    aliases = {}
    for node in nodes:
        for inner in ast.walk(node):
            if isinstance(inner, ast.Import):
                for alias in inner.names:
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                        alias.name.split(".")[0]
            elif isinstance(inner, ast.ImportFrom) and inner.module and not inner.level:
                for alias in inner.names:
                    aliases[alias.asname or alias.name] = f"{inner.module}.{alias.name}"
    return aliases


def _dotted(node: ast.AST, aliases: dict[str, str]) -> tuple[str | None, list[str]]:
    """``(the dotted name it resolves to or None, its attribute names)`` of a name or attribute chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    parts.reverse()
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *parts]), parts
    return None, parts


def _is_under(name: str, modules: Iterable[str]) -> str | None:
    return next((module for module in modules if name == module or name.startswith(module + ".")), None)


def _matches(name: str | None, parts: list[str], rule: Forbidden, resolved: object) -> bool:
    """Whether a reference (its dotted name where known, its attribute names) is a spelling of ``rule``."""
    pieces = [piece.lstrip("_").lower() for piece in ([*name.split(".")] if name else parts)]
    if rule.name == AUTOGRAD:
        return bool(name and _is_under(name, ("torch.autograd", "torch.func"))) or \
            any(piece in _AUTOGRAD_PARTS for piece in [p.lower() for p in parts])
    if rule.name == RANDOM:
        return bool(name and _is_under(name, ("random", "numpy.random", "secrets"))) or \
            (bool(name) and name.startswith("torch.") or not name) and any(p in _RANDOM_PARTS for p in parts)
    if rule.name.startswith("torch."):
        stems = _STEMS.get(rule.name.rsplit(".", 1)[1], (rule.name.rsplit(".", 1)[1],))
        return any(stem in piece for piece in pieces for stem in stems)
    if not name:
        return False
    module, _, function = rule.name.rpartition(".")
    if any(name == spelled or name.startswith(spelled + ".") for spelled in (rule.name, f"{module}._{function}")):
        return True                                  # the function, or a class's method
    found = resolve_name(name) if name.startswith("attn_course") else None
    return found is not None and found is resolved


def _references(code: Sequence[ast.AST], aliases: dict[str, str]) -> Iterable[tuple[str | None, list[str], str]]:
    """Every name, attribute chain, import and call in ``code``: ``(dotted or None, attributes, as written)``."""
    for node in code:
        for inner in ast.walk(node):
            if isinstance(inner, (ast.Import, ast.ImportFrom)):
                for alias in inner.names:
                    module = inner.module if isinstance(inner, ast.ImportFrom) else None
                    full = f"{module}.{alias.name}" if module else alias.name
                    yield full, full.split("."), full
            elif isinstance(inner, ast.Attribute) and not isinstance(getattr(inner, "parent", None), ast.Attribute):
                name, parts = _dotted(inner, aliases)
                yield name, parts, ast.unparse(inner)
            elif isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Load):
                name = aliases.get(inner.id)
                if name:
                    yield name, name.split("."), inner.id
                elif inner.id in _ESCAPE_CALLS and hasattr(builtins, inner.id):
                    yield f"builtins.{inner.id}", [inner.id], inner.id
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "getattr":
                if len(inner.args) >= 2 and isinstance(inner.args[1], ast.Constant) and \
                        isinstance(inner.args[1].value, str):       # getattr(torch, "softmax"): torch.softmax
                    name, parts = _dotted(inner.args[0], aliases)
                    attribute = inner.args[1].value
                    yield (f"{name}.{attribute}" if name else None), [*parts, attribute], ast.unparse(inner)
                else:
                    yield "builtins.getattr", ["getattr"], "getattr with a computed name"


def _free_names(node: ast.AST) -> set[str]:
    bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    bound |= {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def source_violations(cells: Sequence[str], answer: str, rules: Sequence[Forbidden],
                      modules: dict[str, str] | None = None) -> list[tuple[str, Forbidden]]:
    """``(what the code calls, the rule it breaks)`` for each forbidden reference in ``answer``'s code.

    Args:
        cells: the notebook's code cells, in order (a cell that does not parse is skipped).
        answer: the name the exercise asks for (a function or class the cells define).
        rules: the exercise's rules; :data:`ESCAPE` is always added.
        modules: ``{name: module name}`` of modules known to be bound where the answer runs though
            no cell imports them (a kernel's globals: a notebook's history may lack its imports).

    Returns:
        The violations found, in the order of the code; empty when ``answer`` is not defined.

    Example:
        >>> cells = ["import torch.nn.functional as F", "def stable_softmax(x):\\n    return F.softmin(-x, -1)"]
        >>> [(called, rule.name) for called, rule in
        ...  source_violations(cells, "stable_softmax", [Forbidden("torch.softmax", "write it from exp")])]
        [('F.softmin', 'torch.softmax')]
    """
    return list(_violations(tuple(cells), answer, tuple(rules), tuple(sorted((modules or {}).items()))))


@functools.lru_cache(maxsize=64)
def _violations(cells: tuple[str, ...], answer: str, rules: tuple[Forbidden, ...],
                modules: tuple[tuple[str, str], ...]) -> tuple:
    """:func:`source_violations`, remembered: a check calls an answer many times, on the same source."""
    statements: dict[str, list[ast.stmt]] = {}
    everything: list[ast.stmt] = []
    for tree in filter(None, map(_parse, cells)):
        for node in tree.body:
            everything.append(node)
            for name in _bound(node):
                statements[name] = [node]          # the last binding is the one in force, as when it runs
    if answer not in statements:
        return ()
    aliases = dict(modules) | _imports(node for node in everything if isinstance(node, (ast.Import, ast.ImportFrom)))
    # The answer and what it reads from the notebook, followed through functions, classes and globals.
    code, queue, seen_names = [], [answer], set()
    while queue:
        name = queue.pop()
        if name in seen_names:
            continue
        seen_names.add(name)
        for node in statements.get(name, []):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                code.append(node)
                queue.extend(_free_names(node))
    for node in code:
        for inner in ast.walk(node):
            for child in ast.iter_child_nodes(inner):
                child.parent = inner
    aliases |= _imports(code)
    rules = [*(rule for rule in rules if rule.name != CHECKS_CODE), ESCAPE]     # ESCAPE holds it
    resolved = {rule.name: resolve_name(rule.name) for rule in rules if rule.name.startswith("attn_course")}
    found = []
    for name, parts, written in _references(code, aliases):
        for rule in rules:
            if rule is ESCAPE:
                broken = bool(name and _is_under(name, _ESCAPE_MODULES)) or \
                    any(part in _ESCAPE_ATTRIBUTES for part in parts)
            else:
                broken = _matches(name, parts, rule, resolved.get(rule.name))
            if broken and (written, rule) not in found:
                found.append((written, rule))
    return tuple(found)


def definition_source(cells: Sequence[str], name: str) -> str | None:
    """The source of the last ``def name`` among ``cells`` (the one in force), or None when no cell defines it.

    Example:
        >>> print(definition_source(["def f(x):\\n    return x", "def f(x):\\n    return 2 * x"], "f"))
        def f(x):
            return 2 * x
    """
    found = None
    for cell in cells:
        tree = _parse(cell) if isinstance(cell, str) else None
        for node in (tree.body if tree else ()):
            if isinstance(node, ast.FunctionDef) and node.name == name:
                found = ast.unparse(node)
    return found
