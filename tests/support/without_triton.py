"""Python processes in which Triton cannot be imported, as on macOS and Windows (it ships for Linux only).

:func:`environment_without_triton` writes a ``sitecustomize.py`` that puts a finder first on
``sys.meta_path`` refusing ``triton`` and its submodules (``import triton`` raises
``ModuleNotFoundError``, as where it is not installed) and notes each refusal, with the module
that asked, in ``sitecustomize.REFUSED``; any Python process, a Jupyter kernel included, started with the environment
it returns has no Triton.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

from helpers import ROOT

REFUSE_TRITON = '''
import sys

REFUSED = []


class RefuseTriton:
    """No Triton in this process: its import fails as where it is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            frame = sys._getframe(1)
            while frame.f_code.co_filename.startswith("<frozen") or frame.f_code.co_filename == __file__:
                frame = frame.f_back
            REFUSED.append((name, frame.f_globals.get("__name__", "?")))      # and who asked
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, RefuseTriton())
'''


def environment_without_triton(folder: pathlib.Path) -> dict[str, str]:
    """This process's environment, with ``folder``'s ``sitecustomize.py`` refusing Triton first on
    ``PYTHONPATH`` and no ``TRITON_INTERPRET``."""
    (folder / "sitecustomize.py").write_text(REFUSE_TRITON)
    environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    environment["PYTHONPATH"] = os.pathsep.join([str(folder), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return environment


def run_without_triton(code: str, folder: pathlib.Path, timeout: float = 300) -> str:
    """Run ``code`` in a fresh Python process without Triton; its standard output and error, or AssertionError."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment_without_triton(folder),
                            capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout + result.stderr
