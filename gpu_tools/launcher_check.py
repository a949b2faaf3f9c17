"""Whether this machine can build Triton's kernel launchers: a C compiler and the Python headers.

Triton (3.6 as 3.9, ``triton/runtime/build.py``) compiles a small C module, the launcher, for each
kernel signature the first time it launches one: with ``$CC`` if set, else ``gcc``, else ``clang``,
against ``Python.h`` from ``sysconfig.get_paths(scheme)["include"]`` (Debian's ``posix_local``
scheme read as ``posix_prefix``). An image without either fails every launch, after compiling the
kernel itself, with "Failed to find C compiler" or "Python.h: No such file or directory". Step 1 of
``tools/gpu_check.sh`` runs this check first so that its log says which is missing:

    python -m gpu_tools.launcher_check      one line; exit status 1 when something is missing

Standard library only: it runs on the GPU machine's bare Python.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

__all__ = ["launcher_toolchain", "main"]


def _python_include_dir() -> str:
    """Where Triton looks for ``Python.h`` (its ``_build``'s lookup)."""
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def launcher_toolchain(environ: dict | None = None) -> dict:
    """What Triton's launcher build would use here, and what is missing.

    Args:
        environ: the environment to read ``CC`` and ``PATH`` from (default ``os.environ``).

    Returns:
        ``{"compiler": path or None, "how": str, "include_dir": str, "python_h": bool,
        "missing": [str, ...], "test_compile": "ok" | error text | "not tried"}``; ``missing`` names
        each missing piece in words (empty: Triton can build its launchers).

    Raises:
        TypeError: ``environ`` not a dict or None.

    Example:
        >>> sorted(launcher_toolchain({"PATH": ""}))
        ['compiler', 'how', 'include_dir', 'missing', 'python_h', 'test_compile']
    """
    if environ is None:
        environ = dict(os.environ)
    if not isinstance(environ, dict):
        raise TypeError(f"launcher_toolchain: environ must be a dict or None, got {type(environ).__name__}")
    path = environ.get("PATH", "")
    missing = []
    if environ.get("CC"):
        compiler = shutil.which(environ["CC"], path=path)
        how = f"$CC={environ['CC']}"
        if compiler is None:
            missing.append(f"C compiler: $CC={environ['CC']} is not an executable")
    else:
        compiler = shutil.which("gcc", path=path) or shutil.which("clang", path=path)
        how = "no $CC: gcc, else clang, on PATH"
        if compiler is None:
            missing.append("C compiler: no $CC, and neither gcc nor clang on PATH (install gcc, or set CC)")
    include_dir = _python_include_dir()
    python_h = os.path.isfile(os.path.join(include_dir, "Python.h"))
    if not python_h:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        missing.append(f"Python headers: no Python.h in {include_dir} (install python{version}-dev)")
    test_compile = "not tried"
    if not missing:   # both there: do they work together? (a fraction of a second)
        with tempfile.TemporaryDirectory() as folder:
            source = os.path.join(folder, "launcher_check.c")
            with open(source, "w") as handle:
                handle.write("#include <Python.h>\nint main(void) { return Py_IsInitialized(); }\n")
            try:
                done = subprocess.run([compiler, "-fsyntax-only", f"-I{include_dir}", source],
                                      capture_output=True, text=True, timeout=30, env={**environ, "PATH": path})
                test_compile = "ok" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["failed"])[0]
            except (OSError, subprocess.TimeoutExpired) as error:
                test_compile = f"{type(error).__name__}: {error}"
            if test_compile != "ok":
                missing.append(f"a working pair: {compiler} -fsyntax-only on #include <Python.h> said: "
                               f"{test_compile[:300]}")
    return {"compiler": compiler, "how": how, "include_dir": include_dir, "python_h": python_h,
            "missing": missing, "test_compile": test_compile}


def main() -> int:
    found = launcher_toolchain()
    if found["missing"]:
        print("launcher toolchain MISSING (Triton builds a C launcher per kernel signature with a C compiler and "
              "Python.h; every kernel launch will fail): " + "; ".join(found["missing"]))
        return 1
    print(f"launcher toolchain: C compiler {found['compiler']} ({found['how']}), Python.h in "
          f"{found['include_dir']}, a test compile: {found['test_compile']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
