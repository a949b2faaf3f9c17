"""Which mode Triton runs the course's kernels in: compiled for a GPU, or in Triton's interpreter.

Triton decides when a ``@triton.jit`` decorator runs whether the function is compiled for a GPU
or executed by its interpreter: it reads ``triton.knobs.runtime.interpret``, which defaults to
the environment variable ``TRITON_INTERPRET`` (Triton 3.6 to 3.9 alike). Triton's own library is
decorated the same way (``tl.zeros``, ``tl.sum``, ... are ``@triton.jit`` functions of
``triton.language.standard``, decorated when Triton is first imported), and some of its modules
read the setting again when they are imported later, at a kernel's first launch. So the mode is
one per process: chosen before Triton is imported, and kept.

Importing the course's package imports no Triton and changes no environment variable: nothing is
decided by an import. The choice is made by one explicit call, :func:`use_interpreter_without_gpu`:

* the package's launchers make it on first use (:func:`define_kernels`), so ``flash_attention``
  runs on a machine without a GPU with nothing set beforehand;
* a notebook that writes its own ``@triton.jit`` kernels (chapter 07) makes it in its first cell,
  before it imports Triton.

It imports Triton in the mode :func:`interpreter_wanted` says (``TRITON_INTERPRET`` when set,
else the interpreter exactly when there is no CUDA GPU), with ``TRITON_INTERPRET`` set for the
import alone, then keeps the mode in Triton's own setting (``triton.knobs.runtime.interpret``)
without writing it to ``os.environ``. :func:`is_interpreted` is the one probe of a kernel's mode.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

import torch

__all__ = ["define_kernels", "interpreter_wanted", "is_interpreted", "runnable", "triton_installed",
           "triton_stand_ins", "use_interpreter_without_gpu"]


def triton_installed() -> bool:
    """Whether Triton can be imported here, found without importing it (which would choose its mode).

    Triton ships wheels for Linux only: on macOS and Windows ``pip install`` leaves it out, and the
    course runs its kernels' algorithm in PyTorch instead (:mod:`~attn_course.flash.without_triton`).

    Example:
        >>> triton_installed() in (True, False)
        True
    """
    if "triton" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):      # a finder that refuses it, or a broken entry in sys.modules
        return False


def triton_stand_ins() -> tuple[types.SimpleNamespace, types.SimpleNamespace]:
    """Stand-ins for ``triton`` and ``triton.language`` where Triton is not installed: enough to write
    a kernel down (chapter 07's exercises, on macOS or Windows), not to run it.

    ``triton.jit`` returns the function as it is, and ``tl.constexpr`` marks a signature's
    compile-time arguments as Triton's does; nothing else is there.

    Example:
        >>> triton, tl = triton_stand_ins()
        >>> def kernel(X, N: tl.constexpr):
        ...     pass
        >>> triton.jit(kernel) is kernel
        True
    """
    def jit(fn=None, **options):
        return fn if fn is not None else (lambda fn: fn)    # as a decorator, with or without options

    return types.SimpleNamespace(jit=jit), types.SimpleNamespace(constexpr=type("constexpr", (), {}))


def interpreter_wanted() -> bool:
    """Whether this process should run Triton kernels in Triton's interpreter.

    ``TRITON_INTERPRET`` decides when it is set (``1``: the interpreter, ``0``: compiled for a
    GPU); otherwise the interpreter is wanted exactly when there is no CUDA GPU. Once
    :func:`use_interpreter_without_gpu` has chosen, its choice is the answer.

    Example:
        >>> interpreter_wanted() in (True, False)
        True
    """
    triton = sys.modules.get("triton")
    knobs = getattr(triton, "knobs", None)
    if knobs is not None and "interpret" in vars(knobs.runtime):     # chosen, and kept in Triton's setting
        return bool(knobs.runtime.interpret)
    setting = os.environ.get("TRITON_INTERPRET")
    if setting is not None:
        return setting.strip().lower() in ("1", "true", "on", "yes")
    return not torch.cuda.is_available()


def is_interpreted(kernel: object) -> bool:
    """Whether ``kernel`` (a ``@triton.jit`` function) runs in Triton's interpreter.

    Raises:
        TypeError: ``kernel`` is not a Triton kernel.
    """
    if "triton" in sys.modules:   # else no kernel exists yet (and the import would choose a mode)
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        if isinstance(kernel, InterpretedFunction):
            return True
        if isinstance(kernel, JITFunction):
            return False
    raise TypeError(f"is_interpreted: kernel must be a @triton.jit function, got {type(kernel).__name__}")


def _module_mode(module: types.ModuleType) -> bool | None:
    """Whether the kernels defined in ``module`` are interpreted (None: it defines none)."""
    for value in vars(module).values():
        try:
            return is_interpreted(value)
        except TypeError:
            continue
    return None


def _wrong_mode(interpret: bool) -> RuntimeError:
    if interpret:
        return RuntimeError(
            "Triton's interpreter is needed here (no CUDA GPU), but Triton was imported in GPU mode before "
            "attn_course.flash chose. Start Python with TRITON_INTERPRET=1, or call "
            "attn_course.flash.use_interpreter_without_gpu() before anything imports Triton.")
    return RuntimeError("compiled Triton kernels are needed, but Triton is in interpreter mode in this process "
                        "(TRITON_INTERPRET=1); run with TRITON_INTERPRET=0")


def use_interpreter_without_gpu() -> bool:
    """Choose Triton's mode for this process: the interpreter when there is no CUDA GPU.

    The one explicit call that decides (see the module's docstring): it imports Triton in the mode
    :func:`interpreter_wanted` says, with ``TRITON_INTERPRET`` set for the import only, and keeps
    that mode in ``triton.knobs.runtime.interpret``, so that every ``@triton.jit`` defined
    afterwards, a notebook's included, runs in it. ``os.environ`` is left as it was. Calling it
    again changes nothing. The package's launchers call it on first use; a notebook that defines
    its own kernels calls it before it imports Triton.

    Returns:
        Whether Triton's interpreter is this process's mode.

    Raises:
        RuntimeError: Triton was imported earlier in the other mode (the message says what to do).
        ImportError: Triton is not installed (it ships for Linux).

    Example:
        >>> before = dict(os.environ)
        >>> use_interpreter_without_gpu() == interpreter_wanted(), dict(os.environ) == before
        (True, True)
    """
    interpret = interpreter_wanted()
    if "triton" not in sys.modules:
        saved = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
        try:
            import triton
        finally:   # the variable was needed for the import alone
            if saved is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = saved
    import triton
    import triton.language.standard

    if _module_mode(triton.language.standard) not in (None, interpret):
        raise _wrong_mode(interpret)
    if "interpret" not in vars(triton.knobs.runtime):
        propagate = triton.knobs.propagate_env
        triton.knobs.propagate_env = False        # keep the choice in Triton's setting, not in os.environ
        try:
            triton.knobs.runtime.interpret = interpret
        finally:
            triton.knobs.propagate_env = propagate
    return interpret


def define_kernels(name: str) -> types.ModuleType:
    """The kernel module ``name`` (e.g. ``"attn_course.flash.kernels"``), imported after
    :func:`use_interpreter_without_gpu` has chosen the mode, so that its ``@triton.jit``
    functions are defined in it.

    Raises:
        ImportError: Triton is not installed, or there is no such module.
        RuntimeError: Triton, or the module, was imported earlier in the other mode.
    """
    try:
        interpret = use_interpreter_without_gpu()
    except ImportError as error:   # pragma: no cover - Triton ships for Linux only
        raise ImportError("the Triton kernels need Triton, which is installed on Linux (pip install triton); "
                          "tiled_attention needs only PyTorch") from error
    module = importlib.import_module(name)
    if _module_mode(module) not in (None, interpret):
        raise _wrong_mode(interpret)
    return module


def runnable(kernel: object) -> object:
    """``kernel`` as this process can launch it: re-defined in this process's mode when it was
    defined in the other (say, by a cell run before the mode was chosen), else ``kernel`` itself.

    Raises:
        TypeError: ``kernel`` is not a Triton kernel.
        RuntimeError: Triton was imported in the other mode.
    """
    is_interpreted(kernel)                      # a Triton kernel, or TypeError
    interpret = use_interpreter_without_gpu()
    if is_interpreted(kernel) == interpret:
        return kernel
    import triton

    return triton.jit(kernel.fn)
