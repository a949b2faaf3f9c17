"""Choose Triton's mode before anything imports Triton.

Triton decides, when it is imported, whether ``@triton.jit`` functions (its own
``tl.zeros``, ``tl.max``, ... included) are compiled for a GPU or executed by its
interpreter, from the environment variable ``TRITON_INTERPRET``. On a machine without a
CUDA GPU only the interpreter can run kernels, so :mod:`attn_course` sets
``TRITON_INTERPRET=1`` on import there, unless the variable is already set or Triton is
already imported. (Some libraries, e.g. ``transformers``, import Triton: import
``attn_course`` first, or start Python with ``TRITON_INTERPRET=1``.)
"""

import os
import sys

import torch


def prefer_interpreter_without_gpu() -> None:
    """Set ``TRITON_INTERPRET=1`` when there is no CUDA GPU and Triton is not yet imported."""
    if "triton" not in sys.modules and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


prefer_interpreter_without_gpu()
