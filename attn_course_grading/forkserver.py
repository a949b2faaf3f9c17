"""The fork server every grading process starts from, with the course already imported.

A fresh Python would import torch, otter and the course for each submission (seconds), and a
fork of the grader itself, which runs threads, could copy a lock another thread holds: so each
grading process is forked from multiprocessing's fork server, started once, before any thread.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import signal
import threading

#: Modules each grading process starts with (each :class:`~.assignment.Assignment` adds its chapter's imports).
PRELOAD = {"torch", "nbformat", "IPython.core.inputtransformer2", "otter.test_files.exception_test",
           "attn_course_grading.assignment", "attn_course_grading.grader"}
_CONTEXT: list = []
_CONTEXT_LOCK = threading.Lock()


def context():
    """multiprocessing's ``forkserver`` context, set up (with :data:`PRELOAD`) on the first call."""
    with _CONTEXT_LOCK:
        if not _CONTEXT:
            forkserver = multiprocessing.get_context("forkserver")
            forkserver.set_forkserver_preload(sorted(PRELOAD))
            _CONTEXT.append(forkserver)
        return _CONTEXT[0]


def die_with_parent() -> None:
    """Be killed when the fork server (and so the grader) ends: no grading process, nor its sandbox, outlives it."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
